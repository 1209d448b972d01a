"""probe.run.forked: `read --workers`' worker processes, forked, their results pickled back through a pipe."""

import os
import socket

from probe.run.forked import Forked


def _results(*values):
    return {"values": values, "pid": os.getpid()}, 0


def test_the_results_come_back_whole_and_the_status_with_them():
    big = "x" * (1 << 20)  # more than a pipe holds: read while it is written
    proc = Forked(_results, (1, big))
    results = proc.receive()
    assert results["values"] == (1, big)
    assert results["pid"] == proc.pid != os.getpid()
    assert proc.ended(wait=True) and proc.exitcode == 0


def _fails():
    raise RuntimeError("worker failed")


def _exits(status):
    os._exit(status)


def test_a_process_that_ends_without_results_says_so_by_its_status(capfd):
    failed = Forked(_fails, ())
    assert failed.receive() is None
    assert failed.ended(wait=True) and failed.exitcode == 1
    assert "RuntimeError: worker failed" in capfd.readouterr().err
    gone = Forked(_exits, (3,))
    assert gone.receive() is None
    assert gone.ended(wait=True) and gone.exitcode == 3


def _still_open(*fds):
    """For each (descriptor, its inode in the parent): whether the process still has it (a closed number may have
    been reused, by the process's /dev/null for its stdin)."""
    def same(fd, inode):
        try:
            return os.fstat(fd).st_ino == inode
        except OSError:
            return False

    return tuple(same(fd, inode) for fd, inode in fds), 0


def test_what_the_parent_holds_of_other_workers_is_closed_in_the_process():
    r, w = os.pipe()
    ours, theirs = socket.socketpair()
    held = [(fd, os.fstat(fd).st_ino) for fd in (r, ours.fileno())]
    try:
        kept = Forked(_still_open, held)
        assert kept.receive() == (True, True)
        closed = Forked(_still_open, held, close=[r, ours])
        assert closed.receive() == (False, False)
        for proc in (kept, closed):
            assert proc.ended(wait=True) and proc.exitcode == 0
    finally:
        for fd in (r, w):
            os.close(fd)
        ours.close()
        theirs.close()
