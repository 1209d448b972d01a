"""The production pipeline (message records: decode_into, RecordTable, the record column pass, the C-DNS record
loop) writes the same files as the reference pipeline on message tuples, byte for byte, with the same counters:
Parquet and C-DNS, on every oracle capture, the sample, the live-capture test's traffic and the benchmark mix, and
with dnstap input among packets;
also the reference where no extension is built at all (an install without a compiler). (Each stage is compared
with its Python reference in tests/decode/test_decoderec.py, tests/match/test_matchrec.py,
tests/export/test_parquetrec.py and tests/export/test_cdnsrec.py.)"""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from support.captures import columnar_captures
from support.data import ROOT
from support.dnsprobe import copy_env

from export.filemeta import FileOrigin
from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.run.pipeline import Pipeline


@pytest.fixture(scope="module")
def captures(traffic_pcap):
    return columnar_captures(traffic_pcap)


def test_columnar_is_the_default():
    """The records whatever the DNS parser (the Python decoder's tuples join the MsgBatch); the reference only for
    what the C matcher cannot take (a query timeout beyond its 64-bit time arithmetic)."""
    for parser in ("auto", "fast", "wire", "dpkt"):
        pipeline = Pipeline(load_config(overrides={"decode.parser": parser}), "/nonexistent")
        assert pipeline.columnar and pipeline.exporter.tx_records, parser
    pipeline = Pipeline(load_config(overrides={"match.query_timeout": 1e11}), "/nonexistent")
    assert not pipeline.columnar and not pipeline.exporter.tx_records


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


# What both pipelines' files record of their run (export.filemeta): the same, though their configurations differ by
# their output directories.
SAME_ORIGIN = FileOrigin(("pcap file",), "0" * 64)

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
            pipeline = Pipeline(cfg, out, columnar=columnar, origin=SAME_ORIGIN)
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


def dnstap_batches(t0):
    """dnstap batches from t0 on: two producers, one without identity; queries and responses of two families,
    responses with their query (logged or not), addresses, ports and transport missing, a query left pending."""
    from support.dnstap import dnstap_frame
    from support.messages import q_dns, r_dns

    from probe.model import DataFrames, DnstapBatch

    batches = []
    for k in range(6):
        ts = t0 + k * 50_000_000
        q, r = 100 + 10 * k, 101 + 10 * k
        batches.append(DnstapBatch([
            ("tap-a", DataFrames.of([
                dnstap_frame("CLIENT_QUERY", dns=q_dns(q), ts=ts, qport=1000 + k),
                dnstap_frame("CLIENT_RESPONSE", dns=r_dns(q), ts=ts + 1000, qport=1000 + k,
                             embedded=q_dns(q) if k % 2 else None),
                dnstap_frame("AUTH_RESPONSE", dns=r_dns(r), ts=ts + 2000, embedded=q_dns(r), protocol="TCP"),
                dnstap_frame("CLIENT_QUERY", dns=q_dns(r + 1), ts=ts + 3000, qaddr=None, raddr=None, family=None,
                             protocol=None, identity=b"id\xff"),
                dnstap_frame("CLIENT_RESPONSE", dns=r_dns(r + 1), ts=ts + 4000, qaddr=None, raddr=None, family=None,
                             protocol=None, identity=b"id\xff"),
            ])),
            ("tap-b", DataFrames.of([
                dnstap_frame("CLIENT_QUERY", dns=q_dns(q), ts=ts + 500, identity=None, qport=None, protocol="DOH"),
                dnstap_frame("CLIENT_RESPONSE", dns=r_dns(q), ts=ts + 900, identity=None, qport=None,
                             protocol="DOH", http_protocol=3),
                dnstap_frame("CLIENT_QUERY", dns=q_dns(r + 2), ts=ts + 950, identity=None),  # pending
            ])),
        ]))
    return batches


@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_dnstap_among_packets_stays_on_records(fmt, tmp_path):
    """dnstap batches among packets: the columnar pipeline stays on message records (the dnstap decoder writes
    them, RecordTable matches them, the exporters take the TxBatch), and writes what the pipeline on message
    tuples writes: the same Parquet table, the same C-DNS bytes, the same counters."""
    import pyarrow.parquet as pq

    from probe import _records
    from probe.match import RecordTable

    path = ROOT / "samples" / "sample-mix.pcap.xz"
    batches = list(read_capture(path, 256))
    middle = len(batches) // 2
    dnstap = dnstap_batches(batches[middle].ts_ns[0])
    outputs = []
    for columnar in (True, False):
        out = tmp_path / f"{columnar}"
        out.mkdir()
        cfg = load_config(overrides={"export.format": fmt, "export.directory": str(out)})
        pipeline = Pipeline(cfg, out, columnar=columnar, origin=SAME_ORIGIN)
        for k, frames in enumerate(read_capture(path, 256)):
            if middle <= k < middle + len(dnstap):
                pipeline.feed(dnstap[k - middle], "tap")
                if columnar:  # still on records
                    assert pipeline.columnar and type(pipeline.table) is RecordTable
                    assert type(pipeline._txs) is _records.TxBatch and type(pipeline._msgs) is _records.MsgBatch
            pipeline.feed(frames, str(path))
        stats = pipeline.finish()
        assert stats.matched > 0 and stats.dnstap_embedded_used > 0
        files = sorted(out.iterdir())
        content = [pq.read_table(p) for p in files] if fmt == "parquet" else [p.read_bytes() for p in files]
        outputs.append(([p.name for p in files], content, stats.as_dict()))
    assert outputs[0][0] == outputs[1][0] and outputs[0][2] == outputs[1][2]
    for a, b in zip(outputs[0][1], outputs[1][1]):
        assert a.equals(b) if fmt == "parquet" else a == b
    if fmt == "parquet":
        table = outputs[0][1][0]
        assert {"auth", "client"} <= set(table.column("dnstap_type").to_pylist())
        assert {"srv", "id\ufffd", None} <= set(table.column("server_identity").to_pylist())
