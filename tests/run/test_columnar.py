"""The columnar pipeline (message records: decode_into, RecordTable, the record column pass) writes the same
files as the pipeline on message tuples, byte for byte, with the same counters: Parquet and C-DNS, on every
shared capture, the sample, the live-capture test's traffic and the benchmark mix. (Each stage is compared
with its Python reference in tests/decode/test_decoderec.py, tests/match/test_matchrec.py and
tests/export/test_parquetrec.py.)"""

import pytest
from support import columnar_captures

from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.run.pipeline import Pipeline


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    return columnar_captures(tmp_path_factory.mktemp("columnar"))


def test_columnar_is_the_default():
    assert Pipeline(load_config(), "/nonexistent").columnar
    assert not Pipeline(load_config(overrides={"decode.parser": "wire"}), "/nonexistent").columnar


@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_same_files_and_counters(captures, fmt, tmp_path):
    for path in captures:
        outputs = []
        for columnar in (True, False):
            out = tmp_path / f"{path.name}-{columnar}"
            out.mkdir()
            cfg = load_config(overrides={"export.format": fmt, "export.directory": str(out)})
            pipeline = Pipeline(cfg, out, columnar=columnar)
            assert pipeline.columnar == columnar
            for frames in read_capture(path, 512):
                pipeline.feed(frames, str(path))
            stats = pipeline.finish()
            outputs.append(([(p.name, p.read_bytes()) for p in sorted(out.iterdir())], stats.as_dict()))
        assert outputs[0][0], path.name
        assert outputs[0] == outputs[1], path.name
