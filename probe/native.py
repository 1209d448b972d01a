"""The optional C extensions: import one, and say once when its pure-Python twin runs instead.

Each extension (probe._columns, probe._match, probe.sources._pcaprecords, export._cdnsblock;
probe.decode._fastwire through probe.decode.parsers) is built with optional=True, so a machine without a compiler still
installs the package. Its Python twin then does the work, slower, and dnsprobe says so once per
extension: never a silent fallback. The tests require every extension to be built.
"""

import importlib
import logging

_said = set()


def load(name):
    """The extension module `name`, or None when it was not built."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def say_not_built(name, what):
    """Log once per process that extension `name` is missing and `what` runs in Python."""
    if name not in _said:
        _said.add(name)
        logging.getLogger("dnsprobe").warning(
            "the C extension %s was not built (no compiler?): %s in Python, slower", name, what
        )
