"""The production pipeline (message records: decode_into, RecordTable, the record column pass, the C-DNS record
loop) writes the same files as the reference pipeline on message tuples, byte for byte, with the same counters:
Parquet and C-DNS, on every shared capture, the sample, the live-capture test's traffic and the benchmark mix;
also the reference where no extension is built at all (an install without a compiler). (Each stage is compared
with its Python reference in tests/decode/test_decoderec.py, tests/match/test_matchrec.py,
tests/export/test_parquetrec.py and tests/export/test_cdnsrec.py.)"""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from support import ROOT, columnar_captures, copy_env

from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.run.pipeline import Pipeline


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    return columnar_captures(tmp_path_factory.mktemp("columnar"))


def test_columnar_is_the_default():
    """The records whatever the DNS parser (the Python decoder's tuples join the MsgBatch); the reference only for
    what the C matcher cannot take (a query timeout beyond its 64-bit time arithmetic)."""
    for parser in ("auto", "fast", "wire", "dpkt"):
        pipeline = Pipeline(load_config(overrides={"decode.parser": parser}), "/nonexistent")
        assert pipeline.columnar and pipeline.exporter.records, parser
    pipeline = Pipeline(load_config(overrides={"match.query_timeout": 1e11}), "/nonexistent")
    assert not pipeline.columnar and not pipeline.exporter.records


@pytest.mark.parametrize("parser", ["wire", "dpkt"])
def test_python_decoders_feed_the_records(captures, parser, tmp_path):
    """decode.parser wire or dpkt: the Python decoder's tuples go into the MsgBatch, matched and written in C; the
    same files and counters as the reference pipeline with that parser."""
    for path in captures[-3:]:  # the sample, the live-capture traffic (TCP too) and the benchmark mix
        outputs = []
        for columnar in (True, False):
            out = tmp_path / f"{path.name}-{parser}-{columnar}"
            out.mkdir()
            cfg = load_config(overrides={"decode.parser": parser, "export.format": "cdns"})
            pipeline = Pipeline(cfg, out, columnar=columnar)
            for frames in read_capture(path, 512):
                pipeline.feed(frames, str(path))
            stats = pipeline.finish()
            outputs.append(([(p.name, p.read_bytes()) for p in sorted(out.iterdir())], stats.as_dict()))
        assert outputs[0][0] and outputs[0] == outputs[1], path.name


# Parquet options that change what the builder is given or what happens to its table afterwards.
OPTIONS = {
    "plain": {},
    "answers-privacy-enrich": {"export.answers": True, "privacy.client_ipv4_prefix": 24,
                               "privacy.client_ipv6_prefix": 48, "enrich.public_resolvers": True,
                               "enrich.public_suffix": True, "export.server_name": "probe1"},
}


@pytest.mark.parametrize("fmt, options", [("parquet", "plain"), ("parquet", "answers-privacy-enrich"),
                                          ("cdns", "plain")])
def test_same_files_and_counters(captures, fmt, options, tmp_path):
    for path in captures:
        outputs = []
        for columnar in (True, False):
            out = tmp_path / f"{path.name}-{columnar}"
            out.mkdir()
            cfg = load_config(overrides={"export.format": fmt, "export.directory": str(out), **OPTIONS[options]})
            pipeline = Pipeline(cfg, out, columnar=columnar)
            assert pipeline.columnar == columnar
            for frames in read_capture(path, 512):
                pipeline.feed(frames, str(path))
            stats = pipeline.finish()
            outputs.append(([(p.name, p.read_bytes()) for p in sorted(out.iterdir())], stats.as_dict()))
        assert outputs[0][0], path.name
        assert outputs[0] == outputs[1], path.name


# The reference pipeline in a process where no extension can be imported: every C extension (probe.native) is
# looked for in an empty directory (DNSPROBE_NATIVE_DIR), as on a machine without a compiler.
WITHOUT_EXTENSIONS = """
import json, sys
from pathlib import Path
from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.native import EXTENSIONS, load
from probe.run.pipeline import Pipeline
assert all(load(name) is None for name in EXTENSIONS)
fmt, *pairs = sys.argv[1:]
for path, out in zip(pairs[::2], pairs[1::2]):
    pipeline = Pipeline(load_config(overrides={"export.format": fmt}), Path(out))
    assert not pipeline.columnar
    for frames in read_capture(path, 512):
        pipeline.feed(frames, path)
    Path(out, "counters.json").write_text(json.dumps(pipeline.finish().as_dict()))
"""


@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_reference_without_extensions_writes_the_same(captures, fmt, tmp_path):
    """The no-compiler fallback: the whole pipeline in Python gives the production pipeline's files (Parquet: equal
    tables; C-DNS: equal bytes) and counters."""
    pairs = []
    for path in captures:
        for side in ("c", "python"):
            (tmp_path / side / path.name).mkdir(parents=True)
        pairs += [path, tmp_path / "python" / path.name]
    empty = tmp_path / "no-extensions"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-c", WITHOUT_EXTENSIONS, fmt, *map(str, pairs)], capture_output=True,
                          text=True, cwd=ROOT, env=copy_env() | {"DNSPROBE_NATIVE_DIR": str(empty)})
    assert proc.returncode == 0, proc.stderr
    assert "probe._records was not built" in proc.stderr
    for path in captures:
        out = tmp_path / "c" / path.name
        pipeline = Pipeline(load_config(overrides={"export.format": fmt}), out)
        assert pipeline.columnar
        for frames in read_capture(path, 512):
            pipeline.feed(frames, str(path))
        counters = pipeline.finish().as_dict()
        ref = tmp_path / "python" / path.name
        assert json.loads((ref / "counters.json").read_text()) == counters, path.name
        files = sorted(p.name for p in out.iterdir())
        assert files and files == sorted(p.name for p in ref.iterdir() if p.name != "counters.json"), path.name
        for name in files:
            if fmt == "parquet":
                assert pq.read_table(out / name).equals(pq.read_table(ref / name)), (path.name, name)
            else:
                assert (out / name).read_bytes() == (ref / name).read_bytes(), (path.name, name)


@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_dnstap_midway_hands_over(fmt, tmp_path):
    """A dnstap batch in the middle of packets turns the columnar pipeline into a tuple one (RecordTable.hand_over,
    the TxBatch not yet written as tuples): the files and counters are still those of the tuple pipeline."""
    from support import dnstap_frame, q_dns, r_dns

    from probe.model import DnstapBatch

    path = ROOT / "samples" / "sample-mix.pcap.xz"
    batches = list(read_capture(path, 256))
    t0 = batches[len(batches) // 2].ts_ns[0]
    dnstap = DnstapBatch([("test", [
        dnstap_frame("CLIENT_QUERY", dns=q_dns(7), ts=t0),
        dnstap_frame("CLIENT_RESPONSE", dns=r_dns(7), ts=t0 + 1000),
        dnstap_frame("CLIENT_QUERY", dns=q_dns(8), ts=t0 + 2000),  # pending at the end
    ])])
    outputs = []
    for columnar in (True, False):
        out = tmp_path / f"{columnar}"
        out.mkdir()
        cfg = load_config(overrides={"export.format": fmt, "export.directory": str(out)})
        pipeline = Pipeline(cfg, out, columnar=columnar)
        for k, frames in enumerate(read_capture(path, 256)):
            if k == len(batches) // 2:
                assert pipeline.table.held > 0  # queries pending when the table is handed over
                pipeline.feed(dnstap, "test")
                assert not pipeline.columnar
            pipeline.feed(frames, str(path))
        stats = pipeline.finish()
        assert stats.matched > 0
        outputs.append(([(p.name, p.read_bytes()) for p in sorted(out.iterdir())], stats.as_dict()))
    assert outputs[0] == outputs[1]
