"""The TCP stream step's C twin (probe/decode/_tcpstream.c) against the Python reference (tcpstream.py): the same
random segment sequences through both, and after every call the same messages, counters, bytes held and state of
each direction. The sequences mix handshakes (RTT), TCP Fast Open, RST, FIN, retransmissions, overlaps, gaps,
midstream starts, sequence numbers about to wrap, summed frame lengths over 2^31, and bounds small enough that
every drop path runs (the test checks that each counter moved)."""

import random

import pytest

from probe.config import DecodeConfig
from probe.decode import tcpstream
from probe.decode.packets import PacketDecoder
from probe.native import load
from probe.stats import Stats

_tcpstream = load("probe.decode._tcpstream")
pytestmark = pytest.mark.skipif(_tcpstream is None, reason="probe.decode._tcpstream is not built")

SYN, ACK, FIN, RST = tcpstream.SYN, tcpstream.ACK, tcpstream.FIN, tcpstream.RST
COUNTERS = ("tcp_segments", "tcp_streams", "tcp_evicted", "tcp_dropped_bytes", "tcp_retransmitted", "tcp_out_of_order",
            "tcp_ooo_dropped", "tcp_resync", "lengths_capped")


def typed(value):
    """value with the type of each part, so that == compares types too (1 != 1.0 != True here)."""
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(typed(v) for v in value)
    return type(value).__name__, value


class Pair:
    """The two twins driven together; every call checks that they agree."""

    def __init__(self, *bounds, max_bytes=None):
        self.py_stats, self.c_stats = Stats(), Stats()
        self.py = tcpstream.TcpReassembler(*bounds, self.py_stats, max_bytes=max_bytes)
        self.c = _tcpstream.TcpReassembler(*bounds, self.c_stats, max_bytes=max_bytes)
        self.calls = 0

    def check(self, what, a, b):
        self.calls += 1
        assert typed(a) == typed(b), f"call {self.calls} {what}: outputs differ"
        assert self.c_stats.as_dict() == self.py_stats.as_dict(), f"call {self.calls} {what}: counters differ"
        assert self.c.held == self.py.held, f"call {self.calls} {what}: held differs"
        assert self.c.flow_count == self.py.flow_count
        assert typed(self.c.flows_state()) == typed(self.py.flows_state()), f"call {self.calls} {what}: state differs"

    def segment(self, *args):
        out = self.c.segment(*args)
        self.check(("segment", args), out, self.py.segment(*args))
        return out

    def expire(self, now):
        self.check(("expire", now), self.c.expire(now), self.py.expire(now))

    def flush(self):
        self.check("flush", self.c.flush(), self.py.flush())


def framed_stream(rng, n):
    """n bytes of DNS-over-TCP stream: length-prefixed messages, some shorter than a header (as midstream data
    looks), one now and then long."""
    out = bytearray()
    while len(out) < n:
        size = rng.choice((0, 3, 11, 12, 20, 40, rng.randrange(200), rng.randrange(2000)))
        out += size.to_bytes(2, "big") + bytes(rng.randrange(256) for _ in range(size))
    return bytes(out[:n])


class Direction:
    def __init__(self, rng, key):
        self.key = key
        # an ISN near the wrap now and then
        self.isn = rng.choice((rng.randrange(1 << 32), (1 << 32) - rng.randrange(1, 3000), 0xFFFFFFFF))
        self.stream = framed_stream(rng, rng.choice((64, 600, 5000)))
        self.sent = 0

    def seq(self, offset):
        return (self.isn + 1 + offset) % (1 << 32)


def random_run(seed):
    rng = random.Random(seed)
    bounds = (rng.choice((50, 10**9)), rng.choice((1, 2, 3, 8)), rng.choice((0, 10, 64, 1000, 1 << 20)),
              rng.choice((0, 1, 3, 16)))
    pair = Pair(*bounds, max_bytes=rng.choice((None, 50, 300, 5000)))
    conns = []
    for i in range(rng.choice((1, 2, 4))):
        v6 = rng.random() < 0.3
        client = bytes([0x20, 1, 0xD, 0xB8] + [0] * 11 + [i]) if v6 else bytes([192, 0, 2, i])
        server = bytes([0x20, 1, 0xD, 0xB8] + [0] * 11 + [0x35]) if v6 else bytes([198, 51, 100, 53])
        port = 40000 + i
        conns.append((Direction(rng, (client, port, server, 53)), Direction(rng, (server, 53, client, port))))
    ts = 1_000_000_000
    for _ in range(rng.choice((20, 100, 300))):
        ts += rng.choice((0, 1, 7, 1000, 10**6, 10**8))
        ident = rng.randrange(len(conns))
        client, server = conns[ident]
        d = rng.choice((client, server))
        wirelen = rng.choice((60, 1500, 1 << 30, (1 << 31) - 10))
        ttl = rng.choice((64, 128, 255))
        r = rng.random()
        if r < 0.08:  # SYN from the client (sometimes with data: TCP Fast Open), SYN/ACK from the server
            d = client if rng.random() < 0.6 else server
            flags = SYN if d is client else SYN | ACK
            payload = d.stream[: rng.randrange(1, 40)] if rng.random() < 0.3 else b""
            pair.segment(d.key, ts, wirelen, ttl, d.isn, flags, payload)
            d.sent = max(d.sent, len(payload))
        elif r < 0.12:  # RST, sometimes with data
            payload = d.stream[d.sent : d.sent + rng.randrange(20)] if rng.random() < 0.5 else b""
            pair.segment(d.key, ts, wirelen, ttl, d.seq(d.sent), RST | rng.choice((0, ACK)), payload)
        elif r < 0.15:  # FIN, sometimes with data
            payload = d.stream[d.sent : d.sent + rng.randrange(20)]
            pair.segment(d.key, ts, wirelen, ttl, d.seq(d.sent), FIN | ACK, payload)
            d.sent += len(payload)
        elif r < 0.17:
            pair.expire(ts + rng.choice((0, 40, 10**9)))
        elif r < 0.19:  # anything at any sequence number
            payload = bytes(rng.randrange(256) for _ in range(rng.randrange(30)))
            pair.segment(d.key, ts, wirelen, ttl, rng.randrange(1 << 32), rng.randrange(0x20), payload)
        else:  # data: in order mostly, else retransmitted, overlapping or ahead of a gap
            kind = rng.random()
            start = d.sent
            if kind < 0.15:
                start = max(0, d.sent - rng.randrange(1, 60))
            elif kind < 0.35:
                start = d.sent + rng.randrange(1, 80)
            length = rng.choice((0, 1, 2, 5, 30, 300, 1400))
            payload = d.stream[start : start + length]
            flags = ACK if rng.random() < 0.9 else 0
            pair.segment(d.key, ts, wirelen, ttl, d.seq(start), flags, payload)
            if kind >= 0.15 and kind < 0.35 and rng.random() < 0.5:
                pass  # the gap stays for now
            elif start <= d.sent:
                d.sent = max(d.sent, start + len(payload))
    pair.flush()
    return pair


def test_c_twin_agrees_with_python_on_random_segment_sequences():
    totals = dict.fromkeys(COUNTERS, 0)
    messages = 0
    for seed in range(400):
        pair = random_run(seed)
        for name in COUNTERS:
            totals[name] += getattr(pair.c_stats, name)
        messages += pair.calls
    # Every rule ran somewhere (else a path of the C code would go untested here).
    assert all(totals.values()), totals


def test_handshake_rtt_tfo_and_messages_over_segments():
    pair = Pair(60 * 10**9, 10, 1 << 16, 16)
    c, s = (b"\xc0\x00\x02\x01", 40000, b"\xc6\x33\x64\x35", 53), (b"\xc6\x33\x64\x35", 53, b"\xc0\x00\x02\x01", 40000)
    q = b"\x00\x0e" + bytes(range(14))
    out = pair.segment(c, 1_000, 74, 64, 0xFFFFFFFE, SYN, q[:5])  # TFO, its data across the wrap
    assert out == []
    pair.segment(s, 3_500_000, 74, 60, 7, SYN | ACK, b"")
    out = pair.segment(c, 5_001_000, 66, 64, 4, ACK, q[5:])
    assert out == [(q[2:], 1_000, 74 + 66, 64, 5.0)]
    out = pair.segment(s, 6_000_000, 80, 60, 8, ACK, q + q[:3])
    assert out == [(q[2:], 6_000_000, 80, 60, 5.0)]
    pair.flush()
    assert pair.c_stats.tcp_dropped_bytes == 3


def test_summed_wirelen_is_capped_and_counted():
    pair = Pair(60 * 10**9, 10, 1 << 16, 16)
    key = (b"\x01\x02\x03\x04", 1, b"\x05\x06\x07\x08", 53)
    pair.segment(key, 1, 1 << 31, 64, 99, SYN, b"")
    pair.segment(key, 2, 1 << 31, 64, 100, ACK, b"\x00\x0c" + bytes(4))
    out = pair.segment(key, 3, 1 << 31, 64, 106, ACK, bytes(8) + b"\x00\x0c" + bytes(12))
    # (The second message, begun in the last segment, counts that segment's frame alone: capped too.)
    assert [m[2] for m in out] == [(1 << 31) - 1] * 2 and pair.c_stats.lengths_capped == 2


def test_a_message_begun_in_a_segment_counts_that_segments_frame_only():
    """A message's wirelen is summed over the frames of its own segments (the `len` and `res_len` columns): one
    that begins in the segment which ends the previous message counts that segment's frame, not the previous
    message's sum (it did, in both twins, until 4 December)."""
    pair = Pair(60 * 10**9, 10, 1 << 16, 16)
    key = (b"\x01\x02\x03\x04", 1, b"\x05\x06\x07\x08", 53)
    pair.segment(key, 1, 60, 64, 99, SYN, b"")
    assert pair.segment(key, 2, 100, 64, 100, ACK, b"\x00\x0c" + bytes(4)) == []
    out = pair.segment(key, 3, 200, 64, 106, ACK, bytes(8) + b"\x00\x0c" + bytes(12) + b"\x00\x0c" + bytes(5))
    assert [m[2] for m in out] == [300, 200]
    (last,) = pair.segment(key, 4, 150, 64, 135, ACK, bytes(7))
    assert last[2] == 200 + 150  # begun in the third segment, ended in the fourth


def test_addresses_of_other_lengths_are_other_keys():
    pair = Pair(60 * 10**9, 10, 1 << 16, 16)
    for src in (b"\x01", b"\x01\x00", b"", bytes(16)):
        pair.segment((src, 1, b"\x02", 53), 1, 60, 64, 5, ACK, b"\x00\x20")
    assert pair.c.flow_count == 4


@pytest.mark.parametrize("args, error", [
    (((b"a", 1, b"b"), 1, 60, 64, 1, ACK, b""), TypeError),
    ((("a", 1, b"b", 2), 1, 60, 64, 1, ACK, b""), TypeError),
    (((b"a" * 17, 1, b"b", 2), 1, 60, 64, 1, ACK, b""), TypeError),
    (((b"a", 70000, b"b", 2), 1, 60, 64, 1, ACK, b""), ValueError),
    (((b"a", 1, b"b", -2), 1, 60, 64, 1, ACK, b""), ValueError),
    (((b"a", 1, b"b", 2), 1, 60, 64, 1 << 32, ACK, b""), ValueError),
    (((b"a", 1, b"b", 2), 1, -1, 64, 1, ACK, b""), ValueError),
    (((b"a", 1, b"b", 2), 1.0, 60, 64, 1, ACK, b""), TypeError),
    (((b"a", 1, b"b", 2), 1, 60, 64, 1, ACK, bytearray(b"x")), TypeError),
    (((b"a", 1, b"b", 2), 1 << 64, 60, 64, 1, ACK, b""), OverflowError),
])
def test_c_twin_refuses_what_the_probe_never_passes(args, error):
    stats = Stats()
    tcp = _tcpstream.TcpReassembler(10**9, 10, 100, 10, stats)
    with pytest.raises(error):
        tcp.segment(*args)
    assert tcp.flow_count == 0 and stats.tcp_segments == 0
    with pytest.raises(ValueError):
        _tcpstream.TcpReassembler(10**9, 0, 100, 10, stats)


def test_stats_errors_are_raised_and_an_error_first_is_kept():
    class Frozen:
        def __setattr__(self, name, value):
            raise RuntimeError(name)

        def __getattr__(self, name):
            return 0

    tcp = _tcpstream.TcpReassembler(10**9, 10, 100, 10, Frozen())
    with pytest.raises(RuntimeError, match="tcp_segments"):
        tcp.segment((b"a", 1, b"b", 2), 1, 60, 64, 1, ACK, b"\x00\x20")
    assert tcp.held == 2  # the step itself was done
    with pytest.raises(RuntimeError, match="tcp_dropped_bytes"):
        tcp.flush()
    assert tcp.held == 0


def test_decoder_uses_the_c_twin_with_the_c_parser_only():
    cfg = DecodeConfig()
    assert isinstance(PacketDecoder(cfg, {53}, Stats()).tcp, _tcpstream.TcpReassembler)
    for parser in ("wire", "dpkt"):
        cfg = DecodeConfig(parser=parser)
        assert isinstance(PacketDecoder(cfg, {53}, Stats()).tcp, tcpstream.TcpReassembler)



def test_frame_loops_call_the_c_step_directly():
    """With the C parser the frame loop gets (TcpReassembler, on_reset), not the Python _tcp_step; anything else in a
    pair is refused before a frame is read. (test_decoderec.py's records-against-wire tests compare the messages,
    counters and RST address events of this path with the Python one on every capture.)"""
    from probe._records import Frames, MsgBatch
    from probe.decode import _decoderec

    decoder = PacketDecoder(DecodeConfig(), {53}, Stats())
    assert decoder._c_tcp == (decoder.tcp, decoder._reset_seen)
    frames = Frames()
    frames.add(bytes(60), 1, 60)
    python_twin = tcpstream.TcpReassembler(1, 1, 1, 1, Stats())
    for bad in ((object(), print), (decoder.tcp, 1), (decoder.tcp,), (python_twin, print)):
        with pytest.raises(TypeError, match="pair"):
            _decoderec.decode_packed(frames, 0, MsgBatch(), decoder._portmap, None, None, [0] * 5, bad, True)


@pytest.mark.parametrize("form", ["tuples", "records", "packed"])  # (tuples: the C step called from Python)
def test_frame_loops_write_the_c_steps_counts_at_each_call(tmp_path, form):
    """The C step called from the frame loops leaves its counts pending and each loop writes them at its end: after
    every batch the counters equal those of the Python decoder (the decoder's own expiry writes them too, but it
    runs once a second of capture time: most batches here have none)."""
    from scapy.utils import wrpcap
    from support.edge_frames import tcp_frames

    from probe._records import Frames, MsgBatch
    from probe.capture.pcapfile import read_capture
    from probe.model import FrameBatch

    path = tmp_path / "tcp.pcap"
    wrpcap(str(path), [f for f, _ in tcp_frames()])
    fast, wire = Stats(), Stats()
    c = PacketDecoder(DecodeConfig(), (53,), fast)
    py = PacketDecoder(DecodeConfig(parser="wire"), (53,), wire)
    batches = without_expiry = 0
    for frames in read_capture(path, 5):
        sweep = c._next_sweep
        if form == "tuples":
            c.decode(frames)
        elif form == "records":
            c.decode_into(frames, MsgBatch())
        else:
            packed = Frames()
            for ts, wl, data in zip(frames.ts_ns, frames.wirelen, frames.data):
                packed.add(data, ts, wl)
            c.decode_into(FrameBatch(frames.linktype, packed=packed), MsgBatch())
        py.decode(frames)
        assert fast.as_dict() == wire.as_dict(), batches
        batches += 1
        without_expiry += c._next_sweep == sweep
    assert without_expiry > 10 and fast.tcp_segments > 50
