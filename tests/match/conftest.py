"""Fixtures of the matching tests: a capture of generated traffic, and the matcher under test, the Python reference
or the C matcher of message records, behind one interface."""

import pytest
from support.frames import write_pcap
from support.matching import generated_frames

from probe import _records
from probe.config import MatchConfig
from probe.match import RecordTable, TransactionTable
from probe.stats import Stats


@pytest.fixture(scope="module", params=[1, 2, 3])
def generated_capture(request, tmp_path_factory):
    """A capture of generated traffic that walks every branch of matching (support.matching), for three seeds."""
    path = tmp_path_factory.mktemp("match") / f"generated-{request.param}.pcap"
    return write_pcap(path, generated_frames(request.param, 700))


class _Matcher:
    """What both matchers' tables tell the tests."""

    @property
    def held(self):
        return self.table.held

    @property
    def open_transfers(self):
        return self.table.open_transfers


class ReferenceMatcher(_Matcher):
    """TransactionTable's Python loop on message tuples: the specification."""

    def __init__(self, match_cfg):
        self.stats = Stats()
        self.table = TransactionTable(match_cfg, self.stats)

    def add(self, msgs, now_ns=None):
        return self.table.add(list(msgs), now_ns)

    def flush(self):
        return self.table.flush()


class RecordMatcher(_Matcher):
    """RecordTable, the production matcher: the message tuples go in as a MsgBatch (MsgBatch.append), the
    transactions come back out of its TxBatch as tuples (TxBatch.to_tuples)."""

    def __init__(self, match_cfg):
        self.stats = Stats()
        self.table = RecordTable(match_cfg, self.stats)
        self.msgs, self.out = _records.MsgBatch(), _records.TxBatch()

    def add(self, msgs, now_ns=None):
        self.msgs.clear()
        for m in msgs:
            self.msgs.append(m)
        self.out.clear()
        self.table.add(self.msgs, self.out, now_ns)
        return self.out.to_tuples()

    def flush(self):
        self.out.clear()
        self.table.flush(self.out)
        return self.out.to_tuples()


MATCHERS = {"reference": ReferenceMatcher, "records": RecordMatcher}


@pytest.fixture(params=list(MATCHERS))
def matcher(request):
    """make(**MatchConfig fields) -> a new matcher of the kind under test: add(message tuples, now_ns=None) and
    flush() return transactions as (query, response, response_messages) tuples; .stats, .held, .open_transfers."""
    return lambda **cfg: MATCHERS[request.param](MatchConfig(**cfg))
