"""Matching stage: pairs queries with responses into transactions.

Key: transport, client address and port, server address and port, DNS ID; the question (QTYPE and
case-folded QNAME) is compared within the key, so a response with no question section (some error
responses) still matches the oldest pending query with its ID. Timeouts run on capture time.
A transaction is a pair (query tuple or None, response tuple or None); malformed messages are exported
alone, unmatched (as compactor does: a malformed message cannot be trusted to match).

Zone transfers (AXFR/IXFR): the first response opens the transaction; later responses on the same
connection with the same ID add their ANCOUNT and lengths, until a message whose last answer is an SOA
(or an error RCODE) closes it, as DNS Probe does.
"""

from collections import deque

from probe.decode.fields import FLAG_QR, M

QTYPE_IXFR = 251
QTYPE_AXFR = 252
TYPE_SOA = 6

_ID, _FLAGS, _QNAME, _QTYPE = M.ID, M.FLAGS, M.QNAME, M.QTYPE
_TS, _MALFORMED, _PROTO = M.TS_NS, M.MALFORMED, M.PROTO
_SRC, _SPORT, _DST, _DPORT = M.SRC, M.SPORT, M.DST, M.DPORT


class _Transfer:
    __slots__ = ("query", "first", "ancount", "wirelen", "dns_len", "messages", "last_ts")

    def __init__(self, query, response):
        self.query = query
        self.first = response
        self.ancount = response[M.ANCOUNT] or 0
        self.wirelen = response[M.WIRELEN]
        self.dns_len = response[M.DNS_LEN]
        self.messages = 1
        self.last_ts = response[_TS]

    def add(self, response):
        self.ancount += response[M.ANCOUNT] or 0
        self.wirelen += response[M.WIRELEN]
        self.dns_len += response[M.DNS_LEN]
        self.messages += 1
        self.last_ts = response[_TS]

    def merged(self):
        """The first response with the summed counts (DNS Probe's merge_AXFR_record)."""
        r = list(self.first)
        r[M.ANCOUNT] = self.ancount
        r[M.WIRELEN] = self.wirelen
        r[M.DNS_LEN] = self.dns_len
        return (self.query, tuple(r), self.messages)


def _closes_transfer(response):
    flags = response[_FLAGS]
    return (flags & 0x000F) != 0 or response[M.LAST_AN_TYPE] == TYPE_SOA


class TransactionTable:
    """Pending queries and open zone transfers, with capture-time expiry.

    add() takes a list of message tuples in capture order and returns the transactions completed
    by them, as (query, response, response_messages) triples, in completion order.
    """

    def __init__(self, match_cfg, stats):
        self.timeout_ns = int(match_cfg.query_timeout * 1e9)
        self.max_pending = match_cfg.max_pending
        self.stats = stats
        self.pending = {}  # key -> list of query tuples (usually one)
        self.order = deque()  # (ts, key, query) in arrival order, for expiry
        self.transfers = {}  # key -> _Transfer
        self.now_ns = 0

    def add(self, msgs):
        out = []
        pending = self.pending
        order = self.order
        stats = self.stats
        matched = response_only = dup = 0
        for m in msgs:
            flags = m[_FLAGS]
            if m[_MALFORMED]:
                # Exported alone: on the query side unless the header says response.
                out.append((None, m, 1) if flags is not None and flags & FLAG_QR else (m, None, 1))
                continue
            if flags & FLAG_QR:
                key = (m[_PROTO], m[_DST], m[_DPORT], m[_SRC], m[_SPORT], m[_ID])
                queries = pending.get(key)
                if queries is not None:
                    # Queries older than the timeout (capture time) no longer match, even when their
                    # expiry has not run yet (it runs once per batch); _expire exports them below.
                    q = _take(queries, m, m[_TS] - self.timeout_ns)
                    if q is not None:
                        if not queries:
                            del pending[key]
                        if q[_QTYPE] == QTYPE_AXFR or q[_QTYPE] == QTYPE_IXFR:
                            if not _closes_transfer(m):
                                self.transfers[key] = _Transfer(q, m)
                                continue
                        matched += 1
                        out.append((q, m, 1))
                        continue
                if self.transfers:
                    xfr = self.transfers.get(key)
                    if xfr is not None:
                        xfr.add(m)
                        stats.zone_transfer_messages += 1
                        if _closes_transfer(m):
                            del self.transfers[key]
                            matched += 1
                            out.append(xfr.merged())
                        continue
                response_only += 1
                out.append((None, m, 1))
            else:
                key = (m[_PROTO], m[_SRC], m[_SPORT], m[_DST], m[_DPORT], m[_ID])
                queries = pending.get(key)
                if queries is None:
                    pending[key] = [m]
                else:
                    dup += 1
                    queries.append(m)
                order.append((m[_TS], key, m))
        if msgs:
            last = msgs[-1][_TS]
            if last > self.now_ns:
                self.now_ns = last
        stats.matched += matched
        stats.response_only += response_only
        stats.duplicate_queries += dup
        self._expire(out)
        return out

    def _expire(self, out):
        cutoff = self.now_ns - self.timeout_ns
        order = self.order
        pending = self.pending
        query_only = 0
        while order and (order[0][0] < cutoff or len(order) > self.max_pending):
            ts, key, q = order.popleft()
            queries = pending.get(key)
            if queries is None:
                continue
            for i, x in enumerate(queries):
                if x is q:
                    del queries[i]
                    if not queries:
                        del pending[key]
                    query_only += 1
                    out.append((q, None, 1))
                    if ts >= cutoff:
                        self.stats.match_evicted += 1
                    break
        self.stats.query_only += query_only
        if self.transfers:
            for key in [k for k, x in self.transfers.items() if x.last_ts < cutoff]:
                self.stats.matched += 1
                out.append(self.transfers.pop(key).merged())

    def flush(self):
        """End of input: everything pending is exported (queries as query-only)."""
        out = []
        for xfr in list(self.transfers.values()):
            self.stats.matched += 1
            out.append(xfr.merged())
        self.transfers.clear()
        query_only = 0
        for _, _, q in self.order:
            queries = self.pending.get(_key_of_query(q))
            if queries and any(x is q for x in queries):
                query_only += 1
                out.append((q, None, 1))
        self.pending.clear()
        self.order.clear()
        self.stats.query_only += query_only
        return out


def _key_of_query(q):
    return (q[_PROTO], q[_SRC], q[_SPORT], q[_DST], q[_DPORT], q[_ID])


def _take(queries, response, min_ts):
    """Remove and return the pending query (captured at min_ts or later) whose question matches."""
    rname = response[_QNAME]
    if rname is None:  # response without a question: oldest query with this ID
        for i, q in enumerate(queries):
            if q[_TS] >= min_ts:
                return queries.pop(i)
        return None
    rtype = response[_QTYPE]
    if len(queries) == 1:  # the usual case: compare exactly first, case-fold only when that fails
        q = queries[0]
        qname = q[_QNAME]
        if (
            q[_QTYPE] == rtype
            and qname is not None
            and (qname == rname or qname.lower() == rname.lower())
            and q[_TS] >= min_ts
        ):
            return queries.pop()
        return None
    rname = rname.lower()
    for i, q in enumerate(queries):
        qname = q[_QNAME]
        if q[_QTYPE] == rtype and qname is not None and qname.lower() == rname and q[_TS] >= min_ts:
            return queries.pop(i)
    return None
