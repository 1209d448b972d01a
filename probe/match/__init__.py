"""Matching stage: DNS messages → transactions (query, response, response_messages).

probe.match.table.TransactionTable is the one matcher: its per-message loop runs in C (probe/match/_match.c)
and its Python loop is the reference the tests compare the C loop with.
"""

from typing import Protocol

from probe.match.table import TransactionTable


class Matcher(Protocol):
    """The matching stage's interface, as the pipeline uses it."""

    def add(self, msgs) -> list:
        """Message tuples in capture order → the transactions they complete (and those that timed out)."""

    def flush(self) -> list:
        """End of input: every pending query as a query-only transaction, open zone transfers closed."""


__all__ = ["Matcher", "TransactionTable"]
