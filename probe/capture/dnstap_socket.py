"""dnstap socket source: producers (DNS servers) connect to the listening sockets (dnstap_listen) and send
Frame Streams; this Source accepts them, does each one's handshake (fstrm_session) and hands on their data
frames as DnstapBatch objects, a run per producer.

A thread of its own (the reader) does all of that, so that the sockets are drained while the worker
writes: a producer such as Knot DNS (libfstrm) drops, without telling anyone, what overflows its queue
and the socket's buffer. That buffer is the producer's (a Unix stream socket has no receive buffer of its
own: SO_RCVBUF does nothing for it), about 200 KB, and Knot DNS at 10,000 queries per second writes 130 KB
every 50 ms. The reader queues the batches it read for the worker, up to QUEUE_FRAMES frames (then it
stops reading, logged, and the producers drop what overflows), and makes an eventfd readable: the
Source's fileno(), so a worker polls it with its other sources. Measured in docs/dnstap.md.

Several workers may hold the same listening sockets: whichever accepts a connection first serves it until
it ends. Each producer is on its own: a wrong content type is refused in the handshake, a Frame Streams
error or a frame that does not decode (the decoder says so in DnstapBatch.refused) closes that connection
alone, logged with the reason and counted; what it sent before is kept. A producer that stops sends STOP
and gets FINISH.
"""

import os
import select
import socket
import struct
import threading
from collections import deque

from probe.capture.fstrm import FrameError
from probe.capture.fstrm_session import DATA, STOPPED, HandshakeRefused, Session
from probe.model import DnstapBatch

RECV = 1 << 18  # bytes read from a connection at once
ALL = 1 << 62  # no limit on the frames taken
READ_FRAMES = 4096  # frames the reader takes into one batch at most
QUEUE_FRAMES = 1 << 17  # frames queued for the worker at most (about 6 s at 10,000 queries per second, ~40 MB)
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
COUNTERS = ("dnstap_connections", "dnstap_disconnections", "dnstap_refused", "dnstap_frame_errors",
            "dnstap_truncated", "dnstap_bytes")


def _peer(sock):
    """Who connected, for the log: the process of a Unix socket peer, the address of a TCP one."""
    if sock.family != socket.AF_UNIX:
        host, port = sock.getpeername()[:2]
        return f"{host} port {port}"
    try:
        pid, _, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        with open(f"/proc/{pid}/comm") as f:
            return f"{f.read().strip()}, pid {pid}"
    except OSError:
        return "a local process"


class _Connection:
    __slots__ = ("sock", "name", "peer", "session", "frames")

    def __init__(self, sock, name, peer):
        self.sock, self.name, self.peer = sock, name, peer
        self.session = Session()
        self.frames = 0


class DnstapSocketSource:
    """The Source of dnstap producers' connections (probe.capture): read() never returns None."""

    def __init__(self, listeners, max_connections, log, tag="w0"):
        """listeners: listening sockets (inherited, shared with other workers); log: a function of one message
        line; tag: prefix of the producer names (the worker), which are unique per process."""
        self.name = "dnstap"
        self.listeners = {s.fileno(): s for s in listeners}
        self.max_connections = max_connections
        self.log = log
        self.tag = tag
        self.epoll = select.epoll()
        for fd in self.listeners:
            self.epoll.register(fd, select.EPOLLIN)
        self.conns = {}  # fd -> _Connection (the reader's)
        self.by_name = {}
        self.waiting = set()  # fds of connections holding whole frames not yet taken (a batch was full)
        self.seq = 0
        self.counts = dict.fromkeys(COUNTERS, 0)
        self._last = None
        self.refused = set()  # producers the decoder refused: what is queued from them is dropped (the worker's)
        self.to_close = deque()  # (producer, reason) for the reader to close
        self.queue = deque()  # (batch, frames) read and not yet taken by the worker
        self.queued = 0
        self.changed = threading.Condition()  # the queue changed, or the reader must stop
        self.stopping = False
        self.failure = None  # what broke the reader
        self.ready = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # readable while batches are queued
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # wakes the reader from its epoll wait
        self.epoll.register(self.wake, select.EPOLLIN)
        self.reader = threading.Thread(target=self._read_loop, name=f"dnstap reader {tag}", daemon=True)
        self.reader.start()

    def fileno(self):
        return self.ready

    def counters(self):
        return dict(self.counts)

    def producers(self):
        """'name: peer' of each connection now."""
        return [f"{c.name}: {c.peer}" for c in list(self.conns.values())]

    def read(self, max_frames=4096, timeout=0):
        """The frames the reader has queued, up to about max_frames, as a DnstapBatch (possibly empty); waits
        up to timeout seconds for some."""
        self._note_refused()
        if self.failure is not None:
            raise self.failure
        batch = DnstapBatch()
        with self.changed:
            if not self.queue and timeout:
                self.changed.wait(timeout)
            try:
                os.eventfd_read(self.ready)
            except BlockingIOError:
                pass
            self._unqueue(batch, max_frames)
            if self.queue:
                os.eventfd_write(self.ready, 1)
        self._last = batch
        return batch

    def _unqueue(self, batch, max_frames):
        """Queued batches into batch, whole, while it holds fewer than max_frames (the worker's, locked)."""
        taken = 0
        while self.queue and taken < max_frames:
            part, frames = self.queue.popleft()
            taken += frames
            batch.runs += [run for run in part.runs if run[0] not in self.refused]
        self.queued -= taken
        self.changed.notify_all()

    def _note_refused(self):
        """The producers the decoder refused in the last batch: the reader closes them."""
        last, self._last = self._last, None
        if last is not None and last.refused:
            self.refused.update(last.refused)
            self.to_close.extend(last.refused.items())
            os.eventfd_write(self.wake, 1)

    # -- the reader thread --

    def _read_loop(self):
        try:
            self._read_until_stopped()
        except BaseException as exc:  # the worker's next read() raises it
            self.failure = exc
            os.eventfd_write(self.ready, 1)

    def _read_until_stopped(self):
        full = False
        while True:
            with self.changed:
                while self.queued >= QUEUE_FRAMES and not self.stopping:
                    if not full:
                        full = True
                        self.log(f"dnstap: {self.queued:,} frames wait for the worker; not reading the producers"
                                 " until it catches up (they drop what they cannot send)")
                    self.changed.wait()
                full = False
                if self.stopping:
                    return
            self._close_refused()
            batch = self._collect(READ_FRAMES, 0 if self.waiting else -1)
            frames = len(batch)
            if frames:
                with self.changed:
                    self.queue.append((batch, frames))
                    self.queued += frames
                    self.changed.notify_all()
                os.eventfd_write(self.ready, 1)

    def _stop_reader(self):
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        os.eventfd_write(self.wake, 1)
        self.reader.join()

    def _collect(self, max_frames, timeout):
        """The frames that arrived, up to about max_frames."""
        batch = DnstapBatch()
        room = max_frames
        for fd in list(self.waiting):
            room -= self._take(self.conns[fd], batch, room)
        if room > 0:
            for fd, _ in self.epoll.poll(timeout):
                if fd == self.wake:
                    os.eventfd_read(self.wake)
                elif fd in self.listeners:
                    self._accept(self.listeners[fd])
                elif fd in self.conns and room > 0:
                    room -= self._receive(self.conns[fd], batch, room)
                elif fd in self.conns:
                    self.waiting.add(fd)  # readable, but the batch is full: next time
        return batch

    def drain(self):
        """Stopping: the reader stopped, accept no more, take what is queued and what every connection has sent
        so far, close them all."""
        self._stop_reader()
        self._note_refused()
        batch = DnstapBatch()
        with self.changed:
            self._unqueue(batch, ALL)
        for fd, sock in self.listeners.items():
            self.epoll.unregister(fd)
            sock.close()  # this process's copy: the socket stays open for the others until the supervisor's goes
        self.listeners = {}
        self._close_refused()
        for conn in list(self.conns.values()):
            while conn.sock is not None and self._recv(conn, batch):
                pass
            self._take(conn, batch, ALL)
        for conn in list(self.conns.values()):
            self._close(conn, "dnsprobe is stopping")
        return batch

    def close(self):
        if self.ready is None:
            return  # closed already
        if self.reader.is_alive():
            self._stop_reader()
        for conn in list(self.conns.values()):
            self._close(conn, "dnsprobe is stopping")
        self.epoll.close()
        for sock in self.listeners.values():  # our copy of the inherited descriptor; the socket stays for others
            sock.close()
        self.listeners = {}
        os.close(self.ready)
        os.close(self.wake)
        self.ready = self.wake = None

    # -- connections (the reader's) --

    def _accept(self, listener):
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return  # another worker took it
        except OSError as exc:
            self.log(f"dnstap: accept failed: {exc.strerror}")
            return
        self.seq += 1
        peer = _peer(sock)
        if len(self.conns) >= self.max_connections:
            self.counts["dnstap_refused"] += 1
            self.log(f"dnstap producer {peer} refused: {len(self.conns)} connections already "
                     f"(dnstap.max_connections)")
            sock.close()
            return
        sock.setblocking(False)
        conn = _Connection(sock, f"{self.tag}c{self.seq}", peer)
        self.conns[sock.fileno()] = conn
        self.by_name[conn.name] = conn
        self.epoll.register(sock.fileno(), select.EPOLLIN)
        self.counts["dnstap_connections"] += 1
        self.log(f"dnstap producer {conn.name} connected: {peer}")

    def _receive(self, conn, batch, room):
        """Read what the connection sent and take its frames; returns the number taken."""
        if not self._recv(conn, batch):
            return 0
        return self._take(conn, batch, room)

    def _recv(self, conn, batch):
        """One read from the connection into its session; False when there was nothing (at its end, what it
        still held is taken into the batch and it is closed)."""
        try:
            data = conn.sock.recv(RECV)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self._take(conn, batch, ALL)
            self._end(conn, f"connection error: {exc.strerror}")
            return False
        if not data:
            self._take(conn, batch, ALL)
            self._end(conn, None)
            return False
        self.counts["dnstap_bytes"] += len(data)
        conn.session.feed(data)
        return True

    def _take(self, conn, batch, room):
        """Take up to room whole frames from the connection's buffer into the batch; handshake replies sent."""
        if conn.sock is None:
            return 0
        frames = []
        fd = conn.sock.fileno()
        session = conn.session
        started = session.state == DATA
        try:
            reply = session.read(frames, room)
            if reply:
                conn.sock.sendall(reply)
            if not started and session.state in (DATA, STOPPED):
                how = "bidirectional" if session.bidirectional else "unidirectional"
                self.log(f"dnstap producer {conn.name} started ({how} Frame Streams)")
        except HandshakeRefused as exc:
            self.counts["dnstap_refused"] += 1
            self._close(conn, f"refused: {exc}")
            return 0
        except FrameError as exc:
            self.counts["dnstap_frame_errors"] += 1
            self._add(conn, batch, frames)
            self._close(conn, f"Frame Streams error: {exc}")
            return len(frames)
        except OSError as exc:
            self._add(conn, batch, frames)
            # After STOP, a producer that does not wait for our FINISH (Unbound) has simply gone.
            self._close(conn, None if session.ended else f"cannot answer: {exc.strerror}")
            return len(frames)
        self._add(conn, batch, frames)
        if len(frames) >= room and conn.session.reader.pending():
            self.waiting.add(fd)
        else:
            self.waiting.discard(fd)
        if conn.session.ended:  # STOP received and FINISH sent
            self._close(conn, None)
        return len(frames)

    def _add(self, conn, batch, frames):
        if frames:
            conn.frames += len(frames)
            batch.runs.append((conn.name, frames))

    def _end(self, conn, problem):
        """The producer closed the connection (problem None) or it broke."""
        if conn.sock is None:
            return
        if problem is None:
            problem = conn.session.end_problem()
            if problem is not None and conn.session.reader.pending():
                self.counts["dnstap_truncated"] += 1
            elif problem is None and conn.session.state == DATA:
                problem = "closed without STOP"
        self._close(conn, problem)

    def _close_refused(self):
        while self.to_close:
            name, reason = self.to_close.popleft()
            conn = self.by_name.get(name)
            if conn is not None:
                self._close(conn, reason)

    def _close(self, conn, problem):
        if conn.sock is None:
            return
        fd = conn.sock.fileno()
        self.epoll.unregister(fd)
        conn.sock.close()
        conn.sock = None
        del self.conns[fd]
        del self.by_name[conn.name]
        self.waiting.discard(fd)
        self.counts["dnstap_disconnections"] += 1
        how = "closed" if problem is None else f"closed: {problem}"
        self.log(f"dnstap producer {conn.name} ({conn.peer}) {how}, after {conn.frames:,} frames")

