"""The matching stage on message records, the production pipeline's: probe.match._matchrec.Matcher, the whole
table in C (probe/match/_matchrec.c), with TransactionTable's rules and order. TransactionTable (Python, on
message tuples) is the reference (tests/match/test_matchrec.py compares the two).
"""

import os

from probe.match.table import _Transfer
from probe.native import load

_matchrec = load("probe.match._matchrec")

# The counters of a Matcher call, in the order it gives them.
_COUNTERS = (
    "matched", "response_only", "duplicate_queries", "query_only", "match_evicted", "zone_transfer_messages",
    "lengths_capped",
)


class RecordTable:
    """add() matches a probe._records.MsgBatch and appends the transactions it completes (then those that timed
    out) to a TxBatch, as TransactionTable.add returns them."""

    def __init__(self, match_cfg, stats):
        self.stats = stats
        # The key hash is seeded per process, so that crafted traffic cannot aim at one hash chain.
        seed = int.from_bytes(os.urandom(8), "little", signed=True)
        self.matcher = _matchrec.Matcher(
            int(match_cfg.query_timeout * 1e9), match_cfg.max_pending, match_cfg.max_pending_per_key, seed
        )

    @staticmethod
    def supports(match_cfg):
        """Whether the C table is built and takes this configuration (its time arithmetic is 64-bit)."""
        return _matchrec is not None and abs(int(match_cfg.query_timeout * 1e9)) < 2**63

    def add(self, msgs, out, now_ns=None):
        """now_ns: the capture clock after these messages (TransactionTable.add)."""
        self._count(self.matcher.add(msgs, out, now_ns))

    def flush(self, out):
        """End of input: open zone transfers, then every pending query (query-only), into out."""
        self._count(self.matcher.flush(out))

    def __len__(self):
        """Pending keys."""
        return len(self.matcher)

    def hand_over(self, table):
        """Give the pending queries and open zone transfers, as tuples, to the empty TransactionTable `table`,
        which carries on as this table would have (same order, same clock); this table is left empty."""
        now_ns, held, pending, transfers = self.matcher.state()
        table.now_ns = max(table.now_ns, now_ns)
        table.held = held
        for key, queries, is_list in pending:
            table.pending[key] = queries if is_list else queries[0]
        for key, query, first, ancount, wirelen, dns_len, messages, last_ts in transfers:
            xfr = _Transfer(query, first)
            xfr.ancount, xfr.wirelen, xfr.dns_len, xfr.messages, xfr.last_ts = (
                ancount, wirelen, dns_len, messages, last_ts
            )
            table.transfers[key] = xfr
        self.matcher = _matchrec.Matcher(table.timeout_ns, table.max_pending, table.per_key, 0)

    @property
    def held(self):
        """Pending queries (TransactionTable.held)."""
        return self.matcher.held()

    def _count(self, counts):
        stats = self.stats
        for name, n in zip(_COUNTERS, counts):
            if n:
                setattr(stats, name, getattr(stats, name) + n)
