"""Fixtures shared by every test; helpers are in support.py."""

from pathlib import Path

import pytest
from support.data import HAVE_SHARED, NO_SHARED, SHARED
from support.live import Hugepages, Probe, VethBed


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


@pytest.fixture
def nobody_dir():
    """(uid of the user nobody, a directory under /tmp anyone may write, removed after): for runs as nobody."""
    import pwd
    import shutil
    import tempfile

    try:
        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody'")
    path = Path(tempfile.mkdtemp(prefix="dnsprobe-nobody-", dir="/tmp"))
    path.chmod(0o777)
    yield uid, path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def testbed():
    bed = VethBed()
    bed.up()
    yield bed
    bed.down()


@pytest.fixture(scope="module")
def hugepages():
    """A hugetlbfs with pages reserved for DPDK's multi-process tests (support.Hugepages), removed afterwards."""
    with Hugepages() as huge:
        if huge.skip_reason:
            pytest.skip(huge.skip_reason)
        yield huge


@pytest.fixture
def probes():
    started = []
    yield lambda *a, **kw: started.append(Probe(*a, **kw)) or started[-1]
    for p in started:
        p.kill()
