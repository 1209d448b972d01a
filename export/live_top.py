"""The figures of `dnsprobe top`, per second of capture time: packets, transactions, RCODE and QTYPE mix, response
delays, and heavy-hitter summaries (export/topk.py; in C export/_topk.c) of the QNAMEs, registered domains and
clients written. A worker counts (TopCounts, fed by its exporter as export.metrics.DnsMetrics is: the rows of each
table written, so after client privacy, and counted as `inspect --summary` counts the files) and hands its seconds
to the supervisor with each snapshot (take()); the supervisor keeps the last seconds of all workers (TopWindow,
probe.run.top) and merges them into a snapshot. A table is counted in C in one pass (export._topk.count_table); the
Arrow and Python counting here (TopCounts(native=False)) is its reference, and what runs where it is not built.

Registered domains are the table's registered_domain column where enrichment filled it, else the bundled Public
Suffix List's (export.enrich.psl, for each distinct QNAME), as `inspect --summary` finds them (a null QNAME's is
"", a public suffix's). Null QNAMEs and clients are in no top list. Response delays are counted in bins of
1/DELAY_BINS_PER_OCTAVE octave (under 0.6 % apart), so the percentiles are within that of the exact ones."""

import math

from export.topk import TOP_K, SpaceSaving
from probe.native import load

_topk = load("export._topk")

DELAY_BINS_PER_OCTAVE = 128
TOP_LISTS = {"qnames": "qname", "domains": "registered_domain", "clients": "src"}  # list → column
TOP_COLUMNS = ("time", "qname", "registered_domain", "src", "qtype", "rcode", "response_delay_us")


def delay_of_bin(b):
    """The smallest delay (µs) of a bin: the inverse of the binning in TopCounts."""
    return max(0, math.ceil(2 ** (b / DELAY_BINS_PER_OCTAVE) - 1))


def new_summary(k=TOP_K):
    return _topk.SpaceSaving(k) if _topk is not None else SpaceSaving(k)


class Second:
    """What one worker counted in one second of capture time since its last snapshot."""

    def __init__(self):
        self.packets = self.transactions = 0
        self.rcode, self.qtype, self.delay = {}, {}, {}
        self.lists = {name: new_summary() for name in TOP_LISTS}

    def as_dict(self, second):
        return {"second": second, "packets": self.packets, "transactions": self.transactions,
                "rcode": list(self.rcode.items()), "qtype": list(self.qtype.items()),
                "delay": list(self.delay.items()),
                **{name: summary.entries() for name, summary in self.lists.items()}}


def _add_counts(into, table, column):
    import pyarrow.compute as pc

    counts = pc.value_counts(table.column(column))
    for value, n in zip(counts.field(0).to_pylist(), counts.field(1).to_pylist()):
        into[value] = into.get(value, 0) + n


def _buffers(column):
    """(offset, buffers) of a ChunkedArray in one chunk, as export._topk.count_table takes a column."""
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return array.offset, array.buffers()


class TopCounts:
    """One worker's counts by second of capture time, since its last take()."""

    def __init__(self, native=True, counting=True):
        """native: count in C (export._topk.count_table) when it is built; False: with Arrow and Python, the
        reference (tests/export/test_live_top.py holds the two to the same seconds); counting: count from now
        (else from start(): capture.top on-demand, until a `dnsprobe top` asks)."""
        import threading

        self.seconds = {}
        self.lock = threading.Lock()  # (DPDK's threads: a pipeline's thread counts, the worker's takes)
        self.want_native = native
        self.suffixes = None  # the Public Suffix List, for the tables without registered domains: read by start()
        self.native = False
        self.counting = False  # what is written is counted (else each table costs one test)
        if counting:
            self.start()

    def start(self):
        """Count what is written from now on. The first start reads the Public Suffix List (about 0.03 CPU s and
        3 MB: docs/usage.md), before counting, not within the counting of the first tables."""
        if self.suffixes is None:
            from export.enrich.psl import PublicSuffixes

            self.suffixes = PublicSuffixes()
            self.native = self.want_native and _topk is not None and self.suffixes.native is not None
        with self.lock:
            self.seconds = {}
        self.counting = True

    def stop(self):
        """Count nothing more; what was counted is dropped."""
        self.counting = False
        with self.lock:
            self.seconds = {}

    def second(self, s):
        if s not in self.seconds:
            self.seconds[s] = Second()
        return self.seconds[s]

    def add_packets(self, n, now_ns):
        """n packets read, counted in the second of the newest capture time (the pipeline's clock)."""
        if n and now_ns and self.counting:
            with self.lock:
                self.second(now_ns // 1_000_000_000).packets += n

    def add_table(self, table):
        """The rows of an Arrow table of the Parquet schema (as written)."""
        if not self.counting or not table.num_rows:
            return
        import pyarrow.compute as pc

        if self.native:
            self._count_native(table)
            return
        table = table.select([c for c in TOP_COLUMNS if c in table.schema.names])  # (a filter takes every column)
        seconds = pc.divide(table.column("time"), 1_000_000)  # capture times are after 1970: floored
        low, high = pc.min_max(seconds).values()
        if low == high:
            self._add_second(low.as_py(), table)
            return
        for s in pc.unique(seconds).to_pylist():
            self._add_second(s, table.filter(pc.equal(seconds, s)))

    def _count_native(self, table):
        """In one pass in C: each second's rows counted as _count counts them (the distinct values in the order
        first seen, as Arrow's value counts give them, so that the summaries get the same updates)."""
        domain = None
        if "registered_domain" in table.schema.names and not table.column("registered_domain").null_count:
            domain = _buffers(table.column("registered_domain"))
        columns = [_buffers(table.column(c)) for c in ("time", "rcode", "qtype", "response_delay_us", "qname", "src")]
        with self.lock:
            _topk.count_table(self.second, table.num_rows, *columns, domain, self.suffixes.native)

    def add_records(self, txs):
        """A probe._records.TxBatch (C-DNS in the production pipeline)."""
        if not self.counting:
            return
        from export.parquet.rows import columns_from_records

        self.add_table(columns_from_records(txs, list(TOP_COLUMNS)))

    def add_transactions(self, txs):
        """Transaction tuples (C-DNS in the reference pipeline): not counted (the reference runs where nothing is
        built; `dnsprobe top` then shows the production pipeline's figures only)."""

    def _add_second(self, s, table):

        with self.lock:
            self._count(self.second(s), table)

    def _count(self, second, table):
        import pyarrow as pa
        import pyarrow.compute as pc

        second.transactions += table.num_rows
        _add_counts(second.rcode, table, "rcode")
        _add_counts(second.qtype, table, "qtype")
        delays = pc.drop_null(table.column("response_delay_us"))
        if len(delays):
            bins = pc.floor(pc.multiply(pc.log2(pc.add(pc.max_element_wise(delays, 0), 1).cast(pa.float64())),
                                        float(DELAY_BINS_PER_OCTAVE))).cast(pa.int64())
            _add_counts(second.delay, pa.table({"bin": bins}), "bin")
        names = pc.value_counts(table.column("qname"))  # (a null QNAME: in no top list, but its domain is "")
        second.lists["qnames"].add(names.field(0).to_pylist(), names.field(1).to_pylist())
        second.lists["domains"].add(*self._domains(table, names))
        clients = self._value_counts(table, "src")
        second.lists["clients"].add(clients.field(0).to_pylist(), clients.field(1).to_pylist())

    @staticmethod
    def _value_counts(table, column):
        """(value, count) of a column's non-null values, a struct array."""
        import pyarrow.compute as pc

        column = table.column(column)
        return pc.value_counts(pc.drop_null(column) if column.null_count else column)

    def _domains(self, table, names):
        """([registered domain], [count]): the table's own where it holds them, else the Public Suffix List's for
        each distinct QNAME (names: the QNAMEs' value counts)."""

        if "registered_domain" in table.schema.names and not table.column("registered_domain").null_count:
            counts = self._value_counts(table, "registered_domain")
            return counts.field(0).to_pylist(), counts.field(1).to_pylist()
        total = {}  # (the domains in the order first met, as count_table updates their summary)
        for domain, n in zip(self.suffixes.columns(names.field(0))[1].to_pylist(), names.field(1).to_pylist()):
            total[domain] = total.get(domain, 0) + n
        return list(total), list(total.values())

    def take(self):
        """The seconds counted since the last take(), as dicts (Second.as_dict), and start afresh."""
        with self.lock:
            seconds, self.seconds = self.seconds, {}
        return [second.as_dict(s) for s, second in sorted(seconds.items())]


class Counted:
    """Several counters of what is written (DnsMetrics, TopCounts) behind the exporter's one `metrics`."""

    def __init__(self, *counters):
        self.counters = counters

    def add_table(self, table):
        for counter in self.counters:
            counter.add_table(table)

    def add_records(self, txs):
        for counter in self.counters:
            counter.add_records(txs)

    def add_transactions(self, txs):
        for counter in self.counters:
            counter.add_transactions(txs)
