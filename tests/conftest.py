"""Fixtures the tests of several stages share (a stage's own are in its folder's conftest.py); helpers are in the
support package."""

import pytest
from support.live import Probe, VethBed


@pytest.fixture
def out_dir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


@pytest.fixture(scope="module")
def testbed():
    bed = VethBed()
    bed.up()
    yield bed
    bed.down()


@pytest.fixture
def probes():
    started = []
    yield lambda *a, **kw: started.append(Probe(*a, **kw)) or started[-1]
    for p in started:
        p.kill()
