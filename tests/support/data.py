"""Where the shared test data is (DNS Probe's and compactor's captures and expected files), and skipping
without it."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SHARED = ROOT.parent / "shared"
DNSPROBE_DATA = SHARED / "data" / "dns-probe"
COMPACTOR_DATA = SHARED / "data" / "compactor"
# The shared data (DNS Probe's and compactor's captures and expected files, the C-DNS CDDL) sits beside the
# checkout in CI; a clone elsewhere may not have it. Tests that read it skip then, saying so (conftest.py marks
# every test whose parameters name a path in it; needs_shared marks the others).
HAVE_SHARED = DNSPROBE_DATA.is_dir() and COMPACTOR_DATA.is_dir()
NO_SHARED = f"needs the shared test data beside the checkout (no {SHARED})"
needs_shared = pytest.mark.skipif(not HAVE_SHARED, reason=NO_SHARED)


def skip_without_shared(*values):
    """Skip the running test, saying why, when a value is a path into the shared data and that is missing."""
    if not HAVE_SHARED and any(isinstance(v, Path) and v.is_relative_to(SHARED) for v in values):
        pytest.skip(NO_SHARED)


def shared_params(paths):
    """Parameters made of files of the shared data: the paths, or one skipped case saying why there are none."""
    if HAVE_SHARED:
        return paths
    return [pytest.param(SHARED / "missing", marks=pytest.mark.skip(reason=NO_SHARED))]


# Every capture of the shared data (pcap, pcapng, compressed).
SHARED_CAPTURES = sorted(
    p for p in list(DNSPROBE_DATA.rglob("*.pcap*")) + list(COMPACTOR_DATA.rglob("*.pcap*"))
    if not p.name.endswith(".info")
)
