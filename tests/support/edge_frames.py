"""Frames for every branch of the packet decoders: UDP messages with every EDNS option the walker decodes,
interleaved with frames the C side leaves to Python (edge_frames), and DNS over TCP in every shape reassembly
meets (tcp_frames)."""

import struct

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
)


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
        frames.append(eth() / ip / UDP(sport=40000 + i, dport=53) / dns)
        if i == 4:
            frames.append(eth() / IPv6(src=mapped, dst=s6) / UDP(sport=40100, dport=53) / dns)
    raw = bytes(DNS(id=20, qd=q))
    frames += [
        eth() / IP(src=c4, dst=s4, options=b"\x01\x01\x01\x00") / UDP(sport=1, dport=53) / DNS(id=21, qd=q),
        eth() / Dot1Q(vlan=7) / IP(src=c4, dst=s4) / UDP(sport=2, dport=53) / DNS(id=22, qd=q),
        eth() / IPv6(src=c6, dst=s6) / IPv6ExtHdrDestOpt() / UDP(sport=3, dport=53) / DNS(id=23, qd=q),
        eth() / IP(src=c4, dst=s4) / UDP(sport=4, dport=5353) / DNS(id=24, qd=q),  # not a DNS port
        eth() / IP(src=c4, dst=s4) / TCP(sport=5, dport=53, flags="S"),
        eth() / IP(src=c4, dst=s4) / UDP(sport=53, dport=53) / Raw(b"\x00" * 11),  # short header
        eth() / IP(src=c4, dst=s4) / UDP(sport=6, dport=53, len=7) / Raw(raw),  # UDP length < 8
        eth() / IP(src=c4, dst=s4) / UDP(sport=7, dport=53, len=400) / Raw(raw),  # UDP length past the frame
        eth() / IP(src=c4, dst=s4) / UDP(sport=8, dport=53) / Raw(raw + b"trailing"),
        Ether(bytes(eth() / IP(src=c4, dst=s4) / UDP(sport=9, dport=53) / Raw(raw))[:40]),  # cut frame
        Ether(type=0x0800) / Raw(b"\x45"),
        eth() / IPv6(src=c6, dst=s6, plen=20) / UDP(sport=10, dport=53) / Raw(raw),  # UDP length > plen
    ]
    big = DNS(id=30, qr=1, qd=q, an=DNSRR(rrname="edge.example", type="TXT", rdata=["y" * 250] * 8))
    frames += fragment(eth() / IP(src=s4, dst=c4) / UDP(sport=53, dport=11) / big, fragsize=500)
    frames.append(eth() / IP(src=c4, dst=s4) / UDP(sport=12, dport=53) / DNS(id=31, qd=q))
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
