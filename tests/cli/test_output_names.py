"""Output names are a function of the input (the capture time of a file's first record and the worker), so that
reading the same input twice into one directory never doubles a data set: the second `dnsprobe read` is refused
(exit 2, naming the file and --overwrite) and changes nothing; with --overwrite it replaces the files. Files of one
run that start in the same microsecond stay distinct (.N). Live capture never replaces a file nor is refused: a
capture restarted onto a name an earlier run left keeps both files."""

import dataclasses
import json

import pyarrow.parquet as pq
import pytest
from support.data import ROOT
from support.dnsprobe import run_dnsprobe
from support.frames import T0, udp_frame, write_pcap
from support.messages import q_dns

from probe.capture.files import open_file_source
from probe.config import load_config
from probe.run.pipeline import Pipeline

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"
LIVE_NAMES = (".part", ".journal")


def data_files(out):
    """{path relative to out: bytes} of every file of records (finished or being written) below out."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
            if p.is_file() and not p.name.endswith(".stats.json")}


def stats_docs(out):
    return [json.loads(p.read_text()) for p in sorted(out.glob("_*.stats.json"))]


@pytest.mark.parametrize("options", [
    (),
    ("--format", "cdns", "--cdns-compression", "gzip"),
    ("--set", "export.layout=hive", "--set", "export.server_name=ns1"),
    ("--workers", "2", "--rotate-records", "3000"),
], ids=["parquet", "cdns", "hive", "workers"])
def test_the_same_input_read_twice_is_refused_then_replaced(out_dir, options):
    read = ("read", SAMPLE, "-o", out_dir, "-q", "--no-progress", *options)
    run_dnsprobe(*read)
    first = data_files(out_dir)
    (doc,) = stats_docs(out_dir)
    records = doc["counters"]["records"]
    assert first and records > 0

    again = run_dnsprobe(*read, check=False)
    assert again.returncode == 2, again.stderr
    (line,) = again.stderr.strip().splitlines()
    assert "--overwrite" in line and any(name.rsplit("/", 1)[-1] in line for name in first), line
    assert data_files(out_dir) == first  # nothing added, nothing changed, no .part left
    assert len(stats_docs(out_dir)) == 1  # a refused run writes no statistics

    run_dnsprobe(*read, "--overwrite")
    replaced = data_files(out_dir)
    assert replaced.keys() == first.keys()
    docs = stats_docs(out_dir)
    assert len(docs) == 2 and docs[-1]["counters"]["records"] == records
    assert sorted(docs[-1]["files_written"]) == sorted(name.rsplit("/", 1)[-1] for name in first)
    if "cdns" not in options:
        assert pq.read_table(out_dir).num_rows == records  # the directory as an engine reads it: once


def same_microsecond(path, count=4):
    """`count` queries without a response, all captured in one microsecond (sub-microsecond apart)."""
    return write_pcap(path, [(T0 + i, udp_frame(q_dns(i + 1), cport=40000 + i)) for i in range(count)])


def test_files_of_one_run_starting_in_one_microsecond_stay_distinct(tmp_path, out_dir):
    pcap = same_microsecond(tmp_path / "same-us.pcap")
    read = ("read", pcap, "-o", out_dir, "-q", "--no-progress", "--rotate-records", "1")
    run_dnsprobe(*read)
    base = "dnsprobe.20200819.134153.851855.w0"
    names = [f"{base}.parquet"] + [f"{base}.{n}.parquet" for n in (1, 2, 3)]
    assert sorted(data_files(out_dir)) == sorted(names)
    assert pq.read_table(out_dir).num_rows == 4
    refused = run_dnsprobe(*read, check=False)
    assert refused.returncode == 2 and f"{base}.parquet exists" in refused.stderr
    run_dnsprobe(*read, "--overwrite")
    assert sorted(data_files(out_dir)) == sorted(names) and pq.read_table(out_dir).num_rows == 4


def live_run(cfg, out, pcap):
    """What a capture worker's pipeline does with the packets of pcap (as if captured): live=True, rotation by
    records; returns the names of the files it finished."""
    pipeline = Pipeline(cfg, out, live=True)
    source = open_file_source(pcap)
    while (batch := source.read()) is not None:
        pipeline.feed(batch, source.name)
    source.close()
    pipeline.finish()
    return [p.name for p in pipeline.exporter.completed]


@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_a_restarted_capture_keeps_the_earlier_files_and_its_own(tmp_path, out_dir, fmt):
    """A capture restarted onto the names of an earlier run's files (its first packet in the same microsecond):
    neither refused (an always-on service must start) nor replacing (export.overwrite is for reading files), nor
    mixed into one file: its files take the next free .N."""
    pcap = same_microsecond(tmp_path / "same-us.pcap", count=2)
    cfg = load_config(None, {"export.format": fmt, "export.rotate_records": 1, "export.overwrite": True,
                             "export.directory": str(out_dir)})
    cfg = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, rotate_seconds=0))
    earlier = live_run(cfg, out_dir, pcap)
    kept = data_files(out_dir)
    restarted = live_run(cfg, out_dir, pcap)
    base = "dnsprobe.20200819.134153.851855.w0"
    suffix = ".parquet" if fmt == "parquet" else ".cdns"
    assert earlier == [f"{base}{suffix}", f"{base}.1{suffix}"]
    assert restarted == [f"{base}.2{suffix}", f"{base}.3{suffix}"]
    after = data_files(out_dir)
    assert {name: after[name] for name in kept} == kept  # the earlier run's files, untouched
    assert sorted(after) == sorted(earlier + restarted)
    assert not [name for name in after if name.endswith(LIVE_NAMES)]
