"""The figures of `dnsprobe top` (export.live_top counted, probe.run.top merged) against `inspect --summary` of the
same files (probe.cli.summary): the same transactions, RCODE and QTYPE counts, top lists, and delay percentiles
within a bin; and the C counting against its reference on the tables a pipeline writes."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.captures import bench_mix
from support.data import DATA_CAPTURES
from support.dnsprobe import run_dnsprobe

from export.live_top import TOP_LISTS, Counted, TopCounts, delay_of_bin
from export.metrics import DnsMetrics
from export.topk import ranked
from probe.capture.pcapfile import read_capture
from probe.cli.summary import summarise
from probe.config import load_config
from probe.run.pipeline import Pipeline
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


@pytest.mark.skipif(not TopCounts().native, reason="export._topk not built")
@pytest.mark.parametrize("enrich", [False, True], ids=["psl", "enriched"])
@pytest.mark.parametrize("capture", CAPTURES + ["mix"], ids=lambda p: getattr(p, "name", p))
def test_native_counting_same_as_reference(capture, enrich, tmp_path):
    """The C counting (export._topk.count_table) and the reference (Arrow and Python) on the tables a pipeline
    writes, in its batches: the same seconds, summaries included, also where names outnumber the counters (the
    benchmark mix, 20,000 packets: thousands of distinct QNAMEs a second, most updates evicting) and with
    enrichment's registered domains."""
    path = bench_mix() if capture == "mix" else capture
    pipeline = Pipeline(load_config(overrides={"enrich.public_suffix": enrich}), tmp_path)
    native, reference = TopCounts(), TopCounts(native=False)
    pipeline.count_dns(Counted(native, reference))
    for frames in read_capture(path, 512):
        pipeline.feed(frames, str(path))
    pipeline.finish()
    got, want = _by_second(native.take()), _by_second(reference.take())
    assert got == want and sum(s["transactions"] for s in want.values())


@pytest.mark.skipif(not TopCounts().native, reason="export._topk not built")
def test_native_counting_of_rare_values_same_as_reference():
    """Values beyond the C counting's direct tallies (an RCODE of the extended range, QTYPEs TA and private-use,
    a delay of days, a negative one), nulls, a second split by a second's boundary: counted as the reference does."""
    rows = {"time": [1_700_000_000_100_000, 1_700_000_000_900_000, 1_700_000_001_000_000, 1_700_000_001_500_000],
            "qname": ["a.example.com", None, "b.example.co.uk", "a.example.com"],
            "src": ["192.0.2.1", "2001:db8::1", None, "192.0.2.1"],
            "qtype": [1, 32768, 65280, None], "rcode": [0, 4095, None, 100],
            "response_delay_us": [250, 3 * 86_400 * 10**6, None, -5]}
    types = {"time": pa.int64(), "qtype": pa.int32(), "rcode": pa.int32(), "response_delay_us": pa.int64()}
    table = pa.table({name: pa.array(values, types.get(name, pa.string())) for name, values in rows.items()})
    native, reference = TopCounts(), TopCounts(native=False)
    native.add_table(table)
    reference.add_table(table)
    got, want = _by_second(native.take()), _by_second(reference.take())
    assert got == want and sorted(got) == [1_700_000_000, 1_700_000_001]


def _by_second(seconds):
    """take()'s seconds, their mixes in one order (the lists: as the summaries hold them, in counter order)."""
    return {s["second"]: {key: sorted(value, key=str) if key in ("rcode", "qtype", "delay") else
                          ranked(value) if key in TOP_LISTS else value for key, value in s.items()} for s in seconds}
