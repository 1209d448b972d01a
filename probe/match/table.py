"""Matching stage: pairs queries with responses into transactions.

Key: scope (the IP protocol for packets; transport, producer and message family for dnstap: probe.model),
client address and port, server address and port, DNS ID; the question (QTYPE and
case-folded QNAME) is compared within the key, so a response with no question section (some error
responses) still matches the oldest pending query with its ID. Timeouts run on capture time.
A transaction is a pair (query tuple or None, response tuple or None); malformed messages are exported
alone, unmatched (as compactor does: a malformed message cannot be trusted to match).

Zone transfers (AXFR/IXFR): the first response opens the transaction; later responses on the same
connection with the same ID add their ANCOUNT and lengths, until a message whose last answer is an SOA
(or an error RCODE) closes it, as DNS Probe does. At most match.max_transfers are open: the transfer whose last
message is the oldest is closed early to open another (transfers_evicted). Open transfers are kept in the order of
their last message, so that expiry looks at only those that time out, however many are open.

TransactionTable is the matcher of message tuples, in Python: the reference pipeline's, and the reference that
the production matcher on message records (RecordTable, probe/match/_matchrec.c) must equal
(tests/match/test_matchrec.py).
"""

from collections import OrderedDict

from probe.model import FLAG_QR, M, QueryCopy, cap_int32

QTYPE_IXFR = 251
QTYPE_AXFR = 252
TYPE_SOA = 6

_ID, _FLAGS, _QNAME, _QTYPE = M.ID, M.FLAGS, M.QNAME, M.QTYPE
_TS, _MALFORMED, _SCOPE = M.TS_NS, M.MALFORMED, M.SCOPE
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
        wirelen = response[M.WIRELEN]
        self.wirelen = None if wirelen is None or self.wirelen is None else self.wirelen + wirelen  # dnstap: None
        self.dns_len += response[M.DNS_LEN]
        self.messages += 1
        self.last_ts = response[_TS]

    def merged(self, stats):
        """The first response with the summed counts (DNS Probe's merge_AXFR_record)."""
        r = list(self.first)
        r[M.ANCOUNT] = cap_int32(self.ancount, stats)
        r[M.WIRELEN] = cap_int32(self.wirelen, stats)
        r[M.DNS_LEN] = cap_int32(self.dns_len, stats)
        return (self.query, tuple(r), self.messages)


def _closes_transfer(response):
    flags = response[_FLAGS]
    return (flags & 0x000F) != 0 or response[M.LAST_AN_TYPE] == TYPE_SOA


class TransactionTable:
    """Pending queries and open zone transfers, with capture-time expiry.

    add() takes a list of message tuples in capture order and returns the transactions completed
    by them, as (query, response, response_messages) triples, in completion order.

    `pending` maps a key to its query tuple, or to a list of them when several queries with the same
    key are outstanding (retries that reuse the ID and port). The dict's insertion order is the age
    order that expiry walks from the front, so a matched query costs nothing more once it is removed:
    no separate age queue to pop and look up again (that lookup cost a cache miss per query).
    `held` counts the queries in it: max_pending bounds queries, not keys, and max_pending_per_key bounds
    each list (a response scans the list of its key).
    """

    def __init__(self, match_cfg, stats):
        self.timeout_ns = int(match_cfg.query_timeout * 1e9)
        self.max_pending = match_cfg.max_pending
        self.per_key = match_cfg.max_pending_per_key
        self.max_transfers = match_cfg.max_transfers
        self.held = 0  # queries in pending (a list value holds several)
        self.stats = stats
        self.pending = {}  # key -> query tuple, or list of query tuples (oldest first); oldest key first
        self.transfers = OrderedDict()  # key -> _Transfer; the oldest last message first
        self.now_ns = 0

    def add(self, msgs, now_ns=None):
        """now_ns: the capture clock after these messages, which expiry runs on: the pipeline's, the time of its
        last frame, also of a batch without messages, so that timeouts fire alike however the frames are split
        between workers (`dnsprobe read --workers`); None: the time of the last message."""
        out = []
        if msgs:
            self._pair(msgs, out)
        last = now_ns if now_ns is not None else msgs[-1][_TS] if msgs else None
        if last is not None and last > self.now_ns:
            self.now_ns = last
        self._expire(out)
        return out

    def _pair(self, msgs, out):
        """Match msgs, appending completed transactions to out (no expiry)."""
        pending = self.pending
        stats = self.stats
        timeout = self.timeout_ns
        per_key = self.per_key
        matched = response_only = dup = stored = taken = evicted = 0
        for m in msgs:
            if type(m) is QueryCopy:
                self._query_copy(m, out)
                continue
            flags = m[_FLAGS]
            if m[_MALFORMED]:
                # Exported alone: on the query side unless the header says response.
                out.append((None, m, 1) if flags is not None and flags & FLAG_QR else (m, None, 1))
                continue
            if flags & FLAG_QR:
                key = (m[_SCOPE], m[_DST], m[_DPORT], m[_SRC], m[_SPORT], m[_ID])
                waiting = pending.get(key)
                if waiting is not None:
                    # Queries older than the timeout (capture time) no longer match, even when their
                    # expiry has not run yet (it runs once per batch); _expire exports them below.
                    min_ts = m[_TS] - timeout
                    if type(waiting) is list:
                        q = _take(waiting, m, min_ts)
                        if q is not None and not waiting:
                            del pending[key]
                    elif _answers(waiting, m, min_ts):
                        q = waiting
                        del pending[key]
                    else:
                        q = None
                    if q is not None:
                        taken += 1
                        if q[_QTYPE] == QTYPE_AXFR or q[_QTYPE] == QTYPE_IXFR:
                            if not _closes_transfer(m):
                                self._open_transfer(key, q, m, out)
                                continue
                        matched += 1
                        out.append((q, m, 1))
                        continue
                if self.transfers and self._continue_transfer(key, m, out):
                    continue
                response_only += 1
                out.append((None, m, 1))
            else:
                key = (m[_SCOPE], m[_SRC], m[_SPORT], m[_DST], m[_DPORT], m[_ID])
                waiting = pending.get(key)
                stored += 1
                if waiting is None:
                    pending[key] = m
                    continue
                dup += 1
                if type(waiting) is list:
                    if len(waiting) >= per_key:
                        evicted += 1
                        out.append((waiting.pop(0), None, 1))
                    waiting.append(m)
                elif per_key <= 1:
                    evicted += 1
                    out.append((waiting, None, 1))
                    pending[key] = m
                else:
                    pending[key] = [waiting, m]
        self.held += stored - taken - evicted
        stats.matched += matched
        stats.response_only += response_only
        stats.duplicate_queries += dup
        stats.query_only += evicted
        stats.match_evicted += evicted

    def _continue_transfer(self, key, response, out):
        """Whether response, not a pending query's, is the next message of the open transfer under its key: then
        added to it, which it closes or makes the youngest."""
        xfr = self.transfers.get(key)
        if xfr is None:
            return False
        xfr.add(response)
        self.stats.zone_transfer_messages += 1
        if _closes_transfer(response):
            del self.transfers[key]
            self.stats.matched += 1
            out.append(xfr.merged(self.stats))
        else:
            self.transfers.move_to_end(key)
        return True

    def _open_transfer(self, key, query, response, out):
        """A transfer opened by response, at the young end. The one it replaces under its key, or else the oldest when
        max_transfers are open, is closed first: exported as it stands, as at its timeout."""
        old = self.transfers.pop(key, None)
        if old is None and len(self.transfers) >= self.max_transfers:
            old = self.transfers.popitem(last=False)[1]
            self.stats.transfers_evicted += 1
        if old is not None:
            self.stats.matched += 1
            out.append(old.merged(self.stats))
        self.transfers[key] = _Transfer(query, response)

    def _query_copy(self, m, out):
        """A query carried in a dnstap response: it waits for that response like a query, unless the query
        itself is pending (logged on its own) or it is malformed; then it is dropped (a transaction counts once)."""
        if m[_MALFORMED]:
            return
        waiting = self.pending.get((m[_SCOPE], m[_SRC], m[_SPORT], m[_DST], m[_DPORT], m[_ID]))
        if waiting is not None:
            for q in waiting if type(waiting) is list else (waiting,):
                if _answers(q, m, q[_TS]):
                    return
        self.stats.dnstap_embedded_used += 1
        self._pair([tuple(m)], out)

    def _expire(self, out):
        """Export queries older than the timeout (and the oldest beyond max_pending) as query-only."""
        cutoff = self.now_ns - self.timeout_ns
        pending = self.pending
        excess = self.held - self.max_pending
        due = []
        for key, waiting in pending.items():
            first = waiting[0] if type(waiting) is list else waiting
            if first[_TS] >= cutoff and excess <= 0:
                break
            due.append(key)
            excess -= len(waiting) if type(waiting) is list else 1
        query_only = evicted = 0
        for key in due:
            waiting = pending.pop(key)
            if type(waiting) is not list:
                waiting = [waiting]
            elif waiting[-1][_TS] >= cutoff:
                keep = [q for q in waiting if q[_TS] >= cutoff]
                if self.held - len(waiting) + len(keep) <= self.max_pending:
                    # Retries still within the timeout stay pending, now at the young end.
                    waiting = [q for q in waiting if q[_TS] < cutoff]
                    pending[key] = keep if len(keep) > 1 else keep[0]
            self.held -= len(waiting)
            for q in waiting:
                query_only += 1
                out.append((q, None, 1))
                if q[_TS] >= cutoff:
                    evicted += 1
        self.stats.query_only += query_only
        self.stats.match_evicted += evicted
        transfers = self.transfers
        while transfers and next(iter(transfers.values())).last_ts < cutoff:
            self.stats.matched += 1
            out.append(transfers.popitem(last=False)[1].merged(self.stats))

    def __len__(self):
        """Queries waiting for their response."""
        return self.held

    @property
    def open_transfers(self):
        """Open zone transfers."""
        return len(self.transfers)

    def flush(self):
        """End of input: everything pending is exported (queries as query-only)."""
        out = []
        for xfr in list(self.transfers.values()):
            self.stats.matched += 1
            out.append(xfr.merged(self.stats))
        self.transfers.clear()
        queries = []
        for waiting in self.pending.values():
            if type(waiting) is list:
                queries += waiting
            else:
                queries.append(waiting)
        if any(type(w) is list for w in self.pending.values()):
            queries.sort(key=lambda q: q[_TS])  # retries moved to the young end go back in capture order
        out += [(q, None, 1) for q in queries]
        self.pending.clear()
        self.held = 0
        self.stats.query_only += len(queries)
        return out


def _answers(q, response, min_ts):
    """The pending query q (with the response's key) is the one `response` answers."""
    rname = response[_QNAME]
    if rname is None:  # response without a question: the query with this ID
        return q[_TS] >= min_ts
    qname = q[_QNAME]
    return (
        q[_QTYPE] == response[_QTYPE]
        and qname is not None
        and (qname == rname or qname.lower() == rname.lower())
        and q[_TS] >= min_ts
    )


def _take(queries, response, min_ts):
    """Remove and return the oldest pending query (captured at min_ts or later) that `response` answers."""
    for i, q in enumerate(queries):
        if _answers(q, response, min_ts):
            return queries.pop(i)
    return None
