"""dnstap socket source: producers (DNS servers) connect to the listening sockets (dnstap_listen) and send
Frame Streams; this Source accepts them, does each one's handshake (fstrm_session) and hands on their data
frames as DnstapBatch objects, a run per producer.

One epoll object watches the listening sockets and every connection; its descriptor is the Source's
fileno(), so a worker polls it with its other sources. Several workers may hold the same listening
sockets: whichever accepts a connection first serves it until it ends. Each producer is on its own: a
wrong content type is refused in the handshake, a Frame Streams error or a frame that does not decode
(the decoder says so in DnstapBatch.refused) closes that connection alone, logged with the reason and
counted; what it sent before is kept. A producer that stops sends STOP and gets FINISH.
"""

import select
import socket
import struct

from probe.capture.fstrm import FrameError
from probe.capture.fstrm_session import DATA, STOPPED, HandshakeRefused, Session
from probe.model import DataFrames, DnstapBatch

RECV = 1 << 18  # bytes read from a connection at once
ALL = 1 << 62  # no limit on the frames taken
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
        self.conns = {}  # fd -> _Connection
        self.by_name = {}
        self.waiting = set()  # fds of connections holding whole frames not yet taken (a batch was full)
        self.seq = 0
        self.counts = dict.fromkeys(COUNTERS, 0)
        self._last = None

    def fileno(self):
        return self.epoll.fileno()

    def counters(self):
        return dict(self.counts)

    def read(self, max_frames=4096, timeout=0):
        """The frames that arrived, up to about max_frames, as a DnstapBatch (possibly empty)."""
        self._close_refused()
        batch = DnstapBatch()
        room = max_frames
        for fd in list(self.waiting):
            room -= self._take(self.conns[fd], batch, room)
        if room > 0:
            for fd, _ in self.epoll.poll(timeout):
                if fd in self.listeners:
                    self._accept(self.listeners[fd])
                elif fd in self.conns and room > 0:
                    room -= self._receive(self.conns[fd], batch, room)
                elif fd in self.conns:
                    self.waiting.add(fd)  # readable, but the batch is full: next time
        self._last = batch
        return batch

    def drain(self):
        """Stopping: accept no more, take what every connection has sent so far, close them all."""
        for fd, sock in self.listeners.items():
            self.epoll.unregister(fd)
            sock.close()  # this process's copy: the socket stays open for the others until the supervisor's goes
        self.listeners = {}
        self._close_refused()
        batch = DnstapBatch()
        for conn in list(self.conns.values()):
            while conn.sock is not None and self._recv(conn, batch):
                pass
            self._take(conn, batch, ALL)
        for conn in list(self.conns.values()):
            self._close(conn, "dnsprobe is stopping")
        return batch

    def close(self):
        for conn in list(self.conns.values()):
            self._close(conn, "dnsprobe is stopping")
        self.epoll.close()
        for sock in self.listeners.values():  # our copy of the inherited descriptor; the socket stays for others
            sock.close()
        self.listeners = {}

    # -- connections --

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
        frames = DataFrames()
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
        last, self._last = self._last, None
        if last is not None:
            for name, reason in last.refused.items():
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

