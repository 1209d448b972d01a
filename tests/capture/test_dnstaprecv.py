"""The receiver of dnstap producers' connections, driven directly: the C one (probe.capture._dnstaprecv, a thread
without the interpreter lock) and its Python twin (PythonReceiver in probe.capture.dnstap_receive) give the
same bytes in the same order, the end of a connection, the bound; and the C one drains a producer while the
interpreter lock is held, which no Python reader can."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from probe.capture import _dnstaprecv
from probe.capture.dnstap_receive import PythonReceiver

KINDS = {"c": _dnstaprecv.Receiver, "python": PythonReceiver}


@pytest.fixture(params=sorted(KINDS))
def make(request):
    made = []

    def make(max_bytes=1 << 24):
        r = KINDS[request.param](max_bytes)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def take_until(r, fd, want, timeout=10.0):
    """What fd sent, taken until `want` bytes or its end; (bytes, eof, errno, sizes of the takes)."""
    got, sizes, deadline = bytearray(), [], time.monotonic() + timeout
    while True:
        data, eof, error = r.take(fd)
        got += data
        sizes.append(len(data))
        if eof or len(got) >= want:
            return bytes(got), eof, error, sizes
        assert time.monotonic() < deadline, f"{len(got)} of {want} bytes"
        time.sleep(0.002)


def test_bytes_of_several_connections_in_order_and_their_end(make):
    r = make()
    pairs = [socket.socketpair() for _ in range(3)]
    for ours, _ in pairs:
        ours.setblocking(False)
        r.add(ours.fileno())
    sent = [bytearray() for _ in pairs]
    for i in range(200):
        for n, (_, theirs) in enumerate(pairs):
            piece = bytes([n, i % 256]) * (i + 1)
            theirs.sendall(piece)
            sent[n] += piece
    for _, theirs in pairs:
        theirs.close()
    for n, (ours, _) in enumerate(pairs):
        data, eof, error, _ = take_until(r, ours.fileno(), len(sent[n]) + 1)
        assert (data, eof, error) == (bytes(sent[n]), True, 0)
        assert r.take(ours.fileno()) == (b"", True, 0)  # ended: nothing more
        assert ours.fileno() not in r.ready()
        r.remove(ours.fileno())
        ours.close()
    spare = socket.socket()
    with pytest.raises(KeyError):
        r.take(spare.fileno())
    spare.close()


def test_ready_and_fileno_say_what_waits(make):
    r = make()
    ours, theirs = socket.socketpair()
    r.add(ours.fileno())
    with pytest.raises(ValueError):
        r.add(ours.fileno())
    assert r.ready() == []
    theirs.sendall(b"hello")
    deadline = time.monotonic() + 10
    while ours.fileno() not in r.ready():
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert r.take(ours.fileno()) == (b"hello", False, 0)
    theirs.sendall(b"more")
    import select

    assert select.select([r.fileno()], [], [], 10)[0] == [r.fileno()]
    assert take_until(r, ours.fileno(), 4)[:3] == (b"more", False, 0)
    r.remove(ours.fileno())  # then the same fd number, another connection
    ours.close()
    theirs.close()
    a, b = socket.socketpair()
    r.add(a.fileno())
    b.sendall(b"new")
    b.close()
    assert take_until(r, a.fileno(), 4)[:3] == (b"new", True, 0)
    a.close()


def test_the_bound_is_kept_and_nothing_is_lost(make):
    """A producer sends 8 times the bound: the receiver never holds more than the bound, stops reading (the
    C one says so: stalls), and what it gives once taken is every byte, in order."""
    bound = 1 << 16
    r = make(bound)
    ours, theirs = socket.socketpair()
    r.add(ours.fileno())
    payload = os.urandom(8 * bound)
    writer = threading.Thread(target=lambda: (theirs.sendall(payload), theirs.close()))
    writer.start()
    time.sleep(0.3)  # the C thread fills up to the bound, the producer blocks
    data, eof, error, sizes = take_until(r, ours.fileno(), len(payload) + 1, timeout=20)
    writer.join()
    assert (data == payload, eof, error) == (True, True, 0)
    assert max(sizes) <= bound
    if isinstance(r, _dnstaprecv.Receiver):
        assert r.stalls() >= 1
    ours.close()


def test_stop_keeps_what_was_read(make):
    r = make()
    ours, theirs = socket.socketpair()
    r.add(ours.fileno())
    theirs.sendall(b"x" * 1000)
    time.sleep(0.2)
    r.stop()
    theirs.sendall(b"y" * 10)
    data, _, _ = r.take(ours.fileno())
    if isinstance(r, _dnstaprecv.Receiver):  # it stopped reading: the rest is the caller's (as drain() does)
        assert data == b"x" * 1000
        data += ours.recv(100)
    assert data == b"x" * 1000 + b"y" * 10
    r.remove(ours.fileno())
    ours.close()
    theirs.close()


def test_the_c_receiver_reads_while_the_interpreter_lock_is_held():
    """A producer writes 4 MB (some twenty times its socket's buffer) while this thread holds the interpreter
    lock, running Python code with a switch interval of 30 s: no Python thread could read meanwhile; the C
    thread reads it all, so the producer finishes."""
    size = 4 << 20
    r = _dnstaprecv.Receiver(1 << 24)
    ours, theirs = socket.socketpair()
    try:
        r.add(ours.fileno())
        producer = subprocess.Popen(["head", "-c", str(size), "/dev/zero"], stdout=theirs.fileno())
        theirs.close()
        before = sys.getswitchinterval()
        sys.setswitchinterval(30)
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # pure Python: the lock is never released
                pass
        finally:
            sys.setswitchinterval(before)
        assert producer.poll() == 0, "the producer is still blocked on its full socket"
        data, eof, error = r.take(ours.fileno())
        assert (len(data), eof, error) == (size, True, 0)
    finally:
        r.close()
        ours.close()


def test_the_c_receiver_wakes_at_most_once_a_millisecond():
    """A producer writing small frames one after the other, every 0.1 to 0.2 ms: the C thread sleeps a millisecond
    after each read (LINGER_NS), so it reads several writes a wake instead of waking for each one; its voluntary
    context switches (the sleep, and the wait when nothing came meanwhile) are at most two a millisecond. Every
    byte arrives, in order."""
    tasks = set(os.listdir("/proc/self/task"))
    r = _dnstaprecv.Receiver(1 << 24)
    (thread,) = set(os.listdir("/proc/self/task")) - tasks
    ours, theirs = socket.socketpair()

    def switches():
        with open(f"/proc/self/task/{thread}/status") as f:
            return int(next(line for line in f if line.startswith("voluntary_ctxt_switches")).split()[1])

    try:
        r.add(ours.fileno())
        frames = [i.to_bytes(4, "big") * 50 for i in range(2000)]
        before, start = switches(), time.monotonic()
        for frame in frames:
            theirs.sendall(frame)
            time.sleep(0.0001)
        elapsed_ms = (time.monotonic() - start) * 1000
        data, _, _, _ = take_until(r, ours.fileno(), sum(map(len, frames)))
        woke = switches() - before
        assert data == b"".join(frames)
        assert woke <= 2 * elapsed_ms + 20, f"{woke} wakes for {len(frames)} writes in {elapsed_ms:.0f} ms"
    finally:
        r.close()
        ours.close()
        theirs.close()

