"""A worker process made with os.fork whose results come back pickled through a pipe: `dnsprobe read --workers`' read
workers (probe.run.offline). Not multiprocessing: its import (with subprocess, tempfile, shutil, ...), a few
milliseconds, and its start of each process would be start-up that the workers do not divide (docs/performance.md)."""

import os
import pickle
import socket
import sys


class Forked:
    """A forked process running target(*args), which returns (results, exit status): the results go to the parent
    (receive), the process ends with the status, without tearing its modules down. close: what the parent holds that
    the process must not keep (sockets, file descriptors: the ends of other workers' pipes)."""

    __slots__ = ("pid", "results", "exitcode")

    def __init__(self, target, args, close=()):
        receive, send = os.pipe()
        _flush_streams()  # (or what they hold would be written twice)
        pid = os.fork()
        if pid == 0:
            os.close(receive)
            _run(target, args, send, close)
        os.close(send)
        self.pid = pid
        self.results = receive
        self.exitcode = None

    def ended(self, wait=False):
        """Whether the process has ended (wait: wait for it), its exit status then in exitcode."""
        if self.exitcode is None:
            pid, status = os.waitpid(self.pid, 0 if wait else os.WNOHANG)
            if pid:
                self.exitcode = os.waitstatus_to_exitcode(status)
        return self.exitcode is not None

    def receive(self):
        """The results, read to the end of the pipe (the process closes it as it ends); None when it ended without
        sending them. An interrupt while waiting is the caller's to pass on (the process still sends its results)."""
        chunks = []
        while True:
            try:
                chunk = os.read(self.results, 1 << 16)
            except KeyboardInterrupt:
                continue
            if not chunk:
                break
            chunks.append(chunk)
        os.close(self.results)
        return pickle.loads(b"".join(chunks)) if chunks else None


def _run(target, args, send, close):
    """The forked process: target(*args), its results into the pipe `send`; never returns. Its stdin goes to
    /dev/null (an input read from stdin is the parent's to read), and the streams are flushed before it ends."""
    status = 1
    try:
        for other in close:
            if isinstance(other, socket.socket):
                other.close()
            else:
                os.close(other)
        _stdin_to_devnull()
        results, status = target(*args)
        _send(send, results)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # noqa: BLE001 - said on stderr; the parent sees a process that sent no results
        import traceback

        traceback.print_exc()
    finally:
        _flush_streams()
        os._exit(status)


def _send(fd, results):
    data = memoryview(pickle.dumps(results))
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _stdin_to_devnull():
    if sys.stdin is None:
        return
    try:
        sys.stdin.close()
        sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin while it lives
    except (OSError, ValueError):
        pass


def _flush_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
