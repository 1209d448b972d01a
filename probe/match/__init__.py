"""Matching stage: DNS messages → transactions (query, response, response_messages).

probe.match.table.TransactionTable is the matcher of message tuples: its per-message loop runs in C
(probe/match/_match.c) and its Python loop is the reference the tests compare the C loop with.
probe.match.records.RecordTable is the same table on message records, all in C, for the columnar pipeline.
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
