"""Transactions → Arrow record batches: DNS Probe's 55 columns, then dnsprobe's own.

The table below is the schema (name, Arrow type, meaning). Columns are built for a whole batch at
once: transactions are transposed with zip(*rows) and derived columns are computed with Arrow
compute kernels, so no Python work is done per cell except address formatting (cached).

Row semantics: identity columns (id, qname, addresses, ports, qtype, ...) come from the query, or from
the response when there is no query. Query columns are null in a response-only row and response
columns are null in a query-only row, so `dns_len > 0` means "has a query" and `dns_res_len > 0`
"has a response". Client = sender of the query (receiver of the response).
"""

import socket

import pyarrow as pa
import pyarrow.compute as pc

from probe.decode.fields import (
    EDNS_FIELDS,
    FLAG_AA,
    FLAG_AD,
    FLAG_CD,
    FLAG_RA,
    FLAG_RD,
    FLAG_TC,
    FLAG_Z,
    MESSAGE_FIELDS,
    E,
    M,
)

I32 = pa.int32()
I64 = pa.int64()
STR = pa.string()
BOOL = pa.bool_()
TS_NS = pa.timestamp("ns", tz="UTC")

# DNS Probe 1.6's ExportedDataSchema, in order (see ../shared/reference/dnsprobe-parquet-schema.md).
DNSPROBE_COLUMNS = (
    ("id", I32, "DNS ID"),
    ("unixtime", I64, "capture time of the transaction (query, else response), seconds"),
    ("time", I64, "the same instant in microseconds"),
    ("qname", STR, "QNAME, labels joined by '.', original case, no trailing dot"),
    ("domainname", STR, "last two labels of QNAME, lower-cased"),
    ("len", I32, "query frame length (TCP: summed over the frames carrying the message)"),
    ("frag", I32, "always 0, as DNS Probe"),
    ("ttl", I32, "query IPv4 TTL / IPv6 hop limit"),
    ("ipv", I32, "4 or 6"),
    ("prot", I32, "17 UDP, 6 TCP"),
    ("src", STR, "client address"),
    ("srcp", I32, "client port"),
    ("dst", STR, "server address"),
    ("dstp", I32, "server port"),
    ("udp_sum", I32, "query UDP checksum (0 for TCP)"),
    ("dns_len", I32, "query DNS message length"),
    ("aa", BOOL, "response AA"),
    ("tc", BOOL, "response TC"),
    ("rd", BOOL, "query RD"),
    ("ra", BOOL, "query RA"),
    ("z", BOOL, "query Z"),
    ("ad", BOOL, "query AD"),
    ("cd", BOOL, "query CD"),
    ("ancount", I32, "response ANCOUNT (zone transfers: summed)"),
    ("arcount", I32, "response ARCOUNT"),
    ("nscount", I32, "response NSCOUNT"),
    ("qdcount", I32, "query QDCOUNT"),
    ("opcode", I32, "OPCODE"),
    ("rcode", I32, "response RCODE including the extended bits of its OPT"),
    ("qtype", I32, "QTYPE"),
    ("qclass", I32, "QCLASS"),
    ("country", STR, "client country (GeoIP not configured: empty)"),
    ("asn", STR, "client AS number (GeoIP not configured: empty)"),
    ("edns_udp", I32, "query EDNS UDP payload size, 0 without OPT"),
    ("edns_version", I32, "query EDNS version"),
    ("edns_do", BOOL, "query DO bit"),
    ("edns_ping", BOOL, "always false, as DNS Probe"),
    ("edns_nsid", STR, "NSID from the response OPT"),
    ("edns_dnssec_dau", STR, "query DAU algorithms, comma-separated"),
    ("edns_dnssec_dhu", STR, "query DHU algorithms"),
    ("edns_dnssec_n3u", STR, "query N3U algorithms"),
    ("edns_client_subnet", STR, "query EDNS client subnet as address/source-prefix"),
    ("edns_other", STR, "codes of other query options with a payload, comma-separated"),
    ("edns_client_subnet_asn", STR, "empty, as DNS Probe"),
    ("edns_client_subnet_country", STR, "empty, as DNS Probe"),
    ("labels", I32, "number of QNAME labels"),
    ("res_len", I32, "response frame length (TCP, zone transfers: summed)"),
    ("time_micro", I64, "microsecond part of time"),
    ("resp_frag", I32, "always 0, as DNS Probe"),
    ("proc_time", I32, "always 0, as DNS Probe"),
    ("is_google", BOOL, "always false, as DNS Probe"),
    ("is_opendns", BOOL, "always false, as DNS Probe"),
    ("dns_res_len", I32, "response DNS message length (zone transfers: summed)"),
    ("server_location", STR, "always empty, as DNS Probe"),
    ("tcp_hs_rtt", pa.float64(), "TCP handshake round trip (SYN to the client's ACK) in ms; null for UDP"),
)

DNSPROBE_EXTRA_COLUMNS = (
    ("query_present", BOOL, "the transaction has a query"),
    ("response_present", BOOL, "the transaction has a response"),
    ("response_delay_us", I64, "response capture time minus query capture time, microseconds"),
    ("query_time", TS_NS, "query capture timestamp (ns, UTC)"),
    ("response_time", TS_NS, "response capture timestamp (ns, UTC)"),
    ("vlan", I32, "outermost VLAN id, null when untagged"),
    ("edns_ede", pa.list_(I32), "extended DNS error info-codes from the response (RFC 8914)"),
    ("malformed", BOOL, "the message could not be parsed to its end (exported unmatched)"),
    ("response_messages", I32, "response messages in the transaction (>1 for zone transfers)"),
    ("res_edns_udp", I32, "response EDNS UDP payload size, 0 without OPT"),
)

COLUMNS = DNSPROBE_COLUMNS + DNSPROBE_EXTRA_COLUMNS
SCHEMA = pa.schema([pa.field(name, typ) for name, typ, _ in COLUMNS])

_NM = len(MESSAGE_FIELDS)
_NONE_MSG = (None,) * _NM
_NONE_EDNS = (None,) * len(EDNS_FIELDS)
_ABSENT_EDNS = (0, 0, False, 0, "", "", "", "", "", "", (), False, b"")
_DOMAIN_RE = r"^.*\.([^.]*\.[^.]*)$"


def _bit(flags, mask):
    return pc.not_equal(pc.bit_wise_and(flags, pa.scalar(mask, I32)), pa.scalar(0, I32))


class RecordBuilder:
    """Builds Arrow tables from transaction triples (query, response, response_messages)."""

    def __init__(self, max_cache=200_000, client=None):
        """client: a probe.privacy.ClientPrivacy applied to client addresses (and EDNS client subnets), or
        None. Server addresses are written as they are. Each cache maps an address to its written text."""
        self._addr_text = {}
        self._max_cache = max_cache
        self._client = client
        self._client_text = {} if client else self._addr_text
        self._subnet_text = {}

    def _addresses(self, first, second, client=False):
        """Text form of `first`, or of `second` where `first` is None (cached: addresses repeat).
        client: the addresses are clients', transformed by the ClientPrivacy before formatting."""
        cache = self._client_text if client else self._addr_text
        transform = self._client.address if client and self._client else None
        if len(cache) > self._max_cache:
            cache.clear()
        out = []
        append = out.append
        for a, b in zip(first, second):
            if a is None:
                a = b
            t = cache.get(a)
            if t is None:
                if a is None:
                    append(None)
                    continue
                packed = transform(a) if transform else a
                t = cache[a] = socket.inet_ntop(socket.AF_INET if len(a) == 4 else socket.AF_INET6, packed)
            append(t)
        return out

    def _subnets(self, texts):
        """EDNS client subnets, transformed like client addresses when a ClientPrivacy is set (cached)."""
        if self._client is None:
            return texts
        cache = self._subnet_text
        if len(cache) > self._max_cache:
            cache.clear()
        subnet = self._client.subnet
        out = []
        for t in texts:
            s = cache.get(t)
            if s is None:
                s = cache[t] = subnet(t) if t else t
            out.append(s)
        return out

    def build(self, txs):
        n = len(txs)
        q = list(zip(*[t[0] or _NONE_MSG for t in txs])) if n else [()] * _NM
        r = list(zip(*[t[1] or _NONE_MSG for t in txs])) if n else [()] * _NM

        def col(side, idx, typ=I32):
            return pa.array(side[idx], typ)

        def both(idx, typ=I32):
            return pc.coalesce(col(q, idx, typ), col(r, idx, typ))

        q_present = pc.is_valid(col(q, M.TS_NS, I64))
        r_present = pc.is_valid(col(r, M.TS_NS, I64))
        qts = col(q, M.TS_NS, I64)
        rts = col(r, M.TS_NS, I64)
        ts = pc.coalesce(qts, rts)
        time_us = pc.divide(ts, 1000)
        unixtime = pc.divide(ts, 1_000_000_000)
        qflags = col(q, M.FLAGS)
        rflags = col(r, M.FLAGS)
        qname = both(M.QNAME, STR)

        qe = list(zip(*[
            _NONE_EDNS if t is None else (e or _ABSENT_EDNS) for t, e in zip(q[M.TS_NS], q[M.EDNS])
        ])) if n else [()] * len(EDNS_FIELDS)
        re_ = list(zip(*[
            _NONE_EDNS if t is None else (e or _ABSENT_EDNS) for t, e in zip(r[M.TS_NS], r[M.EDNS])
        ])) if n else [()] * len(EDNS_FIELDS)

        rcode = pc.bit_wise_or(
            pc.bit_wise_and(rflags, pa.scalar(0x0F, I32)),
            pc.shift_left(pa.array(re_[E.EXT_RCODE], I32), pa.scalar(4, I32)),
        )
        opcode = pc.bit_wise_and(pc.shift_right(pc.coalesce(qflags, rflags), pa.scalar(11, I32)), pa.scalar(0x0F, I32))
        client = self._addresses(q[M.SRC], r[M.DST], client=True)
        server = self._addresses(q[M.DST], r[M.SRC])
        zero_i32 = pa.array([0] * n, I32)
        empty = pa.array([""] * n, STR)
        false = pa.array([False] * n, BOOL)
        delay = pc.divide(pc.subtract(rts, qts), 1000)

        columns = [
            both(M.ID),
            unixtime,
            time_us,
            qname,
            pc.replace_substring_regex(pc.ascii_lower(qname), pattern=_DOMAIN_RE, replacement=r"\1"),
            col(q, M.WIRELEN),
            zero_i32,
            col(q, M.TTL),
            both(M.IPV),
            both(M.PROTO),
            pa.array(client, STR),
            pc.coalesce(col(q, M.SPORT), col(r, M.DPORT)),
            pa.array(server, STR),
            pc.coalesce(col(q, M.DPORT), col(r, M.SPORT)),
            col(q, M.UDP_SUM),
            col(q, M.DNS_LEN),
            _bit(rflags, FLAG_AA),
            _bit(rflags, FLAG_TC),
            _bit(qflags, FLAG_RD),
            _bit(qflags, FLAG_RA),
            _bit(qflags, FLAG_Z),
            _bit(qflags, FLAG_AD),
            _bit(qflags, FLAG_CD),
            col(r, M.ANCOUNT),
            col(r, M.ARCOUNT),
            col(r, M.NSCOUNT),
            col(q, M.QDCOUNT),
            opcode,
            rcode,
            both(M.QTYPE),
            both(M.QCLASS),
            empty,
            empty,
            pa.array(qe[E.UDP_SIZE], I32),
            pa.array(qe[E.VERSION], I32),
            pa.array(qe[E.DO], BOOL),
            false,
            pa.array(re_[E.NSID], STR),
            pa.array(qe[E.DAU], STR),
            pa.array(qe[E.DHU], STR),
            pa.array(qe[E.N3U], STR),
            pa.array(self._subnets(qe[E.CLIENT_SUBNET]), STR),
            pa.array(qe[E.OTHER], STR),
            empty,
            empty,
            both(M.LABELS),
            col(r, M.WIRELEN),
            pc.subtract(time_us, pc.multiply(unixtime, 1_000_000)),
            zero_i32,
            zero_i32,
            false,
            false,
            col(r, M.DNS_LEN),
            empty,
            pc.coalesce(col(q, M.TCP_RTT_MS, pa.float64()), col(r, M.TCP_RTT_MS, pa.float64())),
            # dnsprobe's own columns
            q_present,
            r_present,
            delay,
            qts.cast(TS_NS),
            rts.cast(TS_NS),
            both(M.VLAN),
            pa.array(re_[E.EDE], pa.list_(I32)),
            pc.coalesce(col(q, M.MALFORMED, BOOL), col(r, M.MALFORMED, BOOL)),
            pa.array([t[2] if t[1] is not None else None for t in txs], I32),
            pa.array(re_[E.UDP_SIZE], I32),
        ]
        return pa.Table.from_arrays(columns, schema=SCHEMA)
