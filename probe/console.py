"""The `dnsprobe` command's entry point (the console script and `python -m probe`), before any import of its own.

pyarrow imports NumPy at its own import when NumPy is installed (as a dependency of matplotlib, pandas, ...), and
nothing the command runs uses it but `bench`'s plot. On this machine kind that import cost each process about a
tenth of a CPU second and 10 MiB: the import itself and OpenBLAS's threads, which spin a while after it starts
them. So, but for `bench`, the command runs with NumPy unimportable (pyarrow, 18 on, goes on without it). The
modules are imported lazily, as the command needs them, so this holds for the whole run and its forked workers.
"""

import sys


def main():
    if sys.argv[1:2] != ["bench"] and "pyarrow" not in sys.modules:
        sys.modules.setdefault("numpy", None)  # an import of it raises ImportError
    from probe.cli import main as command

    return command()
