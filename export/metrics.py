"""DNS figures of what an exporter writes, for the Prometheus endpoint of a capture: transactions by RCODE, QTYPE
and transport (the transport column's name, as `inspect --summary` counts it: udp, tcp, dot, doh, ...; without
one, the IP protocol's, transport_names), and a histogram of response delays. Kept only when the endpoint is on
(capture.prometheus_port): the exporters call add_table (Parquet: the Arrow table written, counted by pyarrow),
add_records (C-DNS in the production pipeline: a TxBatch, counted from the Parquet columns the C column pass makes
of it) or add_transactions (C-DNS in the reference pipeline: the transaction tuples)."""

from collections import Counter

from probe.model import TRANSPORTS, E, M

# Upper bounds of the response-delay buckets, in seconds (Prometheus `le`); +Inf is implicit.
DELAY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_BOUNDS_US = tuple(round(b * 1e6) for b in DELAY_BUCKETS_S)
_BY_PROTOCOL = {17: "udp", 6: "tcp"}  # a record without a transport (files written before the column): its IP's


def transport_names(transport, prot):
    """The transport of each record (Arrow arrays of the Parquet columns transport and prot): its transport
    column, else its IP protocol's udp or tcp, else null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    by_prot = pc.if_else(pc.equal(prot, 17), _BY_PROTOCOL[17],
                         pc.if_else(pc.equal(prot, 6), _BY_PROTOCOL[6], pa.scalar(None, pa.string())))
    return pc.coalesce(transport.cast(pa.string()), by_prot)


class DnsMetrics:
    """Counts of one worker (or pipeline), summed by the supervisor: as_dict() travels with its snapshot."""

    def __init__(self):
        self.transactions = Counter()  # (rcode or None without a response, qtype, transport name) → transactions
        self.delay_le = [0] * len(_BOUNDS_US)  # matched transactions with a delay ≤ each bound (cumulative)
        self.delay_count = 0
        self.delay_sum_us = 0

    def add_table(self, table):
        """The rows of an Arrow table of the Parquet schema."""
        import pyarrow as pa
        import pyarrow.compute as pc

        keyed = pa.table({"rcode": table.column("rcode"), "qtype": table.column("qtype"),
                          "transport": transport_names(table.column("transport"), table.column("prot"))})
        counts = keyed.group_by(["rcode", "qtype", "transport"], use_threads=False).aggregate([([], "count_all")])
        for rcode, qtype, transport, n in zip(*(counts.column(c).to_pylist() for c in (
                "rcode", "qtype", "transport", "count_all"))):
            self.transactions[(rcode, qtype, transport)] += n
        delays = table.column("response_delay_us")
        n = pc.count(delays).as_py()
        if n:
            self.delay_count += n
            self.delay_sum_us += pc.sum(delays).as_py()
            for i, bound in enumerate(_BOUNDS_US):
                self.delay_le[i] += pc.sum(pc.less_equal(delays, bound)).as_py() or 0

    def add_records(self, txs):
        """A probe._records.TxBatch (transactions of message records)."""
        from export.parquet.rows import columns_from_records

        self.add_table(columns_from_records(txs, ["rcode", "qtype", "transport", "prot",
                                                          "response_delay_us"]))

    def add_transactions(self, txs):
        """Transaction tuples (query, response, response_messages)."""
        transactions, le = self.transactions, self.delay_le
        for q, r, _ in txs:
            m = q if q is not None else r
            rcode = None
            if r is not None:
                edns = r[M.EDNS]
                rcode = (r[M.FLAGS] & 0xF) | ((edns[E.EXT_RCODE] << 4) if edns else 0)
                if q is not None:
                    delay = (r[M.TS_NS] - q[M.TS_NS]) // 1000  # as the Parquet column response_delay_us
                    self.delay_count += 1
                    self.delay_sum_us += delay
                    for i, bound in enumerate(_BOUNDS_US):
                        if delay <= bound:
                            le[i] += 1
            code = m[M.TRANSPORT]
            transport = TRANSPORTS[code][0] if code in TRANSPORTS else _BY_PROTOCOL.get(m[M.PROTO])
            transactions[(rcode, m[M.QTYPE], transport)] += 1

    def as_dict(self):
        return {
            "transactions": [[*key, n] for key, n in self.transactions.items()],
            "delay_le": list(self.delay_le),
            "delay_count": self.delay_count,
            "delay_sum_us": self.delay_sum_us,
        }

    def add_dict(self, doc):
        """Add the figures of an as_dict() (another worker's, or an earlier process's)."""
        for *key, n in doc["transactions"]:
            self.transactions[tuple(key)] += n
        self.delay_le = [a + b for a, b in zip(self.delay_le, doc["delay_le"])]
        self.delay_count += doc["delay_count"]
        self.delay_sum_us += doc["delay_sum_us"]
