"""Matching: the configurations the matching tests run under, and generated traffic that walks every branch of
the matcher (retries reusing ID and port, names equal only through str.lower, responses without a question,
answers after the timeout, duplicate answers, AXFR/IXFR over TCP and UDP, malformed messages); message tuples
made by hand for the matcher's in-process tests."""

import random
import socket

from scapy.layers.dns import DNS, DNSQR, DNSRR, DNSRRSOA
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from probe.config import MatchConfig
from probe.decode import dnswire
from probe.model import NET_FIELDS, TRANSPORT_TCP, TRANSPORT_UDP
from support.data import COMPACTOR_DATA, DNSPROBE_DATA
from support.frames import C4, MAC_C, MAC_S, S4, TcpConn, framed

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
# The captures of the oracle data that matching is compared on (DNS Probe's and compactor's).
MATCH_CAPTURES = sorted((DNSPROBE_DATA / "test_pcaps").glob("*")) + sorted(
    p for p in COMPACTOR_DATA.glob("*.pcap*") if p.name.endswith((".pcap", ".pcap.xz"))
)

# Default, a timeout shorter than many answers, a table that evicts all the time, keys that hold one or two
# queries (a retry evicts the oldest), and one open zone transfer at a time (another closes it early).
CONFIGS = {
    "default": MatchConfig(),
    "timeout-2ms": MatchConfig(query_timeout=0.002),
    "max-pending-3": MatchConfig(max_pending=3),
    "per-key-1": MatchConfig(max_pending_per_key=1),
    "per-key-2": MatchConfig(max_pending_per_key=2),
    "transfers-1": MatchConfig(max_transfers=1),
}


CLIENTS = ("192.0.2.1", "192.0.2.2", "2001:db8::1")
SERVER4, SERVER6 = "198.51.100.53", "2001:db8:53::53"
PORTS = (40000, 40001, 40002)  # few ports and IDs: keys collide, retries share them
IDS = range(6)
NAME_GROUPS = (  # names in one group are equal after str.lower() (the decoders give UTF-8 names decoded)
    (b"www.example.com", b"WWW.Example.COM"),
    (b"mail.example.net",),
    (b"k.example", "\u212a.example".encode()),  # KELVIN SIGN lowers to an ASCII k
    ("\u00c4.example".encode(), "\u00e4.example".encode()),
    ("\u0130.example".encode(), "i\u0307.example".encode()),  # one character lowers to two
    (b"\xff\xfe.bad", b"\xff\xfe.BAD"),  # not UTF-8: kept as backslash escapes
    (b"x",),
)
NAMES = [n for group in NAME_GROUPS for n in group]


def ascii_case(rng, name):
    return bytes(c ^ 0x20 if chr(c).isascii() and chr(c).isalpha() and rng.random() < 0.5 else c for c in name)


def answer_name(rng, name):
    """The QNAME a response carries: the query's (case changed or not), an equal one, or another."""
    x = rng.random()
    if x < 0.5:
        return ascii_case(rng, name)
    if x < 0.8:
        return rng.choice(next(g for g in NAME_GROUPS if name in g))
    return rng.choice(NAMES)


def udp_frame(ts, client, cport, dns, to_server):
    v6 = ":" in client
    server = SERVER6 if v6 else SERVER4
    ip = (IPv6 if v6 else IP)(src=client, dst=server) if to_server else (IPv6 if v6 else IP)(src=server, dst=client)
    udp = UDP(sport=cport, dport=53) if to_server else UDP(sport=53, dport=cport)
    return ts, bytes(Ether(src=MAC_C, dst=MAC_S) / ip / udp / Raw(dns))


def maybe_damaged(rng, dns):
    """Now and then the message cut short (malformed; under 12 bytes, even its header is missing)."""
    return dns[: rng.randrange(len(dns))] if rng.random() < 0.05 else dns


def exchange(rng, t):
    """Queries (retries on the same key, the same or other names) and their answers, late, duplicated,
    without a question or of another QTYPE now and then."""
    client, cport, qid = rng.choice(CLIENTS), rng.choice(PORTS), rng.choice(IDS)
    frames = []
    for k in range(rng.choice((1, 1, 1, 2, 3))):
        name = rng.choice(NAMES)
        qtype = rng.choice(("A", "AAAA", "MX"))
        tq = t + k * rng.choice((1_000, 300_000))
        q = bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname=name, qtype=qtype)]))
        frames.append(udp_frame(tq, client, cport, maybe_damaged(rng, q), True))
        if rng.random() < 0.15:
            continue  # never answered
        x = rng.random()
        qd = [] if x < 0.1 else [DNSQR(qname=answer_name(rng, name), qtype="TXT" if x < 0.15 else qtype)]
        r = bytes(DNS(id=qid, qr=1, rd=1, ra=1, rcode=rng.choice((0, 0, 0, 3)), qd=qd))
        tr = tq + rng.choice((50_000, 1_000_000, 2_000_000, 3_000_000, 5 * NS, 6 * NS))  # (2 ms, 5 s: just in time)
        for _ in range(2 if rng.random() < 0.1 else 1):  # a duplicate answer
            frames.append(udp_frame(tr, client, cport, maybe_damaged(rng, r), False))
            tr += 10_000
    return frames


def soa(zone):
    return DNSRRSOA(rrname=zone, ttl=3600, mname="ns." + zone, rname="h." + zone, serial=42)


def transfer(rng, t, cport):
    """AXFR or IXFR over TCP: one to four response messages, the last ending with the SOA (or not: the
    transfer stays open until it expires or the input ends), or an error closing it at once."""
    zone = rng.choice(("zone.example", "Zone.Example", "other.example"))
    qtype = rng.choice(("AXFR", "IXFR"))
    qid = rng.choice(IDS)
    conn = TcpConn(cport)
    frames = conn.handshake(t, t + 1_000, t + 2_000)
    query = DNS(id=qid, qd=[DNSQR(qname=zone, qtype=qtype)])
    frames.append((t + 3_000, conn.data("c", framed(bytes(query)))))
    n = rng.choice((1, 2, 4))
    ends = rng.random()
    for i in range(n):
        an = [DNSRR(rrname=f"h{i}.{zone}", type="A", ttl=60, rdata=f"192.0.2.{i + 1}")]
        if i == 0:
            an.insert(0, soa(zone))
        if i == n - 1 and ends < 0.7:
            an.append(soa(zone))
        rcode = 5 if ends > 0.9 and i == 0 else 0
        qd = [DNSQR(qname=ascii_case(rng, zone.encode()), qtype=qtype)] if i == 0 else []
        msg = DNS(id=qid, qr=1, aa=1, rcode=rcode, qd=qd, an=an)
        frames.append((t + 4_000 + i * rng.choice((1_000, 2 * NS)), conn.data("s", framed(bytes(msg)))))
    return frames


def udp_ixfr(rng, t):
    """IXFR over UDP: one response, ending with the SOA (closed at once), or without it (left open)."""
    client, cport, qid = rng.choice(CLIENTS), rng.choice(PORTS), rng.choice(IDS)
    q = bytes(DNS(id=qid, qd=[DNSQR(qname="zone.example", qtype="IXFR")]))
    an = [soa("zone.example")] if rng.random() < 0.7 else [DNSRR(rrname="a.zone.example", rdata="192.0.2.9")]
    r = bytes(DNS(id=qid, qr=1, aa=1, qd=[DNSQR(qname="zone.example", qtype="IXFR")], an=an))
    return [udp_frame(t, client, cport, q, True), udp_frame(t + 200_000, client, cport, r, False)]


def orphan(rng, t):
    client, cport, qid = rng.choice(CLIENTS), rng.choice(PORTS), rng.choice(IDS)
    r = bytes(DNS(id=qid, qr=1, qd=[DNSQR(qname=rng.choice(NAMES))]))
    return [udp_frame(t, client, cport, r, False)]


def generated_frames(seed, events):
    rng = random.Random(seed)
    frames = []
    t = T0
    tcp_ports = iter(range(50000, 60000))
    for _ in range(events):
        t += rng.choice((1_000, 100_000, 1_000_000)) + (6 * NS if rng.random() < 0.01 else 0)
        kind = rng.choices(("exchange", "transfer", "udp_ixfr", "orphan"), (85, 5, 5, 5))[0]
        if kind == "transfer":
            frames += transfer(rng, t, next(tcp_ports))
        else:
            frames += {"exchange": exchange, "udp_ixfr": udp_ixfr, "orphan": orphan}[kind](rng, t)
    frames.sort(key=lambda f: f[0])  # (stable: a TCP connection's frames stay in order)
    return frames


def message(ts, dns, to_server=True, cport=40000, client=C4, server=S4, sport=53, proto=17, wirelen=None):
    """A message tuple (probe.model MESSAGE_FIELDS) as the packet decoder makes it: `dns` (bytes, walked by the
    reference walker) captured at ts between client:cport and server:sport, over UDP (proto 17) or TCP (6)."""
    v6 = ":" in client
    family = socket.AF_INET6 if v6 else socket.AF_INET
    ends = (socket.inet_pton(family, client), cport, socket.inet_pton(family, server), sport)
    src, src_port, dst, dst_port = ends if to_server else ends[2:] + ends[:2]
    net = {
        "ts_ns": ts, "wirelen": len(dns) + (62 if v6 else 42) if wirelen is None else wirelen, "ipv": 6 if v6 else 4,
        "proto": proto, "src": src, "sport": src_port, "dst": dst, "dport": dst_port, "ttl": 64, "udp_sum": 0,
        "vlan": None, "tcp_rtt_ms": None, "transport": TRANSPORT_UDP if proto == 17 else TRANSPORT_TCP,
        "scope": proto, "origin": None,
    }
    return tuple(net[name] for name in NET_FIELDS) + dnswire.parse_message(dns)
