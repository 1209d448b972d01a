"""Frames and capture files: Ethernet/IP/UDP/TCP frames around DNS bytes, TCP connections, pcap and pcapng
writers."""

import struct
from decimal import Decimal

from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

NS = 1_000_000_000
T0 = 1_597_844_513_851_855_123  # 2020-08-19 13:41:53.851855123 UTC: sub-microsecond digits, cut in the output
MAC_C, MAC_S = "02:00:00:00:00:0c", "02:00:00:00:00:05"
C4, S4 = "192.0.2.1", "198.51.100.53"
C6, S6 = "2001:db8::1", "2001:db8:53::53"
TTL_C, TTL_S = 61, 250  # client and server TTL / hop limit, different so a swap shows
ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
CPORT = 40000


def ip_layer(to_server, v6=False, ttl=None, **kw):
    c, s = (C6, S6) if v6 else (C4, S4)
    src, dst = (c, s) if to_server else (s, c)
    ttl = (TTL_C if to_server else TTL_S) if ttl is None else ttl
    if v6:
        return IPv6(src=src, dst=dst, hlim=ttl, **kw)
    return IP(src=src, dst=dst, ttl=ttl, **kw)


def udp_l3(dns, to_server=True, cport=CPORT, port=53, v6=False, ext=None, ttl=None):
    """IP/UDP/DNS bytes; client→server when to_server. ext: extension headers between IP and UDP."""
    ip = ip_layer(to_server, v6, ttl) if v6 else ip_layer(to_server, v6, ttl, flags="DF")
    if ext is not None:
        ip = ip / ext
    udp = UDP(sport=cport, dport=port) if to_server else UDP(sport=port, dport=cport)
    return bytes(ip / udp / Raw(dns))


def ether(l3, vlans=(), tpids=(), pad=True):
    """Ethernet frame around IP bytes; vlans with their tag protocol ids (outermost first).

    Frames shorter than Ethernet's 60-byte minimum are padded as on the wire, with 0xEE bytes so that padding
    taken for payload would show (a bare TCP ACK of 54 bytes gets 6 bytes of it). pad=False: as captured on the
    sending host, where outgoing frames are not padded yet.
    """
    etype = ETH_IPV6 if l3[0] >> 4 == 6 else ETH_IPV4
    types = list(tpids) + [etype]
    frame = Ether(src=MAC_C, dst=MAC_S, type=types[0])
    for i, vid in enumerate(vlans):
        tag = Dot1AD if types[i] == 0x88A8 else Dot1Q
        frame = frame / tag(prio=5, vlan=vid, type=types[i + 1])
    data = bytes(frame / Raw(l3))
    return data + b"\xee" * (60 - len(data)) if pad else data


def udp_frame(dns, **kw):
    return ether(udp_l3(dns, **kw))


def framed(dns):
    """RFC 1035 TCP framing: 2-byte length prefix."""
    return struct.pack("!H", len(dns)) + dns


class TcpConn:
    """Frames of one TCP connection (client port → server port), sequence numbers tracked per side."""

    def __init__(self, cport, isn_c=1000, isn_s=900_000, v6=False, port=53):
        self.cport = cport
        self.port = port
        self.v6 = v6
        self.next = {"c": isn_c, "s": isn_s}

    def frame(self, side, flags, payload=b"", seq=None):
        to_server = side == "c"
        other = "s" if to_server else "c"
        s = self.next[side] if seq is None else seq
        ack = self.next[other] if "A" in flags else 0
        ports = (self.cport, self.port) if to_server else (self.port, self.cport)
        tcp = TCP(sport=ports[0], dport=ports[1], flags=flags, seq=s, ack=ack, window=65535)
        pkt = ip_layer(to_server, self.v6) / tcp
        if payload:
            pkt = pkt / Raw(payload)
        if seq is None:
            self.next[side] = (s + len(payload) + (1 if ("S" in flags or "F" in flags) else 0)) % (1 << 32)
        return ether(bytes(pkt))

    def data(self, side, payload):
        return self.frame(side, "PA", payload)

    def handshake(self, t_syn, t_synack, t_ack):
        return [(t_syn, self.frame("c", "S")), (t_synack, self.frame("s", "SA")), (t_ack, self.frame("c", "A"))]


def write_pcap(path, frames, linktype=1):
    """Nanosecond pcap via scapy; frames: (ts_ns, bytes) or (ts_ns, captured bytes, wire length)."""
    pkts = []
    for ts, data, *wirelen in frames:
        p = Raw(data)
        p.time = Decimal(ts) / NS
        if wirelen:
            p.wirelen = wirelen[0]
        pkts.append(p)
    wrpcap(str(path), pkts, linktype=linktype, nano=True)
    if linktype == 0:  # scapy takes 0 (BSD loopback) for "not given" and writes 1: patch the header
        data = bytearray(path.read_bytes())
        endian = "<" if data[:4] == b"\x4d\x3c\xb2\xa1" else ">"
        data[20:24] = struct.pack(endian + "I", linktype)
        path.write_bytes(bytes(data))
    return path


def write_pcapng_ns(path, frames, linktype=1):
    """pcapng written by hand with if_tsresol=9 (scapy's writer only does microseconds)."""

    def block(btype, body):
        body += bytes(-len(body) % 4)
        return struct.pack("<II", btype, len(body) + 12) + body + struct.pack("<I", len(body) + 12)

    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    options = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)
    out += block(1, struct.pack("<HHI", linktype, 0, 262144) + options)
    for ts, data in frames:
        out += block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(data), len(data)) + data)
    path.write_bytes(out)
    return path


def total_len(*frames):
    return sum(len(f) for f in frames)
