"""Fixtures shared by every test; helpers are in support.py."""

import pytest
from support import Probe, VethBed


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
