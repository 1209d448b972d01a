"""The matching stage on message records, the production pipeline's: probe.match._matchrec.Matcher, the whole
table in C (probe/match/_matchrec.c), with TransactionTable's rules and order, for packets' and dnstap's messages
(their scopes, query copies). TransactionTable (Python, on message tuples) is the reference
(tests/match/test_matchrec.py compares the two).
"""

import os

from probe.native import load

_matchrec = load("probe.match._matchrec")

# The counters of a Matcher call, in the order it gives them.
_COUNTERS = (
    "matched", "response_only", "duplicate_queries", "query_only", "match_evicted", "zone_transfer_messages",
    "lengths_capped", "dnstap_embedded_used", "transfers_evicted",
)


class RecordTable:
    """add() matches a probe._records.MsgBatch and appends the transactions it completes (then those that timed
    out) to a TxBatch, as TransactionTable.add returns them."""

    def __init__(self, match_cfg, stats):
        self.stats = stats
        # The key hash is seeded per process, so that crafted traffic cannot aim at one hash chain.
        seed = int.from_bytes(os.urandom(8), "little", signed=True)
        self.matcher = _matchrec.Matcher(
            int(match_cfg.query_timeout * 1e9), match_cfg.max_pending, match_cfg.max_pending_per_key,
            match_cfg.max_transfers, seed,
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

    @property
    def held(self):
        """Pending queries (TransactionTable.held)."""
        return self.matcher.held()

    @property
    def open_transfers(self):
        """Open zone transfers (len(TransactionTable.transfers))."""
        return self.matcher.transfers()

    def _count(self, counts):
        stats = self.stats
        for name, n in zip(_COUNTERS, counts):
            if n:
                setattr(stats, name, getattr(stats, name) + n)
