"""The columnar pipeline (message records: decode_into, RecordTable, the record column pass) writes the same
files as the pipeline on message tuples, byte for byte, with the same counters: Parquet and C-DNS, on every
shared capture, the sample, the live-capture test's traffic and the benchmark mix. (Each stage is compared
with its Python reference in tests/decode/test_decoderec.py, tests/match/test_matchrec.py and
tests/export/test_parquetrec.py.)"""

import pytest
from support.captures import columnar_captures
from support.data import ROOT

from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.run.pipeline import Pipeline


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    return columnar_captures(tmp_path_factory.mktemp("columnar"))


def test_columnar_is_the_default():
    assert Pipeline(load_config(), "/nonexistent").columnar
    assert not Pipeline(load_config(overrides={"decode.parser": "wire"}), "/nonexistent").columnar


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


@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_dnstap_midway_hands_over(fmt, tmp_path):
    """A dnstap batch in the middle of packets turns the columnar pipeline into a tuple one (RecordTable.hand_over,
    the TxBatch not yet written as tuples): the files and counters are still those of the tuple pipeline."""
    from support.dnstap import dnstap_frame
    from support.messages import q_dns, r_dns

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
