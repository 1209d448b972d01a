"""The figures of `dnsprobe top` (export.live_top counted, probe.run.top merged) against `inspect --summary` of the
same files (probe.cli.summary): the same transactions, RCODE and QTYPE counts, top lists, and delay percentiles
within a bin."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.data import DATA_CAPTURES
from support.dnsprobe import run_dnsprobe

from export.live_top import Counted, TopCounts, delay_of_bin
from export.metrics import DnsMetrics
from probe.cli.summary import summarise
from probe.run.top import WINDOW_S, TopWindow

CAPTURES = [p for p in DATA_CAPTURES if p.name in ("gold.pcap.xz", "knot-live.raw.pcap.xz", "matching.pcap.xz",
                                                     "testcontent.pcap.xz", "unmatched.pcap.xz")]


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_same_figures_as_inspect_summary(capture, tmp_path):
    run_dnsprobe("read", capture, "-o", tmp_path, "-q", "--no-progress")
    files = sorted(tmp_path.glob("*.parquet"))
    counts, window = TopCounts(), TopWindow()
    both = Counted(DnsMetrics(), counts)  # as a worker with Prometheus on counts
    for f in files:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=1000):
            both.add_table(pa.Table.from_batches([batch]))
            window.add(counts.take())
    summary, _ = summarise(files, top=10)
    seconds = summary["time"]["seconds"] + 2 if summary["time"] else 1
    if seconds > WINDOW_S:
        pytest.skip(f"the capture spans {seconds} s, more than the window")
    top = window.snapshot(WINDOW_S, listed=10)
    assert top["transactions"] == summary["records"]
    assert {(m["value"], m["count"]) for m in top["rcode"]} == {(r["rcode"], r["count"]) for r in summary["rcodes"]}
    assert {(m["value"], m["count"]) for m in top["qtype"]} == {(r["qtype"], r["count"]) for r in summary["qtypes"]}
    for key, column in (("qnames", "qname"), ("registered_domains", "registered_domain"), ("clients", "src")):
        want = [(e[column], e["count"]) for e in summary[key]["top"] if e[column] is not None]
        got = [(e["value"], e["count"]) for e in top[key]]
        assert got[:len(want)] == want[:len(got)], key
    delays = summary["response_delay_us"]
    if delays is None:
        assert top["delay"] == {"count": 0}
        return
    assert top["delay"]["count"] == delays["count"]
    for p in ("p50", "p90", "p99"):
        assert top["delay"][p] <= delays[p] <= max(delay_of_bin(_bin(top["delay"][p]) + 1), top["delay"][p] + 1), p


def _bin(delay):
    import math

    from export.live_top import DELAY_BINS_PER_OCTAVE

    return math.floor(math.log2(delay + 1) * DELAY_BINS_PER_OCTAVE)
