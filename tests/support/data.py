"""Where the tests' oracle data is: tests/data (DNS Probe's, compactor's and cryptopANT's files and RFC 8618's
CDDL; its README names each file's source, version and licence)."""

import atexit
import lzma
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DATA = ROOT / "tests" / "data"
# Files stored xz-compressed to keep the repository small, decompressed once per test run into a directory of its
# own, under their upstream names (the tests and DNS Probe's expected files name them so).
_UNPACKED = Path(tempfile.mkdtemp(prefix="dnsprobe-testdata-"))
_OWNER = os.getpid()


@atexit.register
def _remove_unpacked():
    if os.getpid() == _OWNER:  # not a forked child that exits through atexit: the run still reads the files
        shutil.rmtree(_UNPACKED, ignore_errors=True)


def _unpacked(name):
    """tests/data/NAME with its `.xz` files decompressed (the others copied), as a directory of this run."""
    source, dest = DATA / name, _UNPACKED / name
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = path.relative_to(source)
        target = dest / (rel.with_suffix("") if path.suffix == ".xz" else rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".xz":
            target.write_bytes(lzma.decompress(path.read_bytes()))
        else:
            shutil.copyfile(path, target)
    return dest


DNSPROBE_DATA = _unpacked("dns-probe")
CRYPTOPANT_DATA = _unpacked("cryptopant")
COMPACTOR_DATA = DATA / "compactor"  # as compactor ships them: the captures and the gold C-DNS file are xz already
CDNS_CDDL = DATA / "cdns" / "rfc8618-pycddl.cddl"

# Every capture of the oracle data (pcap, pcapng, compressed).
DATA_CAPTURES = sorted(
    p for p in list(DNSPROBE_DATA.rglob("*.pcap*")) + list(COMPACTOR_DATA.rglob("*.pcap*"))
    if not p.name.endswith(".info")
)
