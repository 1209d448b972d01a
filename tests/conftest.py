"""Fixtures the tests of several stages share (a stage's own are in its folder's conftest.py); helpers are in the
support package."""

from pathlib import Path

import pytest
from support.data import HAVE_SHARED, NO_SHARED, SHARED
from support.live import Probe, VethBed


def _names_shared(value):
    if isinstance(value, Path):
        return value.is_relative_to(SHARED)
    if isinstance(value, (list, tuple)):
        return any(_names_shared(v) for v in value)
    return False


def pytest_collection_modifyitems(config, items):
    """Without the shared data, a test whose parameters name a file in it is skipped with the reason."""
    if HAVE_SHARED:
        return
    skip = pytest.mark.skip(reason=NO_SHARED)
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(_names_shared(v) for v in params.values()):
            item.add_marker(skip)


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
