"""Reassembly under hostile input: TCP segments and IP fragments crafted to make the decoder hold much
or work much. The bounds are asserted on what is held and on the work done (lines of the reassembly
module executed, counted with sys.settrace), never on seconds: a count is the same on every machine and
every run, and quadratic growth shows as a ratio between two sizes."""

import sys
import tracemalloc

from probe.config import DecodeConfig
from probe.decode import fragments, tcpstream
from probe.decode.fragments import FragmentReassembler
from probe.decode.tcpstream import ACK, TcpReassembler
from probe.stats import Stats

KEY = ("192.0.2.1", 40000, "198.51.100.53", 53)


def lines_run(module, fn):
    """fn() and the number of lines of module's source file that it executed."""
    path, count = module.__file__, 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def call(frame, event, arg):
        return local if frame.f_code.co_filename == path else None

    sys.settrace(call)
    try:
        result = fn()
    finally:
        sys.settrace(None)
    return result, count


def overlapping_tcp_gap(n, max_segments):
    """1 byte at S, then n 3-byte segments at S+2, S+4, ... (each overlapping the next) held ahead of the
    gap at S+1, then the 2 bytes that fill it. Returns (reassembler, stats, lines run by the last segment)."""
    stats = Stats()
    tcp = TcpReassembler(60 * 10**9, 10, 1 << 30, max_segments, stats)
    s = 1_000_000
    tcp.segment(KEY, 1, 60, 64, s, ACK, b"\x00")
    for i in range(n):
        tcp.segment(KEY, 2 + i, 60, 64, s + 2 + 2 * i, ACK, b"\x10\x10\x10")
    _, work = lines_run(tcpstream, lambda: tcp.segment(KEY, 10**6, 60, 64, s + 1, ACK, b"\x10\x10"))
    return tcp, stats, work


def test_tcp_gap_fill_work_grows_linearly_with_held_segments():
    # A rescan of every held segment per released one made this quadratic (N = 16,000: 11.8 s of CPU for one
    # frame); from sorted order each release is a few lines whatever the overlaps.
    n = 400
    tcp, stats, work = overlapping_tcp_gap(n, 1 << 30)
    tcp2, _, work2 = overlapping_tcp_gap(2 * n, 1 << 30)
    assert work2 < 2.5 * work, (work, work2)
    assert work < 40 * n, work
    # Everything was released: nothing held, the stream is at the end of the last segment.
    assert not tcp.flows[KEY].ooo and tcp.flows[KEY].ooo_bytes == 0
    assert tcp.flows[KEY].next_seq == 1_000_000 + 2 + 2 * (n - 1) + 3
    assert stats.tcp_out_of_order == n and stats.tcp_ooo_dropped == 0


def test_tcp_held_segments_are_capped_and_counted():
    default = DecodeConfig().tcp_max_ooo_segments
    n = default + 100
    stats = Stats()
    tcp = TcpReassembler(60 * 10**9, 10, 1 << 30, default, stats)
    tcp.segment(KEY, 1, 60, 64, 5000, ACK, b"\x00")
    for i in range(n):
        tcp.segment(KEY, 2 + i, 60, 64, 5002 + 2 * i, ACK, b"\x10\x10\x10")
        assert len(tcp.flows[KEY].ooo) <= default
    assert stats.tcp_out_of_order == default
    assert stats.tcp_ooo_dropped == n - default
    assert stats.tcp_dropped_bytes == 3 * (n - default)


def test_tcp_byte_bound_drops_are_counted_as_segments_too():
    stats = Stats()
    tcp = TcpReassembler(60 * 10**9, 10, 10, 100, stats)
    tcp.segment(KEY, 1, 60, 64, 5000, ACK, b"\x00")
    for i in range(5):
        tcp.segment(KEY, 2 + i, 60, 64, 5010 + 10 * i, ACK, b"\x10" * 4)
    assert stats.tcp_out_of_order == 2 and tcp.flows[KEY].ooo_bytes == 8
    assert (stats.tcp_ooo_dropped, stats.tcp_dropped_bytes) == (3, 12)


def test_tcp_bytes_over_all_streams_are_bounded():
    """Connections that never finish a message: each holds a message in progress (up to 65,537 bytes) and
    segments ahead of a gap, so the per-direction bounds alone allowed tcp_max_streams times a third of a
    megabyte (32 GiB with the defaults). decode.tcp_max_bytes bounds them all: the oldest directions go first,
    counted in tcp_evicted and tcp_dropped_bytes; a complete message on a stream after them still decodes."""
    stats = Stats()
    bound = 100_000
    tcp = TcpReassembler(60 * 10**9, 10**6, 1 << 20, 256, stats, max_bytes=bound)
    part = b"\xff\xff" + bytes(998)  # 1,000 bytes of a message of 65,535
    for i in range(500):
        key = ("192.0.2.1", 1024 + i, "198.51.100.53", 53)
        tcp.segment(key, i, 1054, 64, 999, 0x02, b"")
        tcp.segment(key, i, 1054, 64, 1000, ACK, part)
        tcp.segment(key, i, 1054, 64, 3000, ACK, bytes(500))  # ahead of a gap
        assert tcp.held == sum(len(f.buf) + f.ooo_bytes for f in tcp.flows.values()) <= bound
    assert len(tcp.flows) == bound // 1500
    assert stats.tcp_evicted == 500 - len(tcp.flows) and stats.tcp_dropped_bytes == 1500 * stats.tcp_evicted
    assert [k[1] for k in tcp.flows] == list(range(1024 + 500 - len(tcp.flows), 1024 + 500))  # the newest kept
    msg = b"\x00\x0c" + bytes(12)
    tcp.segment(KEY, 10**6, 60, 64, 99, 0x02, b"")
    assert [m[0] for m in tcp.segment(KEY, 10**6, 60, 64, 100, ACK, msg)] == [msg[2:]]
    tcp.flush()
    assert tcp.held == 0


def test_tcp_stream_count_bound_is_counted():
    stats = Stats()
    tcp = TcpReassembler(60 * 10**9, 3, 1 << 20, 256, stats)
    for i in range(5):
        tcp.segment(("192.0.2.1", 1024 + i, "198.51.100.53", 53), i, 60, 64, 1000, ACK, b"\x00\x20ab")
    assert len(tcp.flows) == 3 and stats.tcp_evicted == 2 and stats.tcp_dropped_bytes == 8


def test_tcp_held_segments_keep_their_sequence_numbers_when_a_syn_moves_the_stream():
    # Held segments are ordered by stream offset; a SYN that moves the stream (here the addresses and
    # ports reused by a new connection after a complete message) moves the offsets with it, so a segment
    # held by sequence number is released where that number falls in the new stream.
    stats = Stats()
    tcp = TcpReassembler(60 * 10**9, 10, 1 << 16, 16, stats)
    msg1, msg2 = b"\x00\x0c" + bytes(12), b"\x00\x0c" + bytes(range(1, 13))
    tcp.segment(KEY, 1, 60, 64, 999, 0x02, b"")  # SYN: data from 1000
    assert [m[0] for m in tcp.segment(KEY, 2, 60, 64, 1000, ACK, msg1)] == [msg1[2:]]
    tcp.segment(KEY, 3, 60, 64, 2004, ACK, msg2[4:])  # ahead of a gap
    tcp.segment(KEY, 4, 60, 64, 1999, 0x02, b"")  # SYN of the next connection: data from 2000
    out = tcp.segment(KEY, 5, 60, 64, 2000, ACK, msg2[:4])
    assert [m[0] for m in out] == [msg2[2:]]
    assert stats.tcp_out_of_order == 1 and stats.tcp_retransmitted == 0


def fragment_flood(frags, n, size, step):
    """The last fragment of a datagram, then n fragments of `size` bytes at offsets 0, step, 2*step, ...
    (overlapping when size > step), all but the 8 bytes before the last fragment. Returns the datagram's
    key, its payload and the fragment that completes it."""
    last = (n - 1) * step + size + 8
    total = last + size
    payload = bytes(i * 7 % 251 for i in range(total))
    key = (4, b"\xc0\x00\x02\x01", b"\xc6\x33\x64\x35", 17, 4242)
    assert frags.add(key, 1, size + 34, last, False, payload[last:], 64, None) is None
    for i in range(n):
        assert frags.add(key, 2 + i, size + 34, step * i, True, payload[step * i : step * i + size], 64, None) is None
    return key, payload, (last - 8, payload[last - 8 : last])


def test_fragment_work_grows_linearly_with_overlapping_fragments():
    # Once the pieces added up to the total, every fragment re-sorted them all (quadratic: 8,190 fragments
    # cost 0.59 s); with held ranges a fragment is a few lines whatever came before.
    def work(n):
        frags = FragmentReassembler(5 * 10**9, 10, 1 << 30, Stats())
        return lines_run(fragments, lambda: fragment_flood(frags, n, 16, 8))[1]

    n = 300
    assert work(2 * n) < 2.5 * work(n), (work(n), work(2 * n))
    assert work(n) < 60 * n


def test_overlapping_fragments_hold_at_most_one_datagram_of_bytes():
    # 7,800 fragments of 1,480 bytes, each overlapping the next: all kept, they held 11.8 MB for a datagram
    # of at most 65,535. The bytes held are measured with tracemalloc (the allocator's own count).
    stats = Stats()
    frags = FragmentReassembler(5 * 10**9, 10, 1 << 30, stats)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        key, payload, (gap, filler) = fragment_flood(frags, 7800, 1480, 8)
        held = tracemalloc.get_traced_memory()[0] - before - sys.getsizeof(payload)
    finally:
        tracemalloc.stop()
    assert held < 2 * 65535, held
    # The missing 8 bytes complete the datagram.
    done = frags.add(key, 9000, 42, gap, True, filler, 64, None)
    assert done is not None and done[0] == payload
    assert stats.fragments == 7802 and stats.fragments_reassembled == 1 and stats.fragments_dropped == 0
    assert frags.held_bytes == 0


def test_fragment_bytes_bound_drops_the_oldest_datagram_and_counts_it():
    stats = Stats()
    frags = FragmentReassembler(5 * 10**9, 10, 90_000, stats)
    for ident in range(3):  # 48,000 bytes each held ahead of a gap: 2 are over 90,000
        key = (4, b"\x01\x02\x03\x04", b"\x05\x06\x07\x08", 17, ident)
        for off in range(8, 48_000, 1480):
            frags.add(key, 1, 1514, off, True, bytes(min(1480, 48_000 - off)), 64, None)
        assert frags.held_bytes <= 90_000
    assert [k[-1] for k in frags.pending] == [2]
    assert stats.fragments_dropped == 2 * len(range(8, 48_000, 1480))


def test_duplicate_and_contained_fragments_are_dropped_and_counted():
    stats = Stats()
    frags = FragmentReassembler(5 * 10**9, 10, 1 << 20, stats)
    key = (6, b"a" * 16, b"b" * 16, 17, 7)
    assert frags.add(key, 1, 100, 0, True, b"A" * 24, 64, None) is None
    assert frags.add(key, 2, 100, 0, True, b"B" * 24, 64, None) is None  # duplicate
    assert frags.add(key, 3, 100, 8, True, b"C" * 8, 64, None) is None  # inside what is held
    done = frags.add(key, 4, 100, 16, False, b"D" * 16, 64, None)  # overlaps by 8, ends the datagram
    assert done[:3] == (b"A" * 24 + b"D" * 8, 1, 200)
    assert (stats.fragments, stats.fragments_dropped, stats.fragments_reassembled) == (4, 2, 1)
    assert frags.held_bytes == 0 and not frags.pending
