"""Transactions → Arrow tables of rows: DNS Probe's 55 columns, then dnsprobe's own.

The table below is the schema (name, Arrow type, meaning). Columns are built for a whole batch at
once: transactions are transposed with zip(*rows) and derived columns are computed with Arrow
compute kernels, so no Python work is done per cell except address formatting (cached).

Row semantics: identity columns (id, qname, addresses, ports, qtype, ...) come from the query, or from
the response when there is no query. Query columns are null in a response-only row and response
columns are null in a query-only row, so `dns_len > 0` means "has a query" and `dns_res_len > 0`
"has a response". Client = sender of the query (receiver of the response).
"""

import pyarrow as pa

from export.parquet.answers import answers_column
from export.parquet.columns import extract_python
from export.parquet.schema import ANSWERS, BOOL, I32, SCHEMA, STR, TS_US
from probe.model import (
    FLAG_AA,
    FLAG_AD,
    FLAG_CD,
    FLAG_RA,
    FLAG_RD,
    FLAG_TC,
    FLAG_Z,
    TRANSPORTS,
    E,
    M,
)
from probe.native import load

Q, R = 0, 1  # a transaction is (query tuple or None, response tuple or None, response message count)

# Every value the columns are made of, read from the transactions in one pass (export.parquet.columns): name ->
# (path into the transaction, kind[, fill]). A None on the path is a null (the side is missing), except
# that for the OPT record's fields a present side without OPT gets `fill`, the value DNS Probe writes.
_FIELDS = {
    "q_ts": ((Q, M.TS_NS), "q"),
    "r_ts": ((R, M.TS_NS), "q"),
    "id": (((Q, M.ID), (R, M.ID)), "i"),
    "qname": (((Q, M.QNAME), (R, M.QNAME)), "s"),
    "domain_name": (((Q, M.QNAME), (R, M.QNAME)), "D"),
    "q_wirelen": ((Q, M.WIRELEN), "i"),
    "r_wirelen": ((R, M.WIRELEN), "i"),
    "q_ttl": ((Q, M.TTL), "i"),
    "ipv": (((Q, M.IPV), (R, M.IPV)), "i"),
    "proto": (((Q, M.PROTO), (R, M.PROTO)), "i"),
    "client_port": (((Q, M.SPORT), (R, M.DPORT)), "i"),
    "server_port": (((Q, M.DPORT), (R, M.SPORT)), "i"),
    "server": (((Q, M.DST), (R, M.SRC)), "a"),
    "q_udp_sum": ((Q, M.UDP_SUM), "i"),
    "q_dns_len": ((Q, M.DNS_LEN), "i"),
    "r_dns_len": ((R, M.DNS_LEN), "i"),
    "q_flags": ((Q, M.FLAGS), "i"),
    "r_flags": ((R, M.FLAGS), "i"),
    "r_ancount": ((R, M.ANCOUNT), "i"),
    "r_arcount": ((R, M.ARCOUNT), "i"),
    "r_nscount": ((R, M.NSCOUNT), "i"),
    "q_qdcount": ((Q, M.QDCOUNT), "i"),
    "qtype": (((Q, M.QTYPE), (R, M.QTYPE)), "i"),
    "qclass": (((Q, M.QCLASS), (R, M.QCLASS)), "i"),
    "labels": (((Q, M.LABELS), (R, M.LABELS)), "i"),
    "rtt": (((Q, M.TCP_RTT_MS), (R, M.TCP_RTT_MS)), "d"),
    "vlan": (((Q, M.VLAN), (R, M.VLAN)), "i"),
    "malformed": (((Q, M.MALFORMED), (R, M.MALFORMED)), "b"),
    "messages": ((2,), "i"),
    "q_edns_udp": ((Q, M.EDNS, E.UDP_SIZE), "i", 0),
    "q_edns_version": ((Q, M.EDNS, E.VERSION), "i", 0),
    "q_edns_do": ((Q, M.EDNS, E.DO), "b", False),
    "q_dau": ((Q, M.EDNS, E.DAU), "s", ""),
    "q_dhu": ((Q, M.EDNS, E.DHU), "s", ""),
    "q_n3u": ((Q, M.EDNS, E.N3U), "s", ""),
    "q_ecs": ((Q, M.EDNS, E.CLIENT_SUBNET), "s", ""),
    "q_other": ((Q, M.EDNS, E.OTHER), "s", ""),
    "r_nsid": ((R, M.EDNS, E.NSID), "s", ""),
    "r_ext_rcode": ((R, M.EDNS, E.EXT_RCODE), "i", 0),
    "r_ede": ((R, M.EDNS, E.EDE), "L", ()),
    "r_edns_udp": ((R, M.EDNS, E.UDP_SIZE), "i", 0),
    "transport": (((Q, M.TRANSPORT), (R, M.TRANSPORT)), "i"),
    "dnstap_type": (((Q, M.ORIGIN, 0), (R, M.ORIGIN, 0)), "s"),
    "server_identity": (((Q, M.ORIGIN, 1), (R, M.ORIGIN, 1)), "s"),
}
# The transport column's text by transport code (probe.model TRANSPORTS; a code outside it is an error).
_TRANSPORT_NAMES = pa.array([TRANSPORTS[c][0] if c in TRANSPORTS else None for c in range(max(TRANSPORTS) + 1)], STR)
_CLIENT = {"client": (((Q, M.SRC), (R, M.DST)), "a")}
_RESPONSE_RAW = {"r_raw": ((R, M.RAW), "y")}


_parquetrec = load("export.parquet._parquetrec")


def is_late(tx):
    """Whether a transaction's row comes late: a query without response, not malformed, exported once it has
    waited match.query_timeout (export.time_order writes these rows in row groups of their own)."""
    q, r, _ = tx
    return q is not None and r is None and not q[M.MALFORMED]


def _bit(flags, mask):
    import pyarrow.compute as pc

    return pc.not_equal(pc.bit_wise_and(flags, pa.scalar(mask, I32)), pa.scalar(0, I32))


class RowBuilder:
    """Builds Arrow tables from transaction triples (query, response, response_messages), with the addresses as
    they were captured: enrichment looks them up, then client privacy (export.parquet.privacy) transforms them."""

    def __init__(self, answers=False, stats=None):
        """answers: fill the answers column from the responses' bytes (export.answers; the decoder keeps them);
        stats: the probe.stats.Stats its answers_capped counter goes to (None: not counted)."""
        self._answers = answers
        self._stats = stats
        self._specs = dict(_FIELDS, **_CLIENT, **(_RESPONSE_RAW if answers else {}))

    def build_from_records(self, txs, apart=False):
        """The Arrow tables of a probe._records.TxBatch (transactions of message records), the production path: one
        C pass over the records writes every column (export/parquet/_parquetrec.c) but the answers, made here from
        the responses' bytes (which the pass gives as the r_raw column), and hands them to Arrow in one call (the
        Arrow C data interface). apart: [the rows on time, the late ones (is_late)] (export.time_order), made in
        the one pass; else [every row]. build() and build_apart() are its reference."""
        batches = _import(txs, _C_NAMES_RAW if self._answers else _C_NAMES, _MADE_RAW if self._answers else _MADE,
                          apart)
        return [self._with_answers(batch) for batch in batches]

    def _with_answers(self, batch):
        """The table of a batch of the columns the pass made, with the answers column: made of r_raw (the last
        column, then dropped), else null."""
        table = pa.Table.from_batches([batch])
        if not self._answers:
            return table.append_column(_ANSWERS_FIELD, pa.nulls(batch.num_rows, ANSWERS))
        answers = self._answers_column(batch.column(_R_RAW_AT))
        return table.remove_column(_R_RAW_AT).append_column(_ANSWERS_FIELD, answers)

    def build(self, txs):
        """The Arrow table of a list of (query, response, response_messages) tuples: the Python reference (the
        reference pipeline, the C-DNS reader)."""
        specs = self._specs
        f = dict(zip(specs, extract_python(txs, list(specs.values()))))
        n = len(txs)
        return pa.Table.from_arrays(_dns_probe_columns(f, n) + self._own_columns(f, n), schema=SCHEMA)

    def build_apart(self, txs):
        """[the rows on time, the late ones (is_late)] of transaction tuples: the reference of
        build_from_records(txs, apart=True)."""
        return [self.build([tx for tx in txs if is_late(tx) == late]) for late in (False, True)]

    def _own_columns(self, f, n):
        """dnsprobe's columns, after DNS Probe's, from the values read (f: name → array)."""
        import pyarrow.compute as pc

        q_present = f["q_ts"].is_valid()
        r_present = f["r_ts"].is_valid()
        qts, rts = f["q_ts"], f["r_ts"]
        return [
            pc.divide(pc.coalesce(qts, rts), 1000).cast(TS_US),
            q_present,
            r_present,
            pc.divide(pc.subtract(rts, qts), 1000),
            pc.divide(qts, 1000).cast(TS_US),
            pc.divide(rts, 1000).cast(TS_US),
            f["vlan"],
            f["r_ede"],
            f["malformed"],
            pc.if_else(r_present, f["messages"], pa.scalar(None, I32)),
            f["r_edns_udp"],
            pa.DictionaryArray.from_arrays(f["transport"], _TRANSPORT_NAMES).cast(STR),
            f["dnstap_type"],
            f["server_identity"],
            # filled by the enrichment steps (export.enrich) when configured
            pa.nulls(n, STR),
            pa.nulls(n, STR),
            pa.nulls(n, STR),
            self._answers_column(f["r_raw"]) if self._answers else pa.nulls(n, ANSWERS),
        ]

    def _answers_column(self, raw):
        column, capped = answers_column(raw)
        if self._stats is not None:
            self._stats.answers_capped += capped
        return column


def _dns_probe_columns(f, n):
    """DNS Probe's 55 columns, from the values read (f: name → array)."""
    import pyarrow.compute as pc

    qts, rts = f["q_ts"], f["r_ts"]
    ts = pc.coalesce(qts, rts)
    time_us = pc.divide(ts, 1000)
    unixtime = pc.divide(ts, 1_000_000_000)
    qflags, rflags = f["q_flags"], f["r_flags"]
    qname = f["qname"]
    rcode = pc.bit_wise_or(
        pc.bit_wise_and(rflags, pa.scalar(0x0F, I32)),
        pc.shift_left(f["r_ext_rcode"], pa.scalar(4, I32)),
    )
    opcode = pc.bit_wise_and(pc.shift_right(pc.coalesce(qflags, rflags), pa.scalar(11, I32)), pa.scalar(0x0F, I32))
    zero_i32 = pa.nulls(n, I32).fill_null(0)
    empty = pa.nulls(n, STR).fill_null("")
    false = pa.nulls(n, BOOL).fill_null(False)

    return [
        f["id"],
        unixtime,
        time_us,
        qname,
        f["domain_name"],
        f["q_wirelen"],
        zero_i32,
        f["q_ttl"],
        f["ipv"],
        f["proto"],
        f["client"],
        f["client_port"],
        f["server"],
        f["server_port"],
        f["q_udp_sum"],
        f["q_dns_len"],
        _bit(rflags, FLAG_AA),
        _bit(rflags, FLAG_TC),
        _bit(qflags, FLAG_RD),
        _bit(qflags, FLAG_RA),
        _bit(qflags, FLAG_Z),
        _bit(qflags, FLAG_AD),
        _bit(qflags, FLAG_CD),
        f["r_ancount"],
        f["r_arcount"],
        f["r_nscount"],
        f["q_qdcount"],
        opcode,
        rcode,
        f["qtype"],
        f["qclass"],
        empty,
        empty,
        f["q_edns_udp"],
        f["q_edns_version"],
        f["q_edns_do"],
        false,
        f["r_nsid"],
        f["q_dau"],
        f["q_dhu"],
        f["q_n3u"],
        f["q_ecs"],
        f["q_other"],
        empty,
        empty,
        f["labels"],
        f["r_wirelen"],
        pc.subtract(time_us, pc.multiply(unixtime, 1_000_000)),
        zero_i32,
        zero_i32,
        false,
        false,
        f["r_dns_len"],
        empty,
        f["rtt"],
    ]


# The columns the C pass writes: all but the answers (the schema's last: appended to them), in schema order, then
# r_raw when the answers are made; pyarrow imports them with these schemas.
_ANSWERS_FIELD = SCHEMA.field("answers")
_C_NAMES = [name for name in SCHEMA.names if name != "answers"]
_C_NAMES_RAW = _C_NAMES + ["r_raw"]
_MADE = pa.schema([SCHEMA.field(name) for name in _C_NAMES])
_MADE_RAW = _MADE.append(pa.field("r_raw", pa.binary()))
_R_RAW_AT = len(_C_NAMES)


def columns_from_records(txs, names):
    """The columns `names` of the schema, made by the C column pass from a probe._records.TxBatch, as a table."""
    (batch,) = _import(txs, names, pa.schema([SCHEMA.field(name) for name in names]), False)
    return pa.Table.from_batches([batch])


def _import(txs, names, schema, apart):
    """The record batches of the C column pass (its columns `names`, of `schema`), imported through the Arrow C
    data interface without a copy: one, or apart two (the rows on time, the late ones)."""
    return [pa.RecordBatch._import_from_c(address, schema)
            for _capsule, address in _parquetrec.parquet_arrays(txs, names, apart)]
