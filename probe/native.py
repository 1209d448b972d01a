"""The optional C extensions: the one place that imports them and says when a Python twin runs instead.

Each extension is built with optional=True (setup.py), so a machine without a compiler still installs the
package. Its Python twin then does the work, slower, and dnsprobe says so once per extension: never a
silent fallback. The tests require every core extension to be built (tests/test_architecture.py).
"""

import importlib
import logging

# module → what its Python twin does instead when it is missing
EXTENSIONS = {
    "probe.capture._pcaprecords": "splitting pcap records",
    "probe.decode._fastwire": "decoding frames and walking DNS messages",
    "probe.match._match": "matching queries with responses",
    "export.parquet._columns": "building record columns",
    "export.cdns._cdnsblock": "building C-DNS blocks",
}
OPTIONAL = {"probe.capture._dpdk": "DPDK capture (built only where libdpdk is found)"}

_said = set()
_errors = {}


def load(name):
    """The extension module `name`, or None when it was not built (the reason: import_error(name))."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        _errors[name] = str(exc)
        return None


def import_error(name):
    """Why load(name) gave None."""
    return _errors.get(name, "not loaded")


def say_not_built(name, what=None):
    """Log once per process that extension `name` is missing and its twin runs in Python."""
    if name not in _said:
        _said.add(name)
        logging.getLogger("dnsprobe").warning(
            "the C extension %s was not built (no compiler?): %s in Python, slower",
            name, what or EXTENSIONS.get(name, name),
        )
