"""The optional C extensions: the one place that imports them and says when a Python twin runs instead.

Each extension is built with optional=True (setup.py), so a machine without a compiler still installs the
package. Its Python twin then does the work, slower, and dnsprobe says so once per extension: never a
silent fallback. The tests require every core extension to be built (tests/test_architecture.py).
"""

import importlib
import os
import sys
from pathlib import Path

# module → what its Python twin does instead when it is missing
RECORDS_MISSING = "decoding, matching and export (the reference pipeline, on message tuples)"
EXTENSIONS = {
    "probe.capture._pcaprecords": "splitting pcap records",
    "probe.capture._ring": "reading the frames of AF_PACKET ring blocks",
    "probe.capture._dnstaprecv": "reading dnstap producers' connections (by the worker between its batches: "
                                 "a producer such as Knot DNS may drop messages while the worker writes)",
    "probe.decode._fastwire": "walking DNS messages",
    "probe.decode._dnstap": "decoding dnstap messages",
    "probe.decode._tcpstream": "reassembling DNS over TCP streams",
    "export.cdns._cdnsblock": "encoding C-DNS blocks",
    "export._lookup": "the cached lookups of enrichment and client privacy (Arrow's dictionary encoding and a dict)",
    "export.enrich._psl": "the Public Suffix List (the publicsuffixlist package, name by name)",
    "export._topk": "the live top lists' heavy hitters (export.topk, an eviction scans the k counters)",
    "export.enrich._resolvers": "the public resolvers' prefix lists (ipaddress and bisect)",
    "export.parquet._answers": "the answers column (export.answers)",
    # The production pipeline (message records); without any of these the pipeline is the Python reference.
    "probe._records": RECORDS_MISSING,
    "probe.decode._decoderec": RECORDS_MISSING,
    "probe.match._matchrec": RECORDS_MISSING,
    "export.parquet._parquetrec": RECORDS_MISSING,
}
# The extensions of the production pipeline: decode, match and export on message records (probe/run/pipeline.py).
RECORD_EXTENSIONS = ("probe._records", "probe.decode._decoderec", "probe.match._matchrec",
                     "export.parquet._parquetrec", "export.cdns._cdnsblock")
OPTIONAL = {"probe.capture._dpdk": "DPDK capture (built only where libdpdk is found)"}

_said = set()
_errors = {}

# Another build of the extensions to load instead of the package's own (make asan builds them with
# sanitizers into build/asan and sets this for make test-asan). Its own directory, so that the two builds
# never overwrite each other's .so files; an extension missing there is an import error, never a silent
# fall back to the package's own build.
BUILD_DIR_VARIABLE = "DNSPROBE_NATIVE_DIR"


class _BuildDirFinder:
    """Finds the extensions (EXTENSIONS and OPTIONAL) in a build directory, before the package's own: a meta path
    finder (find_spec is all the import system asks of one; importlib.abc would cost every start its import)."""

    def __init__(self, directory):
        self.directory = Path(directory)

    def find_spec(self, name, path=None, target=None):
        if name not in EXTENSIONS and name not in OPTIONAL:
            return None
        import importlib.machinery
        import importlib.util

        *package, module = name.split(".")
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            file = self.directory.joinpath(*package, module + suffix)
            if file.exists():
                return importlib.util.spec_from_file_location(name, file)
        raise ImportError(f"{name} is not built in {self.directory} ({BUILD_DIR_VARIABLE}; make asan builds it there)")


def _use_build_dir():
    directory = os.environ.get(BUILD_DIR_VARIABLE)
    if directory and not any(isinstance(f, _BuildDirFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _BuildDirFinder(directory))


_use_build_dir()


def load(name):
    """The extension module `name`, or None when it was not built (the reason: import_error(name))."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        _errors[name] = str(exc)
        return None


def records_built():
    """Whether every extension of the production pipeline (RECORD_EXTENSIONS) is built; where one is not, the
    pipeline runs the Python reference, and says so once per missing extension."""
    missing = [name for name in RECORD_EXTENSIONS if load(name) is None]
    for name in missing:
        say_not_built(name)
    return not missing


def import_error(name):
    """Why load(name) gave None."""
    return _errors.get(name, "not loaded")


def say_not_built(name, what=None):
    """Log once per process that extension `name` is missing and its twin runs in Python."""
    if name not in _said:
        _said.add(name)
        import logging  # a warning seldom given: no start-up cost

        logging.getLogger("dnsprobe").warning(
            "the C extension %s was not built (no compiler?): %s in Python, slower",
            name, what or EXTENSIONS.get(name, name),
        )
