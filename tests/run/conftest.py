"""Fixtures of the tests of running the pipeline (live capture, DPDK)."""

from pathlib import Path

import pytest
from support.live import Hugepages


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
def hugepages():
    """A hugetlbfs with pages reserved for DPDK's multi-process tests (support.live.Hugepages), removed afterwards."""
    with Hugepages() as huge:
        if huge.skip_reason:
            pytest.skip(huge.skip_reason)
        yield huge
