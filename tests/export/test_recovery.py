"""Live files of a writer that dies (export.recovery): a real writer process (the live pipeline of a capture
worker, fed the bundled sample) is SIGKILLed after a flush, and what it had flushed is found again, as finished
files that `dnsprobe read` of the same frames would have begun with, in each format and compression. Files still
locked by a live writer are left alone; a cut tail is dropped, never an error. The Parquet made from a journal
holds the rows and row groups the direct writer makes."""

import json
import os
import signal
from collections import Counter

import pyarrow.parquet as pq
import pytest
from support.data import ROOT
from support.dnsprobe import run_python

from export.cdns.reader import read_table
from export.recovery import orphans, recover
from probe.config import load_config

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"
FLUSHED_BATCHES = 3  # batches of 4096 frames fed before the flush; more follow, not flushed, then the kill

WRITER = r"""
import json, os, signal, sys, time
from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.run.pipeline import Pipeline

out, fmt, codec, flushed_batches = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg = load_config(None, {"export.format": fmt, "export.cdns_compression": codec, "export.directory": out,
                         "export.row_group_size": 1000})
pipeline = Pipeline(cfg, out, 0, live=True)
batches = list(read_capture(sys.argv[5], 4096))
for batch in batches[:flushed_batches]:
    pipeline.feed(batch)
pipeline.flush()
while pipeline.unwritten()[0]:  # C-DNS: the file's thread writes what the flush handed it
    time.sleep(0.005)
written = pipeline.stats.records
for batch in batches[flushed_batches:]:
    pipeline.feed(batch)
print(json.dumps({"written": written, "unwritten": pipeline.unwritten()[0], "live": pipeline.summary()["live_files"]}),
      flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

FORMATS = [("parquet", "none"), ("cdns", "none"), ("cdns", "gzip"), ("cdns", "xz"), ("cdns", "zstd")]


def kill_writer(out, fmt, codec, flushed=FLUSHED_BATCHES):
    """Run a live pipeline that flushes after `flushed` batches, then is killed; returns what it reported."""
    proc = run_python(WRITER, out, fmt, codec, flushed, SAMPLE)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return json.loads(proc.stdout)


def records(path):
    if path.name.endswith(".parquet"):
        return pq.read_table(path)
    table, error = read_table(path)
    assert error is None, error
    return table


def reference(tmp_path, fmt, codec):
    """What `dnsprobe read` of the whole sample writes (the recovered file must be its beginning)."""
    out = tmp_path / "ref"
    out.mkdir()
    # (each format's own options only: the other format's are refused)
    options = ("--row-group-size", "1000") if fmt == "parquet" else ("--cdns-compression", codec)
    proc = run_python("import sys; from probe.cli import main; sys.exit(main(sys.argv[1:]))", "read", SAMPLE, "-o",
                      out, "-q", "--no-progress", "--format", fmt, *options)
    assert proc.returncode == 0, proc.stderr
    (path,) = [p for p in out.iterdir() if not p.name.endswith(".stats.json")]
    return records(path)


@pytest.mark.parametrize("fmt, codec", FORMATS)
def test_killed_writer_keeps_what_it_flushed(tmp_path, fmt, codec):
    out = tmp_path / "out"
    out.mkdir()
    said = kill_writer(out, fmt, codec)
    assert said["written"] > 0 and said["unwritten"] > 0
    (live,) = said["live"]
    assert os.path.exists(live)
    cfg = load_config(None, {"export.row_group_size": 1000})
    done, errors = recover([out], cfg.export)
    assert not errors
    ((path, count),) = done
    assert count == said["written"] and not os.path.exists(live)
    assert str(path) == live.rsplit(".", 1)[0]  # NAME.parquet.journal → NAME.parquet; NAME.cdns.xz.part → ...
    got = records(path)
    want = reference(tmp_path, fmt, codec)
    assert got.num_rows == said["written"]
    if fmt == "parquet":  # rows of the same output (which a live writer orders by timestamp only at the conversion)
        assert not Counter(map(repr, got.to_pylist())) - Counter(map(repr, want.to_pylist()))
    else:  # the beginning of the same output
        assert got.to_pylist() == want.slice(0, got.num_rows).to_pylist()
    if fmt == "parquet":
        assert [pq.ParquetFile(path).metadata.row_group(i).num_rows for i in range(2)] == [1000, 1000]
    assert recover([out], cfg.export) == ([], [])  # nothing left to do


def test_live_files_of_running_writers_are_left_alone(tmp_path):
    from export.parquet.journal import JournalWriter

    journal = tmp_path / "dnsprobe.20240501.120000.000073.w0.parquet.journal"
    journal.touch()
    writer = JournalWriter(journal)
    try:
        assert orphans([tmp_path]) == []  # locked by its writer
    finally:
        writer.close()
        os.close(writer.lock)
    found = orphans([tmp_path])
    assert [p for p, _, _ in found] == [journal]
    for _, _, fd in found:
        os.close(fd)
    young = tmp_path / "dnsprobe.20240501.120000.000073.w1.cdns.part"
    young.touch()  # just created by a writer that has not locked it yet
    assert [p for p, _, _ in orphans([tmp_path]) if p == young] == []
    # The hive layout's journals are hidden, in partition directories: found below the output directory.
    partition = tmp_path / "year=2024" / "month=5" / "day=1" / "server=probe1"
    partition.mkdir(parents=True)
    hidden = partition / ".dnsprobe.20240501.120000.000073.w0.parquet.journal"
    hidden.write_bytes(b"x")
    assert hidden not in [p for p, _, fd in orphans([tmp_path]) if not os.close(fd)]
    found = [(p, final) for p, final, fd in orphans([tmp_path], recursive=True) if not os.close(fd)]
    assert (hidden, partition / "dnsprobe.20240501.120000.000073.w0.parquet") in found


@pytest.mark.parametrize("fmt, codec", [("parquet", "none"), ("cdns", "none"), ("cdns", "xz"), ("cdns", "gzip")])
def test_a_cut_tail_is_dropped(tmp_path, fmt, codec):
    """A live file cut anywhere (the writer died in the middle of a write) gives the complete batches or blocks
    before the cut, never an error; more bytes never give fewer records."""
    out = tmp_path / "out"
    out.mkdir()
    said = kill_writer(out, fmt, codec, flushed=6)
    (live,) = said["live"]
    data = open(live, "rb").read()
    cfg = load_config(None, {})
    last = -1
    for cut in sorted({len(data) * k // 13 for k in range(14)}):
        part = tmp_path / f"cut{cut}" / os.path.basename(live)
        part.parent.mkdir()
        part.write_bytes(data[:cut])
        done, errors = recover([part.parent], cfg.export)
        count = done[0][1] if done else 0
        assert not errors and count >= last, (cut, count, last)
        last = count
    assert last == said["written"]


@pytest.mark.parametrize("settings", [{}, {"export.layout": "hive", "export.partition_hour": True,
                                           "export.sort": "domainname", "export.server_name": "probe1"}],
                         ids=["flat", "hive-sorted"])
def test_journal_conversion_makes_the_direct_writers_files(tmp_path, settings):
    """The files made from journals hold the rows, row groups (sorted) and page index ParquetExporter writes from
    the same tables, under the same names (in the hive layout, in the same partitions)."""
    from export.parquet.journal import JournalingParquetExporter
    from export.parquet.writer import ParquetExporter
    from probe.stats import Stats

    cfg = load_config(None, {"export.row_group_size": 700, **settings})
    table = reference(tmp_path, "parquet", "none")
    files = {}
    for name, cls in (("direct", ParquetExporter), ("journal", JournalingParquetExporter)):
        d = tmp_path / name
        d.mkdir()
        stats = Stats()
        exporter = cls(cfg, d, 0, stats)
        for start in range(0, table.num_rows, 3000):
            exporter.write_table(table.slice(start, 3000))
            exporter.flush()
        exporter.close()
        files[name] = {str(p.relative_to(d)): p for p in exporter.completed}
        assert stats.records == table.num_rows and stats.files == len(files[name])
        assert not [p for p in d.rglob("*") if p.name.endswith((".journal", ".part"))]
    assert files["direct"].keys() == files["journal"].keys()
    for rel, direct in files["direct"].items():
        journal = files["journal"][rel]
        meta = {name: pq.ParquetFile(path).metadata for name, path in (("d", direct), ("j", journal))}
        groups = {k: [m.row_group(i).num_rows for i in range(m.num_row_groups)] for k, m in meta.items()}
        assert groups["d"] == groups["j"]
        assert pq.read_table(direct).equals(pq.read_table(journal))
        assert pq.ParquetFile(journal).metadata.row_group(0).column(0).has_column_index



def test_journal_codec_is_export_journal_compression(tmp_path):
    """The journal's buffers are compressed with export.journal_compression: the same rows make journals of three
    sizes (none > lz4 > zstd), each read back whole and converted into the same Parquet file."""
    from export.parquet.journal import JournalingParquetExporter, read_journal
    from probe.stats import Stats

    table = reference(tmp_path, "parquet", "none")
    sizes, finals = {}, {}
    for codec in ("none", "lz4", "zstd"):
        d = tmp_path / codec
        d.mkdir()
        cfg = load_config(None, {"export.journal_compression": codec})
        exporter = JournalingParquetExporter(cfg, d, 0, Stats())
        exporter.write_table(table)
        exporter.flush()
        (journal,) = exporter.live_files()
        sizes[codec] = os.path.getsize(journal)
        got, cut = read_journal(journal)
        assert got.equals(table) and not cut
        exporter.close()
        (final,) = exporter.completed
        finals[codec] = pq.read_table(final)
    assert sizes["none"] > 1.5 * sizes["lz4"] and sizes["lz4"] > 1.2 * sizes["zstd"], sizes
    assert finals["none"].equals(table) and finals["lz4"].equals(table) and finals["zstd"].equals(table)


CONVERT = r"""
import json, resource, sys
from pathlib import Path
from export.parquet.journal import convert_journal
from probe.config import load_config

journal, rows = Path(sys.argv[1]), int(sys.argv[2])
cfg = load_config(None, {"export.row_group_size": 5000})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert convert_journal(journal, journal.with_name("out.parquet"), cfg.export) == rows
print(json.dumps({"rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


def write_journal(path, rows):
    """A journal of `rows` rows with long random names (so it is about as large as its rows); its size in MiB."""
    import base64

    import pyarrow as pa
    import pyarrow.ipc as ipc

    from export.parquet.journal import IPC_OPTIONS
    from export.parquet.schema import SCHEMA

    names = pa.array([base64.b64encode(os.urandom(1200)).decode() for _ in range(1000)])
    batch = pa.RecordBatch.from_arrays([names if f.name == "qname" else pa.nulls(1000, f.type) for f in SCHEMA],
                                       schema=SCHEMA)
    with ipc.new_stream(pa.OSFile(str(path), "w"), SCHEMA, options=IPC_OPTIONS["lz4"]) as w:
        for _ in range(rows // 1000):
            w.write_batch(batch)
    return path.stat().st_size / 2**20


def test_journal_conversion_memory_does_not_grow_with_the_journal(tmp_path):
    """A journal is converted one row group at a time: the converting worker's peak RSS rises by what a row group
    holds, whatever the journal's size (a journal read through a memory map added all of its pages to the RSS)."""
    size, grown = {}, {}
    for rows in (10_000, 130_000):
        journal = tmp_path / str(rows) / "x.parquet.journal"
        journal.parent.mkdir()
        size[rows] = write_journal(journal, rows)
        proc = run_python(CONVERT, journal, rows)
        assert proc.returncode == 0, proc.stderr
        grown[rows] = json.loads(proc.stdout)["rss_growth_mb"]
    assert size[130_000] - size[10_000] > 100, size  # the comparison means something
    assert grown[130_000] - grown[10_000] < 0.2 * (size[130_000] - size[10_000]), (size, grown)


@pytest.mark.parametrize("chosen", [None, "mimalloc"])
def test_arrow_buffers_come_from_the_c_allocator_unless_chosen(chosen):
    """Importing dnsprobe makes the C library's allocator Arrow's default pool (mimalloc kept the pages a worker
    freed, a fifth of its RSS), before pyarrow is imported; an ARROW_DEFAULT_MEMORY_POOL the user set is kept."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    code = "import probe.cli, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (chosen or "system")
