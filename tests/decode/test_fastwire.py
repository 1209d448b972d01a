"""The C walker (probe.decode._fastwire) must give exactly what the Python walker gives.

- The extension is built (a broken build must fail CI, not silently fall back to Python).
- parse_message: C == Python (values and types, and the names cache they fill) on every DNS message of
  every capture the tests use, and on many thousands of messages damaged from real ones: truncation
  at every length, byte flips, compression pointers and label types corrupted, huge counts, OPT
  options rewritten.
- The captures the decoder tests share (test_decoderec uses them): the shared ones, the sample, and traffic
  made here, among it TCP (tcp_frames: split, merged, retransmitted, reordered segments, RST, TFO, FIN,
  mid-stream starts, IPv6, VLAN tags).
- keep_raw=False (an exporter that does not read the raw message): the same messages with raw None, with every
  parser.
- decode.parser auto/fast where the extension is not built: a copy of the source tree without it.
"""

import functools
import json
import random
import shutil
import struct
import subprocess
import sys

import pytest
from scapy.all import (
    DNS,
    DNSQR,
    DNSRR,
    DNSRROPT,
    EDNS0TLV,
    IP,
    TCP,
    UDP,
    Dot1AD,
    Dot1Q,
    Ether,
    IPv6,
    IPv6ExtHdrDestOpt,
    Padding,
    Raw,
    fragment,
    wrpcap,
)
from support import ROOT, SHARED_CAPTURES, copy_env, dns_messages, needs_shared

from probe.capture.pcapfile import read_capture
from probe.config import DecodeConfig
from probe.decode import dnswire
from probe.decode.packets import PacketDecoder
from probe.decode.parsers import effective
from probe.model import M
from probe.stats import Stats

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"


def test_extension_is_built():
    # Not importorskip: a machine where the build failed must fail here (setup.py builds it optional).
    from probe.decode import _fastwire

    assert callable(_fastwire.parse_message)
    assert effective("auto") == "fast"


def c_parse():
    from probe.decode import _fastwire

    return _fastwire.parse_message


def typed(value):
    """The value with the type of every part, so that == also compares types (True != 1 here)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(typed(v) for v in value))
    return (type(value).__name__, value)


def check_same(bufs, py_names=None, c_names=None):
    """C == Python on each message (with the names caches given, else fresh ones); returns how many."""
    parse = c_parse()
    py_names = {} if py_names is None else py_names
    c_names = {} if c_names is None else c_names
    for buf in bufs:
        want = dnswire.parse_message(buf, py_names)
        got = parse(buf, c_names)
        assert typed(got) == typed(want), (buf.hex(), want, got)
    assert typed(sorted(c_names.items())) == typed(sorted(py_names.items()))
    return len(bufs)


# --------------------------------------------------------------------------------------------------
# Captures


def edge_frames():
    """Frames for every branch of the packet decoder's fast path and of the walker's OPT decoding,
    interleaved with frames the C side leaves to Python (order of the messages must be kept)."""
    c4, s4, c6, s6 = "192.0.2.1", "198.51.100.53", "2001:db8::1", "2001:db8::53"
    mapped = "::ffff:192.0.2.77"

    def opt(*options, rclass=1232, z=0x8000):
        return DNSRROPT(rclass=rclass, z=z, rdata=[EDNS0TLV(optcode=c, optdata=d) for c, d in options])

    q = DNSQR(qname="edge.example", qtype="A")
    messages = [
        DNS(id=1, rd=1, qd=q, ar=opt((3, b""), (5, b"\x08\x0d"), (6, b"\x01"), (7, b""), (10, b"c" * 8))),
        DNS(id=2, qd=q, ar=opt((8, b"\x00\x01\x18\x00\xc0\x00\x02"), (65001, b"x"), (12, b""))),
        DNS(id=3, qd=q, ar=opt((8, b"\x00\x02\x30\x00\x20\x01\x0d\xb8\x12\x34"))),
        DNS(id=4, qd=q, ar=opt((8, b"\x00\x02\x80\x00" + bytes(10) + b"\xff\xff\xc0\x00\x02\x4d"))),
        DNS(id=5, qd=q, ar=opt((8, b"\x00\x02\x80\x00" + bytes(16)), (3, "ns1-é".encode()), (3, b"\xff\xfe"))),
        DNS(id=6, qd=q, ar=opt((8, b"\x00\x03\x18\x00\x01\x02\x03"))),  # bad family: malformed
        DNS(id=7, qd=q, ar=opt((8, b"\x00\x01\x18"))),  # short: malformed
        DNS(id=8, qr=1, rcode=2, qd=q, ar=opt((15, b"\x00\x06"), (15, b"\x00\x12hello"), (15, b"\x00"))),
        DNS(id=9, qr=1, qd=q, ar=opt((15, b"\x00\x06"), (15, b"\x00\x12"), rclass=512, z=0)),
        DNS(id=10, qr=1, qd=q, an=DNSRR(rrname="edge.example", type="A", rdata="192.0.2.9"),
            ar=opt() / opt((3, b"second OPT: not decoded"))),
        DNS(id=11, qd=DNSQR(qname=b"\xc3\xa9t\xc3\xa9.\xff\xfe.example", qtype="TXT")),
    ]
    frames = []
    for i, dns in enumerate(messages):
        v6 = i % 3 == 1
        src, dst = (c6, s6) if v6 else (c4, s4)
        ip = IPv6(src=src, dst=dst) if v6 else IP(src=src, dst=dst)
        frames.append(Ether() / ip / UDP(sport=40000 + i, dport=53) / dns)
        if i == 4:
            frames.append(Ether() / IPv6(src=mapped, dst=s6) / UDP(sport=40100, dport=53) / dns)
    raw = bytes(DNS(id=20, qd=q))
    frames += [
        Ether() / IP(src=c4, dst=s4, options=b"\x01\x01\x01\x00") / UDP(sport=1, dport=53) / DNS(id=21, qd=q),
        Ether() / Dot1Q(vlan=7) / IP(src=c4, dst=s4) / UDP(sport=2, dport=53) / DNS(id=22, qd=q),
        Ether() / IPv6(src=c6, dst=s6) / IPv6ExtHdrDestOpt() / UDP(sport=3, dport=53) / DNS(id=23, qd=q),
        Ether() / IP(src=c4, dst=s4) / UDP(sport=4, dport=5353) / DNS(id=24, qd=q),  # not a DNS port
        Ether() / IP(src=c4, dst=s4) / TCP(sport=5, dport=53, flags="S"),
        Ether() / IP(src=c4, dst=s4) / UDP(sport=53, dport=53) / Raw(b"\x00" * 11),  # short header
        Ether() / IP(src=c4, dst=s4) / UDP(sport=6, dport=53, len=7) / Raw(raw),  # UDP length < 8
        Ether() / IP(src=c4, dst=s4) / UDP(sport=7, dport=53, len=400) / Raw(raw),  # UDP length past the frame
        Ether() / IP(src=c4, dst=s4) / UDP(sport=8, dport=53) / Raw(raw + b"trailing"),
        Ether(bytes(Ether() / IP(src=c4, dst=s4) / UDP(sport=9, dport=53) / Raw(raw))[:40]),  # cut frame
        Ether(type=0x0800) / Raw(b"\x45"),
        Ether() / IPv6(src=c6, dst=s6, plen=20) / UDP(sport=10, dport=53) / Raw(raw),  # UDP length > plen
    ]
    big = DNS(id=30, qr=1, qd=q, an=DNSRR(rrname="edge.example", type="TXT", rdata=["y" * 250] * 8))
    frames += fragment(Ether() / IP(src=s4, dst=c4) / UDP(sport=53, dport=11) / big, fragsize=500)
    frames.append(Ether() / IP(src=c4, dst=s4) / UDP(sport=12, dport=53) / DNS(id=31, qd=q))
    for k, f in enumerate(frames):
        f.time = 1_600_000_000 + k / 1000
    return frames


def eth():
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")  # (Ether() would look the MAC up)


def tcp_dns(dns_id, qr=0, name="tcp.example", an=()):
    """A DNS message with its 2-byte TCP length prefix."""
    msg = bytes(DNS(id=dns_id, qr=qr, rd=1, qd=DNSQR(qname=name, qtype="A"), an=list(an)))
    return struct.pack("!H", len(msg)) + msg


class TcpTraffic:
    """Frames of TCP conversations, each marked with whether the C frame loop decodes it itself."""

    def __init__(self):
        self.frames = []  # (scapy frame, decoded in C?)
        self.t = 1_600_000_100.0

    def add(self, pkt, c=True, gap=0.001):
        self.t += gap
        pkt.time = self.t
        self.frames.append((pkt, c))

    def conn(self, cli, srv, cport, **kw):
        return TcpConn(self, cli, srv, cport, **kw)


class TcpConn:
    """One connection; seg() sends a segment and advances that side's sequence number."""

    def __init__(self, traffic, cli, srv, cport, sport=53, l2=None, isn=(1000, 900000), ip_options=None):
        self.traffic, self.cli, self.srv, self.cport, self.sport = traffic, cli, srv, cport, sport
        self.l2 = l2 or eth
        self.v6 = ":" in cli
        self.next = {True: isn[0], False: isn[1]}  # the next sequence number of each side (True: client)
        self.ip_options = ip_options

    def frame(self, client, flags, data=b"", seq=None, advance=True, pad=b""):
        src, dst = (self.cli, self.srv) if client else (self.srv, self.cli)
        sp, dp = (self.cport, self.sport) if client else (self.sport, self.cport)
        seq = self.next[client] if seq is None else seq
        ttl = 40 + len(self.traffic.frames) % 13  # a message's TTL is its first segment's
        if self.v6:
            ip = IPv6(src=src, dst=dst, hlim=ttl)
        elif self.ip_options:
            ip = IP(src=src, dst=dst, ttl=ttl, options=self.ip_options)
        else:
            ip = IP(src=src, dst=dst, ttl=ttl)
        pkt = self.l2() / ip / TCP(sport=sp, dport=dp, flags=flags, seq=seq % (1 << 32), ack=self.next[not client])
        if data:
            pkt = pkt / Raw(data)
        if pad:
            pkt = pkt / Padding(pad)
        if advance:
            self.next[client] = (seq + len(data) + ("S" in flags) + ("F" in flags)) % (1 << 32)
        return pkt

    def seg(self, client, flags, data=b"", c=True, gap=0.001, **kw):
        self.traffic.add(self.frame(client, flags, data, **kw), c, gap)

    def handshake(self, rtt=0.004):
        self.seg(True, "S")
        self.seg(False, "SA", gap=rtt / 2)
        self.seg(True, "A", gap=rtt / 2)

    def close(self):
        self.seg(True, "FA")
        self.seg(False, "FA")
        self.seg(True, "A", pad=b"\x00" * 6)


def tcp_frames():
    """DNS over TCP: split, merged, retransmitted, reordered and overlapping segments, RST with and without
    payload, SYN with data (TFO), FIN with data, handshake RTT, mid-stream starts, IPv6, VLAN tags, IPv4
    options, Ethernet padding, idle streams; and frames the C loop leaves to Python (other ports, bad data
    offsets, fragments, cut frames, IPv6 extension headers). Addresses in and out of the test IP lists."""
    tr = TcpTraffic()
    srv4, srv6 = "198.51.100.53", "2001:db8:c::53"
    answer = DNSRR(rrname="tcp.example", type="TXT", rdata=["z" * 200] * 3)

    # Handshake (RTT), a query in one segment, the response in three (the first ends inside the prefix).
    a = tr.conn("10.0.0.1", srv4, 40001)
    a.handshake()
    a.seg(True, "PA", tcp_dns(1))
    r = tcp_dns(1, qr=1, an=answer)
    for part in (r[:1], r[1:300], r[300:]):
        a.seg(False, "PA", part)
    a.close()

    # Pipelining: two queries in one segment; one response and the start of the next in one segment.
    b = tr.conn("192.0.2.5", srv4, 40002)  # denied by the test's deny list
    b.handshake()
    b.seg(True, "PA", tcp_dns(2, name="one.example") + tcp_dns(3, name="two.example"))
    r2, r3 = tcp_dns(2, qr=1, name="one.example"), tcp_dns(3, qr=1, name="two.example", an=answer)
    b.seg(False, "PA", r2 + r3[:40])
    b.seg(False, "PA", r3[40:])
    b.close()

    # Retransmitted, reordered, overlapping segments.
    c = tr.conn("10.1.2.3", srv4, 40003)
    c.handshake()
    q = tcp_dns(4)
    start = c.next[True]
    c.seg(True, "PA", q)
    c.seg(True, "PA", q, seq=start, advance=False)  # exact retransmission
    r = tcp_dns(4, qr=1, an=answer)
    s0 = c.next[False]
    c.seg(False, "PA", r[0:200], seq=s0, advance=False)
    c.seg(False, "PA", r[400:], seq=s0 + 400, advance=False)  # ahead of a gap: held
    c.seg(False, "PA", r[400:], seq=s0 + 400, advance=False)  # held twice: a retransmission
    c.seg(False, "PA", r[200:400], seq=s0 + 200, advance=False)  # fills the gap
    c.seg(False, "PA", r[200:400], seq=s0 + 200, advance=False)  # behind: retransmitted
    c.next[False] = s0 + len(r)
    q2 = tcp_dns(5)
    s1 = c.next[True]
    c.seg(True, "PA", q2[:10], seq=s1, advance=False)
    c.seg(True, "PA", q2[5:], seq=s1 + 5, advance=False)  # overlaps, with new bytes at its end
    c.next[True] = s1 + len(q2)
    r5 = tcp_dns(5, qr=1)
    s2 = c.next[False]
    c.seg(False, "PA", r5[20:30], seq=s2 + 20, advance=False)  # held, then overtaken ...
    c.seg(False, "PA", r5[:25], seq=s2, advance=False)  # ... by this one: its last 5 bytes are used
    c.seg(False, "PA", r5[30:], seq=s2 + 30, advance=False)
    c.next[False] = s2 + len(r5)
    c.close()

    # RST without payload; RST with a message; RST from a denied address.
    d = tr.conn("10.2.0.1", srv4, 40004)
    d.handshake()
    d.seg(True, "PA", tcp_dns(6))
    d.seg(False, "R")
    e = tr.conn("10.2.0.2", srv4, 40005)
    e.handshake()
    e.seg(True, "PA", tcp_dns(7)[:20])
    e.seg(True, "RA", tcp_dns(7)[20:])
    f = tr.conn("192.0.2.9", srv4, 40006)
    f.handshake()
    f.seg(False, "RA")

    # TCP Fast Open: the query on the SYN, the SYN retransmitted with it.
    g = tr.conn("10.3.0.1", srv4, 40007)
    q = tcp_dns(8)
    g.seg(True, "S", q, advance=False)
    g.seg(True, "S", q)
    g.seg(False, "SA", gap=0.002)
    g.seg(True, "A", gap=0.002)
    g.seg(False, "PA", tcp_dns(8, qr=1))
    g.close()

    # FIN carrying the query.
    h = tr.conn("10.3.0.2", srv4, 40008)
    h.handshake()
    h.seg(True, "FPA", tcp_dns(9))
    h.seg(False, "FPA", tcp_dns(9, qr=1))
    h.seg(True, "A")

    # Mid-stream: at a message boundary, and inside a message (resynchronised at the next segment).
    m = tr.conn("10.4.0.1", srv4, 40009, isn=(77777, 88888))
    m.seg(True, "PA", tcp_dns(10))
    m.seg(False, "PA", tcp_dns(10, qr=1))
    n = tr.conn("10.4.0.2", srv4, 40010, isn=(5, (1 << 32) - 7))
    n.seg(False, "PA", tcp_dns(11, qr=1, an=answer)[2:])  # the ID (11) read as a length: below 12
    n.seg(False, "PA", tcp_dns(12, qr=1))  # also wraps the sequence number
    n2 = tr.conn("10.4.0.2", srv4, 40012)
    n2.seg(False, "PA", tcp_dns(15, qr=1, an=answer)[100:])  # a length never reached: dropped at the end
    n2.seg(False, "PA", tcp_dns(16, qr=1))

    # Odd messages: empty, malformed, two in a segment with a cut third.
    o = tr.conn("10.4.0.3", srv4, 40011)
    o.handshake()
    o.seg(True, "PA", b"\x00\x00" + b"\x00\x0c" + b"\xff" * 12 + tcp_dns(13) + tcp_dns(14)[:9])
    o.seg(True, "PA", tcp_dns(14)[9:])

    # IPv6 (one client allowed by the allow list, one denied by the deny list), plus a jumbo-style
    # payload length of 0 (to the end of the frame).
    for k, cli in enumerate(("2001:db8:c::5", "2001:db8::1")):
        v = tr.conn(cli, srv6, 40100 + k)
        v.handshake()
        v.seg(True, "PA", tcp_dns(20 + k, name="six.example"))
        resp = tcp_dns(20 + k, qr=1, name="six.example", an=answer)
        v.seg(False, "PA", resp[:333])
        v.seg(False, "PA", resp[333:])
        v.seg(False, "R")
    j = tr.conn("2001:db8:c::7", srv6, 40102)
    pkt = j.frame(True, "PA", tcp_dns(22))
    pkt[IPv6].plen = 0
    tr.add(Ether(bytes(pkt)))

    # VLAN tags (802.1Q; 802.1ad + 802.1Q), IPv4 options.
    for k, l2 in enumerate((lambda: eth() / Dot1Q(vlan=7), lambda: eth() / Dot1AD(vlan=100) / Dot1Q(vlan=200))):
        w = tr.conn(f"10.5.0.{k + 1}", srv4, 40200 + k, l2=l2)
        w.handshake()
        w.seg(True, "PA", tcp_dns(30 + k))
        w.seg(False, "PA", tcp_dns(30 + k, qr=1, an=answer))
        w.close()
    tr.add(eth() / Dot1Q(vlan=9) / IPv6(src="2001:db8:c::9", dst=srv6) / UDP(sport=4, dport=53) / DNS(id=32))
    padded = UDP(sport=5, dport=53) / DNS(id=33) / Padding(b"p" * 9)
    tr.add(eth() / Dot1Q(vlan=9) / IP(src="10.5.0.9", dst=srv4) / padded)
    x = tr.conn("10.6.0.1", srv4, 40300, ip_options=b"\x01\x01\x01\x00")
    x.handshake()
    x.seg(True, "PA", tcp_dns(34))
    x.seg(False, "PA", tcp_dns(34, qr=1), pad=b"junk")

    # Left to Python: other ports, a data offset below 5 (with RST: counted before the check), a TCP
    # header cut by the snaplen, a frame shorter than its IP length, an IPv4 fragment, an IPv6 extension
    # header, a version mismatch, IHL below 5.
    y = tr.conn("10.7.0.1", srv4, 40400)
    y.handshake()
    tr.add(eth() / IP(src="10.7.0.1", dst=srv4) / TCP(sport=40401, dport=80, flags="PA") / Raw(tcp_dns(40)), c=False)
    tr.add(eth() / IP(src="10.7.0.1", dst=srv4) / TCP(sport=40402, dport=53, flags="R", dataofs=4), c=False)
    full = bytes(y.frame(True, "PA", tcp_dns(41), advance=False))
    tr.add(Ether(full[: 14 + 20 + 15]), c=False)  # 15 bytes of TCP header
    tr.add(Ether(full[:-3]), c=False)  # IP total length past the frame
    frag = IP(src="10.7.0.1", dst=srv4, flags="MF", proto=6) / Raw(full[34:58])
    tr.add(eth() / frag, c=False)
    ext = IPv6ExtHdrDestOpt() / TCP(sport=40403, dport=53, flags="S")
    tr.add(eth() / IPv6(src="2001:db8:c::8", dst=srv6) / ext, c=False)
    bad = bytearray(full)
    bad[14] = 0x65  # version 6 in an IPv4 ethertype
    tr.add(Ether(bytes(bad)), c=False)
    bad[14] = 0x44  # IHL 4
    tr.add(Ether(bytes(bad)), c=False)
    y.seg(True, "PA", tcp_dns(41))
    y.seg(False, "PA", tcp_dns(41, qr=1))

    # Idle longer than tcp_idle_timeout (60 s): the stream is dropped, the rest is a mid-stream start.
    z = tr.conn("10.8.0.1", srv4, 40500)
    z.handshake()
    z.seg(True, "PA", tcp_dns(50)[:30])
    z.seg(True, "PA", tcp_dns(50)[30:] + tcp_dns(51), gap=120)
    z.seg(True, "PA", tcp_dns(52), gap=0.5)
    return tr.frames


@pytest.fixture(scope="module")
def generated_captures(tmp_path_factory):
    """Captures made by the tests: the live-capture test's traffic and the edge frames above."""
    if not _GENERATED:  # once per test run: test_decoderec uses them too
        _GENERATED.extend(_generate_captures(tmp_path_factory.mktemp("fastwire")))
    return list(_GENERATED)


_GENERATED = []


def _generate_captures(d):
    from support import build_traffic

    build_traffic(d / "traffic.pcap", 1, 400)
    wrpcap(str(d / "edge.pcap"), edge_frames())
    wrpcap(str(d / "tcp.pcap"), [f for f, _ in tcp_frames()])
    return [d / "traffic.pcap", d / "edge.pcap", d / "tcp.pcap"]


def all_captures(generated):
    return SHARED_CAPTURES + [SAMPLE] + generated


@functools.cache
def corpus_of(path):
    """Every DNS message of a capture as `dnsprobe read` finds them (UDP, TCP, fragments)."""
    return tuple(dns_messages(path))


@needs_shared
def test_captures_found(generated_captures):
    names = {p.name for p in all_captures(generated_captures)}
    assert {"knot-live.raw.pcap.xz", "nsd-live.raw.pcap.xz", "udp_simple.pcap", "sample-mix.pcap.xz",
            "traffic.pcap", "edge.pcap", "tcp.pcap"} <= names
    assert len(names) == 19


@needs_shared
def test_every_message_of_every_capture(generated_captures):
    total = 0
    for path in all_captures(generated_captures):
        bufs = corpus_of(path)
        assert bufs, path
        total += check_same(bufs)
    assert total > 50000


# --------------------------------------------------------------------------------------------------
# Damaged messages


def seeds(generated):
    """A few hundred real messages of different shapes: from every capture, the first of each
    (flags, qdcount, ancount, nscount, arcount, OPT or not) combination, and 16 spread over it."""
    picked = {}
    for path in all_captures(generated):
        bufs = corpus_of(path)
        for i, buf in enumerate(bufs):
            t = dnswire.parse_message(buf)
            key = (path.name, t[2], t[3], min(t[4] or 0, 3), min(t[5] or 0, 2), min(t[6] or 0, 2), t[12],
                   t[11] is not None and len(t[11][-1]) > 0)
            if i % max(1, len(bufs) // 16) == 0:
                key += (i,)
            picked.setdefault(key, buf)
    return list(picked.values())


def damaged(buf, rng):
    """Messages derived from buf by one kind of damage each."""
    n = len(buf)
    out = []
    for _ in range(8 if n else 0):  # random byte flips
        b = bytearray(buf)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(n)] = rng.randrange(256)
        out.append(bytes(b))
    for _ in range(6):  # pointers anywhere, to anywhere (mostly backwards, some to themselves or beyond)
        if n > 13:
            b = bytearray(buf)
            pos = rng.randrange(12, n - 1)
            target = rng.randrange(pos + 1) if rng.random() < 0.7 else rng.randrange(0x4000)
            struct.pack_into("!H", b, pos, 0xC000 | target)
            out.append(bytes(b))
    for _ in range(3):  # reserved label types, overlong labels
        if n > 13:
            b = bytearray(buf)
            b[rng.randrange(12, n)] = rng.choice((0x40, 0x7F, 0x80, 0xBF, 63, 62, 1))
            out.append(bytes(b))
    if n >= 12:  # counts: huge, off by one, zero
        for field in range(2, 6):
            for value in (0, 0xFFFF, rng.randrange(1, 8)):
                b = bytearray(buf)
                struct.pack_into("!H", b, 2 * field, value)
                out.append(bytes(b))
    out.append(buf + bytes(rng.randrange(1, 40)))  # trailing bytes
    out.append(buf + bytes([rng.randrange(256) for _ in range(rng.randrange(1, 40))]))
    return out


def opt_messages(rng, count):
    """Queries whose OPT RDATA is random option headers and values, often inconsistent."""
    out = []
    head = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 1) + b"\x04opts\x07example\x00\x00\x01\x00\x01"
    for _ in range(count):
        rdata = b""
        for _ in range(rng.randint(0, 5)):
            code = rng.choice((3, 5, 6, 7, 8, 10, 12, 15, 65001, rng.randrange(65536)))
            value = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 2, 3, 4, 5, 8, 20))))
            if code == 8 and rng.random() < 0.7:
                family = rng.choice((1, 2, 2, 3))
                value = struct.pack("!HBB", family, rng.randrange(256), 0) + bytes(
                    rng.randrange(256) for _ in range(rng.randrange(0, 18))
                )
            olen = len(value) if rng.random() < 0.9 else rng.randrange(65536)
            rdata += struct.pack("!HH", code, olen) + value
        rdlen = len(rdata) if rng.random() < 0.9 else rng.randrange(len(rdata) + 8)
        ttl = rng.randrange(1 << 32)
        out.append(head + b"\x00" + struct.pack("!HHIH", 41, rng.randrange(65536), ttl, rdlen) + rdata)
    return out


@needs_shared
def test_damaged_messages(generated_captures):
    rng = random.Random(20240601)
    base = seeds(generated_captures)
    assert len(base) > 300
    count = 0
    for buf in base:
        count += check_same([buf[:k] for k in range(len(buf) + 1)])  # truncated at every length
        count += check_same(damaged(buf, rng))
    count += check_same(opt_messages(rng, 5000))
    count += check_same([bytes(rng.randrange(256) for _ in range(rng.randrange(40))) for _ in range(2000)])
    print(f"{count} damaged messages compared")
    assert count > 50000


def test_hand_made_rules():
    h = functools.partial(struct.pack, "!HHHHHH", 0x1234, 0x0100)
    q = b"\x03www\x07example\x00\x00\x01\x00\x01"
    cases = [b"", b"\x00" * 11, h(0, 0, 0, 0), h(1, 0, 0, 0)]
    for size in range(248, 260):  # names of 248 to 259 bytes without the root: cached below 255, too long above
        last = size - 3 * 64 - 1
        name = b"".join(b"\x3f" + b"a" * 63 for _ in range(3)) + bytes([last]) + b"b" * last + b"\x00"
        cases += [h(1, 0, 0, 0) + name + b"\x00\x01\x00\x01", h(1, 0, 0, 0) + b"\x01z\xc0\x0e" + name[2:]]
    cases += [
        h(1, 0, 0, 0) + b"\x01a\xc0\x0c\x00\x01\x00\x01",  # pointer to itself's start
        h(2, 1, 0, 0) + q + b"\x01a\xc0\x0c\x00\x01\x00\x01" + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x01\x00\x00",
        h(2, 0, 0, 0) + q + b"\x01a\xc0\x20\x00\x01\x00\x01",  # forward pointer in the 2nd question
        h(1, 1, 0, 0) + q + b"\xc0\x0c\x00\x06\x00\x01\x00\x00\x00\x01\x00\x04\x01\x02\x03",  # RDATA cut
        h(1, 2, 0, 0) + q + b"\xc0\x0c\x00\x06\x00\x01\x00\x00\x00\x01\x00\x00",  # one answer of two
        h(1, 0, 0, 1) + q + b"\x00\x00\x29\x10\x00\x00\x00\x80\x00\x00\x08\x00\x0a\x00\x04abcd",
        h(1, 0, 0, 1) + q + b"\x00\x00\x29\x10\x00\x00\x00\x80\x00\x00\x09\x00\x0a\x00\x04abcd",
    ]
    check_same(cases)
    parse = c_parse()
    for buf in cases:  # without a cache, and other buffer types (handed to the Python walker)
        assert typed(parse(buf)) == typed(dnswire.parse_message(buf))
        assert typed(parse(memoryview(buf))) == typed(dnswire.parse_message(memoryview(buf)))
        assert typed(parse(bytearray(buf))) == typed(dnswire.parse_message(bytearray(buf)))


def test_names_cache_bound():
    from probe.decode.parsers import FastParser

    py, c = dnswire.MessageParser(max_names=3), FastParser(max_names=3)
    for i in range(20):
        buf = struct.pack("!HHHHHH", i, 0, 1, 0, 0, 0) + bytes([1, 97 + i % 7]) + b"\x00\x00\x01\x00\x01"
        assert typed(c.parse(buf)) == typed(py.parse(buf))
        assert c.names == py.names


# --------------------------------------------------------------------------------------------------
# The whole decoder


def decode_all(path, parser, batch_size, ip_filter=None, keep_raw=True):
    stats = Stats()
    decoder = PacketDecoder(DecodeConfig(parser=parser), (53,), stats, ip_filter, keep_raw=keep_raw)
    assert decoder.parser == parser
    msgs = []
    for batch in read_capture(path, batch_size):
        msgs += decoder.decode(batch, str(path))
    decoder.flush()
    return msgs, stats.as_dict(), decoder.address_events


@needs_shared
@pytest.mark.parametrize("parser", ["fast", "wire", "dpkt"])
def test_raw_left_out(generated_captures, parser):
    """keep_raw=False (an exporter that never reads the raw message): the same messages with raw None, the
    same counters and events (the records' raw field: tests/decode/test_decoderec.py)."""
    for path in all_captures(generated_captures):
        if path.stat().st_size > 1 << 20:
            continue
        for batch_size in (4096, 7) if path.name == "tcp.pcap" else (4096,):
            full = decode_all(path, parser, batch_size)
            lean = decode_all(path, parser, batch_size, keep_raw=False)
            assert lean[1:] == full[1:], path.name
            assert [typed(m) for m in lean[0]] == [typed(m[: M.RAW] + (None,)) for m in full[0]], path.name


def test_raw_kept_for_cdns_only():
    from export import reads_raw
    from probe.config import load_config

    assert reads_raw(load_config(None, {"export.format": "cdns"})) is True
    assert reads_raw(load_config(None, {"export.format": "parquet"})) is False
    assert reads_raw(load_config(None, {})) is False


# --------------------------------------------------------------------------------------------------
# Which parser runs


def run_in(tree, *args):
    """`python -m probe ARGS` with the package of the source tree `tree` (ROOT: this one)."""
    env = None if tree == ROOT else copy_env()
    return subprocess.run([sys.executable, "-m", "probe", *map(str, args)], capture_output=True, text=True, cwd=tree,
                          env=env)


def test_stats_json_names_the_parser(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = run_in(ROOT, "read", SAMPLE, "-o", out, "-q", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    (stats,) = out.glob("*.stats.json")
    assert json.loads(stats.read_text())["decode_parser"] == "fast"


@pytest.fixture(scope="module")
def tree_without_extension(tmp_path_factory):
    """A copy of the package sources with every compiled extension but _fastwire: the state of an
    install where it did not build. Run with the copy first on the path (python -m from its directory)."""
    d = tmp_path_factory.mktemp("unbuilt")
    for name in ("probe", "export", "config"):
        shutil.copytree(ROOT / name, d / name, ignore=shutil.ignore_patterns("_fastwire*.so", "__pycache__"))
    assert not list(d.rglob("_fastwire*.so"))
    return d


def test_not_built_fast_is_a_config_error(tree_without_extension, tmp_path):
    proc = run_in(tree_without_extension, "read", SAMPLE, "-o", tmp_path, "-q", "--set", "decode.parser=fast")
    assert proc.returncode == 2, proc.stderr
    assert "decode.parser" in proc.stderr and "_fastwire is not built" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_not_built_auto_warns_and_says_so(tree_without_extension, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = run_in(tree_without_extension, "read", SAMPLE, "-o", out, "-q", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning: decode.parser auto") == 1, proc.stderr
    (stats,) = out.glob("*.stats.json")
    doc = json.loads(stats.read_text())
    assert doc["decode_parser"] == "wire"
    # Same records as the C decoder writes (the sample's Parquet output, compared as rows).
    ref = tmp_path / "ref"
    ref.mkdir()
    proc = run_in(ROOT, "read", SAMPLE, "-o", ref, "-q", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    from support import as_rows, read_output

    assert as_rows(read_output(out)) == as_rows(read_output(ref))
    assert json.loads(next(ref.glob("*.stats.json")).read_text())["counters"] == doc["counters"]
