"""The record decoder (probe.decode._decoderec, PacketDecoder.decode_into) must give exactly what the Python
decoder gives.

- The extensions are built (a broken build must fail CI, not silently fall back to tuples).
- utf8_backslashreplace (the QNAME and NSID text in records) equals bytes.decode("utf-8", "backslashreplace")
  on every 1- and 2-byte string, on every 3- and 4-byte combination of lead and continuation bytes that
  matter (overlong forms, surrogates, beyond U+10FFFF, cut sequences) and on random strings of them.
- decode_into: the records of a batch read back as message tuples equal the pure-Python decoder's tuples
  (decode.parser wire), values and types, with the same counters and address events, on every capture of
  the decoding tests (DNS Probe's, compactor's, the sample, the generated live, edge-case and TCP traffic) and the
  benchmark mix; at two batch sizes, with and without the raw message, without IP lists, with deny and with
  allow lists. The C frame loop decodes the TCP frames itself; exactly the unusual frames reach the Python code.
- Python code run by a caller's objects in the middle of the C frame loop cannot make it read freed memory.
- Every message tuple survives the trip through a record unchanged; values the decoders never give are
  refused, the batch untouched.
"""

import collections
import random

import pytest
from scapy.utils import wrpcap
from support.captures import bench_mix
from support.data import ROOT
from support.dnsprobe import run_python
from support.edge_frames import tcp_frames

from probe import _records
from probe.capture.pcapfile import read_capture
from probe.config import DecodeConfig, load_config
from probe.decode.ipfilter import IpFilter
from probe.decode.packets import PacketDecoder
from probe.model import EDNS_FIELDS, FrameBatch, M
from probe.stats import Stats

FILTERS = {
    "unfiltered": {},
    "deny": {"filter.ipv4_deny": ["10.0.0.0/8", "192.0.2.0/25"], "filter.ipv6_deny": ["2001:db8::/33"]},
    "allow": {"filter.ipv4_allow": ["10.0.0.0/9"], "filter.ipv6_allow": ["2001:db8:c::/48"]},
}


def typed(value):
    """The value with the type of every part, so that == also compares types (True != 1 here)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(typed(v) for v in value))
    return (type(value).__name__, value)


@pytest.fixture(scope="module")
def captures(decode_captures):
    return decode_captures + [bench_mix()]


def test_extensions_are_built():
    # Not importorskip: a failed build must fail here (setup.py builds them optional).
    from probe.decode import _decoderec

    assert callable(_decoderec.decode_packed)
    assert _records.RECORD_SIZE % 8 == 0


def test_utf8_backslashreplace_equals_python():
    def check(b):
        assert _records.utf8_backslashreplace(b) == b.decode("utf-8", "backslashreplace").encode(), b

    for a in range(256):
        check(bytes((a,)))
        for b in range(256):
            check(bytes((a, b)))
    interesting = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1,
                   0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]
    for a in interesting:
        for b in interesting:
            for c in interesting:
                check(bytes((a, b, c)))
                for d in (0x80, 0xBF, 0x41):
                    check(bytes((a, b, c, d)))
    rng = random.Random(1)
    for _ in range(20000):
        check(bytes(rng.choice(interesting) for _ in range(rng.randrange(12))))
    # Longer, mostly ASCII (the C side takes eight ASCII bytes at a time): one other byte anywhere, or two.
    for n in range(1, 41):
        for at in range(n):
            for x in (0x80, 0xC3, 0xE2, 0xF0, 0xFF):
                b = bytearray(rng.choice(b"abc-.0") for _ in range(n))
                b[at] = x
                check(bytes(b))
                b[rng.randrange(n)] = rng.choice(interesting)
                check(bytes(b))
        check(b"x" * n)


@pytest.mark.parametrize("filtering", list(FILTERS))
def test_records_equal_python_decoder(captures, filtering):
    lists = FILTERS[filtering]
    cfg = load_config(overrides={"decode.parser": "fast", **lists})
    wire = load_config(overrides={"decode.parser": "wire", **lists})
    compared = filtered = 0
    for path in captures:
        for batch_size, keep_raw in ((4096, True), (7, False)):
            sc, sp = Stats(), Stats()
            c = PacketDecoder(cfg.decode, cfg.decode.dns_ports, sc, IpFilter(cfg.filter), keep_raw=keep_raw)
            py = PacketDecoder(wire.decode, wire.decode.dns_ports, sp, IpFilter(wire.filter), keep_raw=keep_raw)
            assert c.c_frame_loop and py.parser == "wire"
            batch = _records.MsgBatch()
            got, want = [], []
            for frames in read_capture(path, batch_size):
                batch.clear()
                c.decode_into(frames, batch, str(path))
                got += batch.to_tuples()
                want += py.decode(frames, str(path))
            c.flush()
            py.flush()
            label = f"{path.name}/{batch_size}"
            assert len(got) == len(want), label
            for i, (a, b) in enumerate(zip(got, want)):
                assert typed(a) == typed(b), f"{label} message {i}:\n C  {a}\n Py {b}"
            assert sc.as_dict() == sp.as_dict(), label
            assert c.address_events == py.address_events, label
            compared += len(want)
            filtered += sc.ip_filtered
    assert compared > 30000 and (filtered > 1000) == bool(lists)  # (an allow list keeps some 38,000)


def decoded_by_both(pcap, source):
    """The messages of a capture as the C decoder (records, read back as tuples) and the Python one give them."""
    cfg = load_config(overrides={"decode.parser": "fast"})
    wire = load_config(overrides={"decode.parser": "wire"})
    c = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats(), IpFilter(cfg.filter))
    py = PacketDecoder(wire.decode, wire.decode.dns_ports, Stats(), IpFilter(wire.filter))
    batch = _records.MsgBatch()
    got, want = [], []
    for frames in read_capture(pcap):
        batch.clear()
        c.decode_into(frames, batch, source)
        got += batch.to_tuples()
        want += py.decode(frames, source)
    return got, want


def test_client_subnet_ipv6_text_equals_python(tmp_path):
    # The C decoder writes an IPv6 client subnet's text itself but where the last 32 bits may be written as an IPv4
    # address (::/96, ::ffff:0:0/96), which it leaves to Python's ipaddress as the Python walker does.
    import ipaddress
    import struct

    from scapy.layers.dns import DNS, DNSQR, DNSRROPT, EDNS0TLV
    from scapy.layers.inet import UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    rng = random.Random(7)
    edges = ["::", "::1", "::2", "::1:0", "1::", "1::1", "::ffff:0:0", "::ffff:1.2.3.4", "::1.2.3.4", "::0.0.1.0",
             "::ffff:0:1.2.3.4", "::fffe:1.2.3.4", "0:0:0:0:1::", "1:0:0:1:0:0:1:0", "1:0:1:0:1:0:1:0",
             "1:0:0:2:0:0:0:3", "2001:db8::", "2001:db8:0:0:1::1", "fe80::1:2", "ffff:ffff::ffff:ffff:ffff:ffff",
             "0:0:0:0:0:1:0:0", "0:0:0:0:0:0:1:0"]
    addresses = [ipaddress.IPv6Address(a).packed for a in edges]
    for _ in range(400):  # groups of random values, zero or not, so that runs of zeros fall everywhere
        addresses.append(b"".join(rng.choice([b"\0\0", b"\0\0", b"\0\1", rng.randbytes(2)]) for _ in range(8)))
    frames = []
    for i, a in enumerate(addresses):
        source = rng.choice([128, 128, 64, 56, 48, 33, 0]) if i >= len(edges) else 128
        option = struct.pack("!HBB", 2, source, 0) + a[: (source + 7) // 8]
        dns = DNS(id=i, rd=1, qd=DNSQR(qname="example.com"), ar=DNSRROPT(rdata=[EDNS0TLV(optcode=8, optdata=option)]))
        frames.append(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:35") /
                      IPv6(src="2001:db8::1", dst="2001:db8::53") / UDP(sport=40000 + i, dport=53) / dns)
    pcap = tmp_path / "ecs.pcap"
    wrpcap(str(pcap), frames)
    subnet = lambda m: m[M.EDNS][EDNS_FIELDS.index("client_subnet")]  # noqa: E731
    got, want = decoded_by_both(pcap, "ecs")
    assert len(got) == len(want) == len(addresses)
    for a, b in zip(got, want, strict=True):
        assert typed(a) == typed(b), (subnet(a), subnet(b))
    texts = [subnet(m) for m in got]
    assert texts[:2] == ["::/128", "::1/128"] and texts[7] == f"{ipaddress.IPv6Address('::ffff:1.2.3.4')}/128"
    assert len(set(texts)) > 250


def test_question_names_and_option_codes_equal_python(tmp_path):
    # The C decoder makes an uncompressed first question's text from the wire in place (the bytes copied in moves
    # of 16, 8 and 4 bytes, the length bytes made dots, ASCII judged a word at a time) and writes option codes and
    # algorithm numbers as decimals itself: every name length from the root to 255 wire bytes, a byte that is not
    # ASCII at every place of some, compressed first names, and numbers of every count of digits.
    import struct

    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    rng = random.Random(11)

    def wire_name(text_len, odd_at=None):
        labels, left = [], text_len
        while left > 0:
            n = min(left, rng.randint(1, 63))
            if left - n == 1:  # (no room left for a label and its dot)
                n = n - 1 if n > 1 else 2
            labels.append(bytearray(rng.choice(b"abcxyz-019") for _ in range(n)))
            left -= n + 1
        name = bytearray(b"".join(bytes((len(x),)) + x for x in labels) + b"\0")
        if odd_at is not None and len(name) > 1:
            k = 1 + odd_at % (len(name) - 1)
            if name[k] and k not in {sum(len(x) + 1 for x in labels[:j]) for j in range(len(labels))}:
                name[k] = rng.choice([0x80, 0xC3, 0xE2, 0xFF])
        return bytes(name)

    codes = [1, 9, 10, 99, 100, 999, 1000, 9999, 10000, 65535]
    options = b"".join(struct.pack("!HH", c, 1) + b"x" for c in codes)
    options += struct.pack("!HH", 5, 6) + bytes([0, 9, 10, 99, 100, 255])
    opt = b"\0" + struct.pack("!HHIH", 41, 1232, 0, len(options)) + options
    names = [wire_name(n) for n in range(0, 254)]
    names += [wire_name(n, odd_at=k) for n in (1, 7, 8, 9, 15, 16, 17, 33, 200) for k in range(n + 1)]
    names += [b"\xc0\x04", b"\x03abc\xc0\x02", b"\x03abc\xc0\x0c"]  # compressed (the last one malformed)
    frames = []
    for i, name in enumerate(names):
        dns = struct.pack("!HHHHHH", i, 0x0100, 1, 0, 0, i % 2) + name + b"\0\x01\0\x01" + (opt if i % 2 else b"")
        ip = IP(src="192.0.2.1", dst="192.0.2.53") / UDP(sport=1024 + i, dport=53) / Raw(dns)
        frames.append(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:35") / ip)
    pcap = tmp_path / "names.pcap"
    wrpcap(str(pcap), frames)
    got, want = decoded_by_both(pcap, "names")
    assert len(got) == len(want) == len(names)
    for a, b in zip(got, want, strict=True):
        assert typed(a) == typed(b)
    assert {len(m[M.QNAME]) for m in got if m[M.QNAME] is not None} >= set(range(0, 254))
    assert sum("\\x" in m[M.QNAME] for m in got if m[M.QNAME]) > 100
    assert got[1][M.EDNS][EDNS_FIELDS.index("other")] == ",".join(map(str, codes))
    assert got[1][M.EDNS][EDNS_FIELDS.index("dau")] == "0,9,10,99,100,255"


def test_tuples_survive_records(captures):
    cfg = load_config(overrides={"decode.parser": "wire"})
    for path in captures:
        decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats(), IpFilter(cfg.filter))
        msgs = [m for frames in read_capture(path) for m in decoder.decode(frames)]
        batch = _records.MsgBatch()
        batch.extend(msgs)
        assert len(batch) == len(msgs)
        assert [typed(m) for m in batch.to_tuples()] == [typed(m) for m in msgs], path.name
        txs = _records.TxBatch()
        pairs = list(zip(msgs, msgs[1:] + [None]))
        for q, r in pairs:
            txs.append((q, r, 3))
        assert txs.to_tuples() == [(q, r, 3) for q, r in pairs], path.name
    with pytest.raises(ValueError, match="a query, a response or both"):
        _records.TxBatch().append((None, None, 1))


@pytest.mark.parametrize(
    "bad",
    [
        lambda m: m[:5],
        lambda m: m[: M.TTL] + (256,) + m[M.TTL + 1 :],
        lambda m: m[: M.MALFORMED] + (1,) + m[M.MALFORMED + 1 :],
        lambda m: m[: M.SRC] + (b"\x01\x02\x03",) + m[M.SRC + 1 :],
        lambda m: m[: M.QNAME] + (b"bytes",) + m[M.QNAME + 1 :],
        lambda m: m[: M.ID] + (-1,) + m[M.ID + 1 :],
        lambda m: m[: M.TCP_RTT_MS] + (3,) + m[M.TCP_RTT_MS + 1 :],
    ],
    ids=["short", "ttl", "malformed-int", "address", "qname-bytes", "negative-id", "rtt-int"],
)
def test_values_the_decoders_do_not_give_are_refused(bad):
    cfg = load_config(overrides={"decode.parser": "wire"})
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats(), IpFilter(cfg.filter))
    msg = next(m for frames in read_capture(ROOT / "samples" / "sample-mix.pcap.xz") for m in decoder.decode(frames))
    batch = _records.MsgBatch()
    batch.append(msg)
    with pytest.raises((TypeError, OverflowError)):
        batch.append(bad(msg))
    assert batch.to_tuples() == [msg]


def test_packed_frames_decode_as_their_lists(captures):
    """decode_into on packed frames (FrameBatch.packed) and on the same frames as lists: the same records and
    counters; also with the outer VLAN tag taken off the frames and given beside them, as the kernel's VLAN
    offload hands them to the ring reader."""
    cfg = load_config(overrides={"decode.parser": "fast"})
    tagged = 0
    for path in captures:
        results = []
        for form in ("lists", "packed", "offloaded"):
            stats = Stats()
            decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, stats, IpFilter(cfg.filter))
            batch = _records.MsgBatch()
            got = []
            for frames in read_capture(path, 300):
                if form == "lists":
                    frames = FrameBatch(frames.linktype, frames.ts_ns, frames.wirelen, frames.data)
                else:
                    packed = _records.Frames()
                    for ts, wl, data in zip(frames.ts_ns, frames.wirelen, frames.data):
                        tpid = data[12:14]
                        if form == "offloaded" and frames.linktype == 1 and tpid in (b"\x81\x00", b"\x88\xa8"):
                            tagged += 1
                            tag = int.from_bytes(data[12:16], "big")
                            packed.add(data[:12] + data[16:], ts, wl - 4, tag)
                        else:
                            packed.add(data, ts, wl)
                    frames = FrameBatch(frames.linktype, packed=packed)
                batch.clear()
                decoder.decode_into(frames, batch, str(path))
                got += batch.to_tuples()
            decoder.flush()
            results.append(([typed(m) for m in got], stats.as_dict(), decoder.address_events))
        assert results[0] == results[1] == results[2], path.name
    assert tagged > 100


def test_tcp_frames_decoded_in_c(tmp_path):
    """The C frame loop decodes the TCP frames itself (and VLAN-tagged, IPv4-options UDP): exactly the
    unusual frames reach the Python code. With the equality test above, the C TCP path is checked."""
    frames = tcp_frames()
    path = tmp_path / "tcp.pcap"
    wrpcap(str(path), [f for f, _ in frames])
    records = [f for batch in read_capture(path, 4096) for f in batch.data]
    assert len(records) == len(frames)
    want = collections.Counter(rec for rec, (_, c) in zip(records, frames) if not c)
    assert sum(want.values()) == 8
    stats = Stats()
    decoder = PacketDecoder(DecodeConfig(parser="fast"), (53,), stats)
    seen = collections.Counter()
    python_frames = decoder._frames

    def spy(link, fast, ts, wl, data, out, counts):
        seen.update(data)
        python_frames(link, fast, ts, wl, data, out, counts)

    decoder._frames = spy
    msgs = []
    out = _records.MsgBatch()
    for batch in read_capture(path, 4096):
        out.clear()
        decoder.decode_into(batch, out, str(path))
        msgs += out.to_tuples()
    decoder.flush()
    assert seen == want
    # The traffic does what its comments say (the same counters as the Python path: the test above).
    s = stats.as_dict()
    for name in ("tcp_retransmitted", "tcp_out_of_order", "tcp_resync", "tcp_dropped_bytes", "tcp_resets",
                 "truncated_frames", "non_dns", "fragments", "malformed"):
        assert s[name] > 0, name
    assert s["tcp_resets"] == 6  # 5 in C (RST, RST+data, denied RST, two IPv6), 1 in Python (bad offset)
    assert decoder.address_events[(0, 0, bytes([198, 51, 100, 53]), 4)] == 2
    tcp = [m for m in msgs if m[M.PROTO] == 6]
    assert len(tcp) == 39
    assert {m[M.VLAN] for m in tcp} == {None, 7, 100}
    assert {m[M.IPV] for m in tcp} == {4, 6}
    assert any(m[M.TCP_RTT_MS] is not None for m in tcp) and any(m[M.TCP_RTT_MS] is None for m in tcp)
    assert {m[M.ID] for m in tcp} >= {1, 2, 3, 4, 5, 7, 8, 9, 10, 12, 13, 14, 20, 21, 22, 30, 31, 34, 41, 51, 52}


# --- callers that run Python code in the middle of the loop (not reachable from packets) --------------------------

CRAFTED_SETUP = """
from scapy.all import DNS, DNSQR, IP, UDP, Ether
from probe import _records
from probe.decode import _decoderec
from probe.model import M
portmap = bytearray(8192)
portmap[53 >> 3] |= 1 << (53 & 7)
portmap = bytes(portmap)
def ether():
    return Ether(src="02:00:00:00:00:0c", dst="02:00:00:00:00:05")  # (Ether() looks the MAC up: seconds)
def udp_frame(src, qid):
    return bytes(ether() / IP(src=src, dst="198.51.100.53") / UDP(sport=40000, dport=53)
                 / DNS(id=qid, qd=DNSQR(qname="held.example.com")))
"""


def test_counts_that_are_not_ints_are_refused_before_python_code_runs():
    # A count's __index__ that empties the counts list made the next count be read from a freed array.
    code = CRAFTED_SETUP + """
class Count:
    def __index__(self):
        counts.clear()
        return 0
counts = [Count(), 0, 0, 0, 0]
frames = _records.Frames()
frames.add(udp_frame("192.0.2.1", 1), 1, 100)
frames.add(udp_frame("192.0.2.2", 2), 2, 100)
keep = lambda src, dst: src == bytes([192, 0, 2, 1])  # the second frame is filtered: two counts to add
try:
    _decoderec.decode_packed(frames, 0, _records.MsgBatch(), portmap, keep, None, counts, None, True)
except TypeError as e:
    print("TypeError", e)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("TypeError counts must be a list of 5 ints"), proc.stdout


@pytest.mark.parametrize("callback", ["keep", "tcp_step", "on_reset"])
def test_packed_frames_are_not_cleared_while_decoded(callback):
    # A callback of the loop (the IP list's keep, the Python TCP step, the C step's on_reset) that cleared the
    # Frames let go of the only reference to the frame being decoded, which the loop then read (freed memory):
    # the clear() is refused while the loop runs, and the frames stay as they were.
    code = CRAFTED_SETUP + """
import sys
from scapy.all import TCP
from probe.decode._tcpstream import TcpReassembler
from probe.stats import Stats
callback = sys.argv[1]
frames, junk = _records.Frames(), []
def clear(*args):
    frames.clear()
    junk.extend(bytes(100) for _ in range(100))  # the freed frame's memory is given to these
    return []
tcp_flags = "R" if callback == "on_reset" else "PA"
if callback == "keep":
    frame = udp_frame("192.0.2.1", 77)
else:
    frame = bytes(ether() / IP(src="192.0.2.1", dst="198.51.100.53")
                  / TCP(sport=40000, dport=53, flags=tcp_flags, seq=1) / b"\\x00\\x02ab")
frames.add(frame, 1, 100)
want = frame.hex()
del frame  # the frames hold the only reference
keep = clear if callback == "keep" else None
tcp = {"keep": None, "tcp_step": clear, "on_reset": (TcpReassembler(10**9, 10, 100, 10, Stats()), clear)}[callback]
try:
    _decoderec.decode_packed(frames, 0, _records.MsgBatch(), portmap, keep, None, [0] * 5, tcp, True)
except RuntimeError as e:
    print("RuntimeError", e)
print(len(frames), frames.lists()[2][0].hex() == want)
frames.clear()
print(len(frames))
"""
    proc = run_python(code, callback)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == [
        "RuntimeError Frames.clear() while the frames are being decoded", "1 True", "0"], proc.stdout
