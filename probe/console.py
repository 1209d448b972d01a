"""The `dnsprobe` command's entry point (the console script and `python -m probe`), before any import of its own.

pyarrow imports NumPy at its own import when NumPy is installed (as a dependency of matplotlib, pandas, ...), and
nothing the command runs uses it but the plots of `bench` and `report` (matplotlib). On this machine kind that
import cost each process about a tenth of a CPU second and 10 MiB: the import itself and OpenBLAS's threads, which
spin a while after it starts them. So, but for these two, the command runs with NumPy unimportable (pyarrow, 18
on, goes on without it). The modules are imported lazily, as the command needs them, so this holds for the whole
run and its forked workers.
"""

import sys


def main():
    from probe.timeline import mark

    mark("main")
    if sys.argv[1:2] not in (["bench"], ["report"]) and "pyarrow" not in sys.modules:
        sys.modules.setdefault("numpy", None)  # an import of it raises ImportError
    from probe.cli import main as command

    mark("commands imported")
    return command()


def run():
    """The console script and `python -m probe`: main(), then the process ends without tearing its modules down.
    Everything the command writes is closed when main() returns, and the teardown (pyarrow's objects and modules,
    the rest's) would cost a short read a share of its time. The atexit functions still run and the streams are
    flushed (C's too: the DPDK EAL logs through stdio). With another thread still running, an exit status that is
    not a number, or a stream that cannot be flushed, the usual exit waits, prints or reports."""
    status = main()
    threading = sys.modules.get("threading")
    if (threading is not None and threading.active_count() > 1) or not (status is None or isinstance(status, int)):
        return status
    import atexit
    import os

    from probe.timeline import mark

    mark("exit")
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe or stream
        return status
    ctypes = sys.modules.get("ctypes")
    if ctypes is not None:
        ctypes.CDLL(None).fflush(None)
    os._exit(status or 0)
