"""Matching stage: DNS messages → transactions (query, response, response_messages).

probe.match.records.RecordTable is the production matcher, on message records, all in C (probe/match/_matchrec.c).
probe.match.table.TransactionTable is the same table on message tuples, in Python: the reference pipeline's
matcher and the reference RecordTable is tested against.
"""

from typing import Protocol

from probe.match.records import RecordTable
from probe.match.table import TransactionTable


class Matcher(Protocol):
    """The matching stage's interface, as the pipeline uses it."""

    def add(self, msgs) -> list:
        """Message tuples in capture order → the transactions they complete (and those that timed out)."""

    def flush(self) -> list:
        """End of input: every pending query as a query-only transaction, open zone transfers closed."""


class RecordMatcher(Protocol):
    """The matching stage on message records (the columnar pipeline)."""

    def add(self, msgs, out) -> None:
        """A MsgBatch in capture order → the transactions it completes (and those that timed out), appended to
        the TxBatch out."""

    def flush(self, out) -> None:
        """End of input: every pending query as a query-only transaction, open zone transfers closed, into out."""


__all__ = ["Matcher", "RecordMatcher", "RecordTable", "TransactionTable"]
