"""dnstap socket source: producers (DNS servers) connect to the listening sockets (dnstap_listen) and send
Frame Streams; this Source accepts them, does each one's handshake (fstrm_session) and hands on their data
frames as DnstapBatch objects, a run per producer.

The bytes are read off the connections by the receiver (dnstap_receive: a C thread that never takes the
interpreter lock), so that the sockets are drained while the worker writes: a producer such as Knot DNS
(libfstrm) drops, without telling anyone, what overflows its queue and the socket's buffer. That buffer is
the producer's (a Unix stream socket has no receive buffer of its own), about 200 KB, and Knot DNS at
10,000 queries per second writes 130 KB every 50 ms. The worker takes the bytes in read(): accepting,
the handshakes and their replies, the frames, all in Python on the worker's thread. The receiver holds up to
RECEIVER_BYTES for the worker; then it stops reading (logged) and the producers drop what overflows.
Measured in docs/dnstap.md.

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

from probe.capture.dnstap_receive import RECV, open_receiver
from probe.capture.fstrm import FrameError
from probe.capture.fstrm_session import DATA, STOPPED, HandshakeRefused, Session
from probe.model import DataFrames, DnstapBatch

ALL = 1 << 62  # no limit on the frames taken
RECEIVER_BYTES = 1 << 25  # bytes the receiver holds for the worker at most (32 MiB: some 12 s of Knot DNS at
# 10,000 queries per second)
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
    __slots__ = ("sock", "fd", "name", "peer", "session", "frames", "end")

    def __init__(self, sock, name, peer):
        self.sock, self.fd, self.name, self.peer = sock, sock.fileno(), name, peer
        self.session = Session()
        self.frames = 0
        self.end = None  # once the producer closed it: 0, or the errno of the error that ended it


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
        self.receiver = open_receiver(RECEIVER_BYTES)
        if not self.receiver.realtime():
            log("dnstap: the producers' connections are read without real-time priority (it needs CAP_SYS_NICE): "
                "on a loaded machine a producer may drop messages")
        self.epoll = select.epoll()  # the Source's fileno(): new connections, bytes received, frames left
        for fd in self.listeners:
            self.epoll.register(fd, select.EPOLLIN)
        self.epoll.register(self.receiver.fileno(), select.EPOLLIN)
        self.again = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # readable while `waiting` is not empty
        self.again_set = False
        self.epoll.register(self.again, select.EPOLLIN)
        self.conns = {}  # fd -> _Connection
        self.by_name = {}
        self.waiting = set()  # fds of connections whose session holds bytes not yet taken as frames
        self.seq = 0
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.stalls = 0
        self._last = None

    def fileno(self):
        return self.epoll.fileno()

    def counters(self):
        return dict(self.counts)

    def producers(self):
        """'name: peer' of each connection now."""
        return [f"{c.name}: {c.peer}" for c in self.conns.values()]

    def read(self, max_frames=4096, timeout=0):
        """The frames received, up to about max_frames, as a DnstapBatch (possibly empty); waits up to timeout
        seconds for something to happen when nothing is waiting."""
        self._close_refused()
        self._poll(0 if self.waiting else timeout)
        skipped = self._receive()
        batch = DnstapBatch()
        room = max_frames
        for fd in list(self.waiting):
            if room <= 0:
                break
            conn = self.conns.get(fd)
            if conn is not None:
                room -= self._take(conn, batch, room)
        if skipped - self.waiting:
            self._receive()  # their bytes, which the receiver will not announce again, for the next read
        self._note_stalls()
        self._set_again()
        self._last = batch
        return batch

    def _poll(self, timeout):
        """Accept the connections that wait; clear the Source's own event."""
        for fd, _ in self.epoll.poll(timeout):
            if fd in self.listeners:
                self._accept(self.listeners[fd])

    def _receive(self):
        """The bytes the receiver holds, into the sessions of the connections whose frames were all taken (the
        others' stay in the receiver, which stops reading when it holds RECEIVER_BYTES: the bound). Returns
        the fds of the others."""
        skipped = set()
        for fd in self.receiver.ready():
            conn = self.conns.get(fd)
            if conn is None:
                continue
            if fd in self.waiting:
                skipped.add(fd)
                continue
            data, ended, error = self.receiver.take(fd)
            if data:
                self.counts["dnstap_bytes"] += len(data)
                conn.session.feed(data)
            if ended:
                conn.end = error
            self.waiting.add(fd)
        return skipped

    def _set_again(self):
        if bool(self.waiting) == self.again_set:
            return
        if self.waiting:
            os.eventfd_write(self.again, 1)
        else:
            os.eventfd_read(self.again)
        self.again_set = bool(self.waiting)

    def _note_stalls(self):
        stalls = self.receiver.stalls()
        if stalls != self.stalls:
            self.stalls = stalls
            self.log(f"dnstap: {RECEIVER_BYTES:,} bytes received wait for the worker; not reading the producers"
                     " until it catches up (they drop what they cannot send)")

    def _close_refused(self):
        """The producers the decoder refused in the last batch: closed (what they sent after is dropped)."""
        last, self._last = self._last, None
        if last is not None and last.refused:
            for name, reason in last.refused.items():
                conn = self.by_name.get(name)
                if conn is not None:
                    self._close(conn, reason)

    def drain(self):
        """Stopping: accept no more, take what every connection has sent so far, close them all."""
        self.receiver.stop()
        self._close_refused()
        for fd, sock in self.listeners.items():
            self.epoll.unregister(fd)
            sock.close()  # this process's copy: the socket stays open for the others until the supervisor's goes
        self.listeners = {}
        batch = DnstapBatch()
        self.waiting.clear()  # everything is taken below
        self._receive()
        for conn in list(self.conns.values()):
            self._recv_rest(conn)
            self._take(conn, batch, ALL)
        for conn in list(self.conns.values()):
            self._close(conn, "dnsprobe is stopping")
        return batch

    def _recv_rest(self, conn):
        """What the connection holds beyond what the (stopped) receiver read."""
        while conn.end is None:
            try:
                data = conn.sock.recv(RECV)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                conn.end = exc.errno
                return
            if not data:
                conn.end = 0
                return
            self.counts["dnstap_bytes"] += len(data)
            conn.session.feed(data)

    def close(self):
        if self.again is None:
            return  # closed already
        self.receiver.stop()
        for conn in list(self.conns.values()):
            self._close(conn, "dnsprobe is stopping")
        self.receiver.close()
        self.epoll.close()
        for sock in self.listeners.values():  # our copy of the inherited descriptor; the socket stays for others
            sock.close()
        self.listeners = {}
        os.close(self.again)
        self.again = None

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
        self.receiver.add(conn.fd)
        self.conns[conn.fd] = conn
        self.by_name[conn.name] = conn
        self.counts["dnstap_connections"] += 1
        self.log(f"dnstap producer {conn.name} connected: {peer}")

    def _take(self, conn, batch, room):
        """Take up to room whole frames from the connection's session into the batch (all of them once it
        ended, then close it); handshake replies sent. Returns the number taken."""
        if conn.end is not None:
            room = ALL
        frames = DataFrames()
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
        if session.ended:  # STOP received and FINISH sent
            self._close(conn, None)
        elif conn.end is not None:
            self._end(conn)
        elif len(frames) < room or not session.reader.pending():
            self.waiting.discard(conn.fd)  # the rest (if any) is less than a frame: wait for more bytes
        return len(frames)

    def _add(self, conn, batch, frames):
        if frames:
            conn.frames += len(frames)
            batch.runs.append((conn.name, frames))

    def _end(self, conn):
        """The producer closed the connection (end 0) or it broke."""
        if conn.end:
            problem = f"connection error: {os.strerror(conn.end)}"
        else:
            problem = conn.session.end_problem()
            if problem is not None and conn.session.reader.pending():
                self.counts["dnstap_truncated"] += 1
            elif problem is None and conn.session.state == DATA:
                problem = "closed without STOP"
        self._close(conn, problem)

    def _close(self, conn, problem):
        if conn.sock is None:
            return
        self.receiver.remove(conn.fd)
        conn.sock.close()
        conn.sock = None
        del self.conns[conn.fd]
        del self.by_name[conn.name]
        self.waiting.discard(conn.fd)
        self.counts["dnstap_disconnections"] += 1
        how = "closed" if problem is None else f"closed: {problem}"
        self.log(f"dnstap producer {conn.name} ({conn.peer}) {how}, after {conn.frames:,} frames")
