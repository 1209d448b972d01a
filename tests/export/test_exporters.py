"""The exporter contract (export.base.Exporter), the same for every output format: rotation by records and by
bytes (export.base.FileExporter decides it; each format's writer only says what its files hold), checked on the
real `dnsprobe read` of one capture with each file read back; one constructor; the DNS metrics of what is
written."""

import inspect
import json
from pathlib import Path

import cbor2
import pyarrow.parquet as pq
import pytest
from support.data import ROOT
from support.dnsprobe import run_dnsprobe

from export import make_exporter
from export.cdns import format as F
from export.metrics import DnsMetrics
from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.run.pipeline import Pipeline
from probe.stats import Stats

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"
FORMATS = ("parquet", "cdns")
# Small row groups and blocks: a file passes export.rotate_bytes by less than one of them.
SMALL_UNITS = {"parquet": ("--row-group-size", "500"), "cdns": ("--set", "export.cdns_block_items=500")}


def records_of(path):
    """The records in one output file, counted from the file itself."""
    if path.suffix == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    doc = cbor2.loads(path.read_bytes())
    return sum(len(b.get(F.QUERY_RESPONSES, ())) + len(b.get(F.MALFORMED_MESSAGES, ())) for b in doc[2])


def read_files(out_dir, fmt, *extra):
    """(output files in order, the run's record counter), no time rotation."""
    out_dir.mkdir()
    run_dnsprobe("read", SAMPLE, "-o", out_dir, "-q", "--no-progress", "--format", fmt, "--rotate-seconds", "0",
                 *SMALL_UNITS[fmt], *extra)
    counters = json.loads(next(Path(out_dir).glob("*.stats.json")).read_text())["counters"]
    files = sorted(p for p in out_dir.iterdir() if p.name.endswith((".parquet", ".cdns")))
    assert counters["files"] == len(files) and not list(out_dir.glob("*.part"))
    assert sum(records_of(f) for f in files) == counters["records"]  # none lost, none twice
    return files, counters["records"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_rotates_by_records(tmp_path, fmt):
    limit = 1500
    files, total = read_files(tmp_path / "out", fmt, "--rotate-records", str(limit))
    counts = [records_of(f) for f in files]
    assert len(files) == -(-total // limit) >= 3
    assert counts[:-1] == [limit] * (len(files) - 1) and 0 < counts[-1] <= limit


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_rotates_by_bytes(tmp_path, fmt):
    limit = 100_000
    files, total = read_files(tmp_path / "out", fmt, "--rotate-records", "0", "--set", f"export.rotate_bytes={limit}")
    assert len(files) >= 3
    # Closed at the first row group or block that reaches the limit: every file but the last holds at least the
    # limit, and passes it by less than one row group or block (500 records, far fewer bytes than the limit).
    for f in files:
        size = f.stat().st_size
        assert size < 2 * limit, (f.name, size)
        assert size >= limit or f == files[-1], (f.name, size)


def test_every_format_is_made_with_the_same_arguments(tmp_path):
    from export.cdns.writer import CdnsExporter
    from export.parquet.writer import ParquetExporter

    assert inspect.signature(ParquetExporter.__init__) == inspect.signature(CdnsExporter.__init__)
    metrics = DnsMetrics()
    for fmt in FORMATS:
        cfg = load_config(overrides={"export.format": fmt})
        exporter = make_exporter(cfg, tmp_path, 0, Stats(), live=True, metrics=metrics)
        assert exporter.metrics is metrics
        exporter.reload()  # (nothing to read again: no enrichment configured)
        exporter.close()


def test_every_format_counts_the_dns_metrics_of_what_it_writes(tmp_path):
    """Pipeline.count_dns: the same figures whichever format writes the transactions, across rotations."""
    figures = {}
    for fmt in FORMATS:
        out = tmp_path / fmt
        out.mkdir()
        pipeline = Pipeline(load_config(overrides={"export.format": fmt, "export.rotate_records": 3000}), out)
        metrics = DnsMetrics()
        pipeline.count_dns(metrics)
        for frames in read_capture(SAMPLE, 512):
            pipeline.feed(frames, str(SAMPLE))
        stats = pipeline.finish()
        assert stats.files == 4
        figures[fmt] = metrics.as_dict()
        figures[fmt]["transactions"].sort(key=repr)
        assert sum(n for *_, n in figures[fmt]["transactions"]) == stats.records
        assert 0 < figures[fmt]["delay_count"] < stats.records
    assert figures["parquet"] == figures["cdns"]


@pytest.mark.parametrize("limit", ["records", "bytes"])
def test_live_parquet_rotates_its_journals_by_records_and_bytes(tmp_path, limit):
    """Live Parquet writes journals first (export.parquet.journal): export.rotate_bytes measures the journal."""
    from export.parquet.journal import JournalingParquetExporter

    files, _ = read_files(tmp_path / "offline", "parquet")
    table = pq.read_table(files[0])
    settings = {"export.rotate_records": 1500} if limit == "records" else {"export.rotate_bytes": 100_000}
    stats = Stats()
    (tmp_path / "live").mkdir()
    exporter = make_exporter(load_config(overrides={"export.rotate_seconds": 0, **settings}), tmp_path / "live", 0,
                             stats, live=True)
    assert type(exporter) is JournalingParquetExporter
    sizes = []
    for start in range(0, table.num_rows, 500):
        exporter.write_table(table.slice(start, 500))
        exporter.flush()
        if exporter.is_open():
            sizes.append(exporter.part_path.stat().st_size)
    exporter.close()
    counts = [records_of(f) for f in exporter.completed]
    assert sum(counts) == stats.records == table.num_rows and len(counts) >= 3
    if limit == "records":
        assert counts[:-1] == [1500] * (len(counts) - 1)
    else:
        assert max(sizes) < 2 * 100_000  # (cut by size alone: rotate_records is 5,000,000)
