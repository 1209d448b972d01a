"""Who reads the dnstap producers' connections: the C receiver (probe/capture/_dnstaprecv.c), a thread that
never takes the interpreter lock, so that the sockets are drained while the worker writes; or, where it is not
built, its Python twin, which reads them when the worker asks, between its batches (a producer such as Knot
DNS then drops what its send buffer cannot hold while the worker is away: docs/dnstap.md, Sockets).

Both have the same interface (see _dnstaprecv.c): add(fd), remove(fd), ready() -> [fd], take(fd) ->
(bytes, eof, errno), fileno(), stalls(), realtime(), stop(), close(). The bytes are the same, in the same order; only
when they are read differs.
"""

import errno as errnos
import os
import select
import socket

from probe import native

RECV = 1 << 18  # bytes read from a connection at once


def open_receiver(max_bytes):
    """The C receiver, or the Python twin (said once) where it is not built."""
    recv = native.load("probe.capture._dnstaprecv")
    if recv is None:
        native.say_not_built("probe.capture._dnstaprecv")
        return PythonReceiver(max_bytes)
    return recv.Receiver(max_bytes)


class PythonReceiver:
    """The twin: reads a connection when take() is called, up to max_bytes at a time; nothing in between."""

    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        self.epoll = select.epoll()
        self.socks = {}  # fd -> a socket on a duplicate of it, for recv(MSG_DONTWAIT) whatever its mode
        self.ended = {}  # fd -> the errno that ended it (0: closed by the producer)

    def add(self, fd):
        if fd in self.socks:
            raise ValueError(f"fd {fd} is added already")
        self.epoll.register(fd, select.EPOLLIN)
        self.socks[fd] = socket.socket(fileno=os.dup(fd))

    def remove(self, fd):
        self.socks.pop(fd).close()
        if self.ended.pop(fd, None) is None:
            self.epoll.unregister(fd)

    def ready(self):
        return [fd for fd, _ in self.epoll.poll(0)]

    def take(self, fd):
        sock = self.socks.get(fd)
        if sock is None:
            raise KeyError(f"fd {fd} is not added")
        if fd in self.ended:
            return b"", True, self.ended[fd]
        parts, size, eof, error = [], 0, False, 0
        while size < self.max_bytes:
            asked = min(RECV, self.max_bytes - size)
            try:
                data = sock.recv(asked, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                eof, error = True, exc.errno or errnos.EIO
                break
            if not data:
                eof = True
                break
            parts.append(data)
            size += len(data)
            if len(data) < asked:
                break  # the socket is empty (the C receiver's rule: no recv() that would only say EAGAIN)
        if eof:
            self.epoll.unregister(fd)
            self.ended[fd] = error
        return b"".join(parts), eof, error

    def fileno(self):
        return self.epoll.fileno()

    def realtime(self):
        return False  # no thread: the worker reads at its own priority

    def stalls(self):
        return 0  # it holds nothing: what the worker does not take stays in the socket

    def stop(self):
        pass

    def close(self):
        self.epoll.close()
        for sock in self.socks.values():
            sock.close()
        self.socks.clear()
        self.ended.clear()
