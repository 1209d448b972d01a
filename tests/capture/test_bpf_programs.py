"""The classic BPF programs of live capture, run by a small interpreter of the kernel's semantics
(support.cbpf.run_cbpf) on the frames of every capture:

- the fanout program gives, for every Ethernet frame as the kernel's receive path holds it (support.cbpf.received:
  the outer VLAN tag taken off, loads from the network header), exactly include/wire.h's flow_hash of the frame
  (the hash `dnsprobe read --workers` splits by), so a live worker gets the flows a read worker gets; frames
  with 0 to 3 VLAN tags of every kind too;
- the kernel filter keeps every frame from which the decoder takes a DNS message or a fragment of one, behind
  IPv6 extension headers too (hop-by-hop, routing, destination options, AH), and drops what is not DNS; on
  thousands of random IPv6 header chains (any order, up to a few more than the filter walks, behind 0 to 2 VLAN
  tags) the filter and the decoder agree frame by frame;
- with the IP allow/deny lists compiled in, the filter keeps exactly the DNS frames the decoder keeps, and its
  inverted program (the RejectedCounter's) exactly those the decoder counts as ip_filtered, fragment by fragment;
- the kernel's own checker takes every program (SO_ATTACH_FILTER on a UDP socket), the longest ones too.
"""

import ipaddress
import random
import socket
import struct

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_RR
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, IPv6ExtHdrRouting
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from support.captures import bench_mix
from support.cbpf import received, run_cbpf
from support.data import DATA_CAPTURES
from support.frames import ether
from support.messages import q_dns

from probe.capture.afpacket import attach_filter
from probe.capture.bpf import (
    MAX_FILTER_PORTS,
    MAX_IPV6_EXT,
    MAX_QUOTED_IPV6_EXT,
    PACKET_OUTGOING,
    dns_filter,
    fanout_program,
)
from probe.capture.pcapfile import read_capture
from probe.config import FilterConfig, load_config
from probe.decode import _decoderec
from probe.decode.ipfilter import IpFilter
from probe.decode.packets import PacketDecoder
from probe.model import LINKTYPE_ETHERNET, FrameBatch
from probe.stats import Stats


@pytest.fixture(scope="module")
def captures(traffic_pcap, edge_pcap):
    return [p for p in DATA_CAPTURES if p.stat().st_size < 3_000_000] + [traffic_pcap, edge_pcap[0], bench_mix()]


def ethernet_frames(path):
    for batch in read_capture(path):
        if batch.linktype == LINKTYPE_ETHERNET:
            yield from zip(batch.ts_ns, batch.wirelen, batch.data)


def test_fanout_program_is_flow_hash(captures):
    program = fanout_program()
    seen = 0
    for path in captures:
        for _, _, frame in ethernet_frames(path):
            assert run_cbpf(program, *received(frame)) == _decoderec.flow_hash(frame, 1), path.name
            seen += 1
    assert seen > 20000


def test_filter_keeps_what_the_decoder_decodes(captures):
    """A frame the filter drops gives the decoder nothing: no message, no fragment, no TCP segment."""
    program = dns_filter([53])
    cfg = load_config()
    kept = 0
    for path in captures:
        for ts, wl, frame in ethernet_frames(path):
            if run_cbpf(program, frame):
                kept += 1
                continue
            stats = Stats()
            decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, stats, IpFilter(cfg.filter))
            msgs = decoder.decode(FrameBatch(LINKTYPE_ETHERNET, [ts], [wl], [frame]))
            assert not msgs and not stats.fragments, (path.name, frame.hex())
    assert kept > 20000


def test_ipv6_extension_headers_are_walked():
    program = dns_filter([53])
    dns = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01a\x00\x00\x01\x00\x01"
    for ext in (IPv6ExtHdrHopByHop(), IPv6ExtHdrDestOpt() / IPv6ExtHdrHopByHop(), IPv6ExtHdrDestOpt()):
        frame = ether(bytes(IPv6(src="2001:db8::1", dst="2001:db8::2") / ext / UDP(sport=4000, dport=53) / Raw(dns)))
        assert run_cbpf(program, frame)
        other = ether(bytes(IPv6(src="2001:db8::1", dst="2001:db8::2") / ext / UDP(sport=4000, dport=80)))
        assert not run_cbpf(program, other)
    deep = IPv6(src="2001:db8::1", dst="2001:db8::2")
    for _ in range(9):
        deep = deep / IPv6ExtHdrDestOpt()
    assert run_cbpf(program, ether(bytes(deep / UDP(sport=4000, dport=80))))  # beyond the walk: kept
    assert not run_cbpf(program, ether(bytes(IP() / UDP(sport=4000, dport=80))))


def test_fanout_program_on_tags():
    program = fanout_program()
    ip = bytes(IP(src="10.1.2.3", dst="192.0.2.53") / UDP(sport=5000, dport=53))
    for tpids in ((), (0x8100,), (0x88A8,), (0x9100,), (0x88A8, 0x8100), (0x9100, 0x8100), (0x8100, 0x8100, 0x8100),
                  (0x9100, 0x9100, 0x9100), (0x8100, 0x9100, 0x88A8, 0x8100)):
        frame = b"\x02" * 12
        for tpid in tpids:
            frame += tpid.to_bytes(2, "big") + b"\x00\x64"
        frame += b"\x08\x00" + ip
        want = _decoderec.flow_hash(frame, 1)
        assert run_cbpf(program, *received(frame)) == want, tpids
        assert (want != 0) == (len(tpids) <= 2 or (len(tpids) == 3 and tpids[0] in (0x8100, 0x88A8))), tpids


# ---------------------------------------------------------------------------------------------
# The filter against the decoder, frame by frame


def decoder_verdicts(frames, ip_filter=None):
    """Per frame, what the decoder makes of it: 'dns' (a message, a TCP segment on a DNS port, a fragment), 'icmp' (an
    ICMP error it counts, about DNS or not), 'filtered' (rejected by the IP lists), 'damaged', or 'other' (not IP,
    not DNS)."""
    cfg = load_config()
    stats = Stats()
    decoder = PacketDecoder(cfg.decode, (53,), stats, ip_filter)
    out = []
    for i, frame in enumerate(frames):
        before = stats.as_dict()
        msgs = decoder.decode(FrameBatch(LINKTYPE_ETHERNET, [i], [len(frame)], [frame]))
        delta = {k for k, v in stats.as_dict().items() if v != before[k]}
        if msgs or {"tcp_segments", "fragments"} & delta:
            out.append("dns")
        elif {"icmp_unreachable", "icmp_other_errors"} & delta:
            out.append("icmp")
        elif "ip_filtered" in delta:
            out.append("filtered")
        elif "truncated_frames" in delta:
            out.append("damaged")
        else:
            out.append("other")
    return out


def extension_header(name, nh, rng):
    """The bytes of one IPv6 extension header the decoder walks, of a random length where it has one."""
    if name in ("hbh", "destopt"):  # (hdr ext len + 1) * 8 bytes, a PadN option filling them
        units = rng.randrange(3)
        return bytes([nh, units, 1, 4 + 8 * units]) + bytes(4 + 8 * units)
    if name == "routing":  # type 0, segments left 1, one address
        return bytes([nh, 2, 0, 1]) + bytes(4) + ipaddress.IPv6Address("2001:db8::9").packed
    if name == "ah":  # (payload len + 2) * 4 bytes: SPI, sequence number, an ICV of 12 or 20 bytes
        icv = rng.choice((12, 20))
        return bytes([nh, (12 + icv) // 4 - 2, 0, 0]) + struct.pack("!II", 1, 1) + bytes(icv)
    return bytes([nh, 0, 0, 0]) + struct.pack("!I", 3)  # fragment: offset 0, no more fragments (atomic)


EXTENSIONS = {"hbh": 0, "routing": 43, "destopt": 60, "ah": 51, "fragment": 44}
QUERY = q_dns(1)


def random_chain(rng, most, kinds):
    """A random IPv6 header chain: 0 to `most` extension headers in any order, then one of kinds (UDP or TCP, on a DNS
    port or not; ICMPv6 echo; an ICMPv6 error, of a type the decoder counts or not, quoting a random chain).
    Returns (next header, bytes, as_quote, kept): as_quote, whether the filter's walk of the chain as the quote of an
    ICMPv6 error finds DNS in it (a fragment or a DNS port at its end, or more headers than it walks); kept, whether
    the filter keeps the chain whatever the decoder makes of it (more headers than it walks, an ICMPv6 error quoting
    a chain as_quote)."""
    names = [rng.choice(list(EXTENSIONS)) for _ in range(rng.randrange(most + 1))]
    kind = rng.choice(kinds)
    port = rng.choice((53, 53, 5353, 443))
    kept = len(names) > MAX_IPV6_EXT
    if kind == "udp":
        payload, nh = struct.pack("!HHHH", 30000, port, 8 + len(QUERY), 0) + QUERY, 17
    elif kind == "tcp":
        payload, nh = struct.pack("!HHIIBBHHH", port, 30000, 1, 1, 0x50, 0x10, 65535, 0, 0), 6
    elif kind == "echo":
        payload, nh = struct.pack("!BBHHH", 128, 0, 0, 1, 1), 58
    else:
        quoted_nh, quote, about_dns, _ = random_chain(rng, MAX_QUOTED_IPV6_EXT + 2, ("udp", "udp", "tcp", "echo"))
        quoted = struct.pack("!IHBB", 6 << 28, len(quote), quoted_nh, 64) + bytes(32) + quote
        icmp_type = rng.choice((1, 2, 3, 3, 4, 128))
        payload, nh = struct.pack("!BBHI", icmp_type, 0, 0, 1280) + quoted, 58
        kept = kept or about_dns and icmp_type in (1, 2, 3)
    as_quote = kind in ("udp", "tcp") and ("fragment" in names or port == 53) or len(names) > MAX_QUOTED_IPV6_EXT
    for name in reversed(names):
        payload = extension_header(name, nh, rng) + payload
        nh = EXTENSIONS[name]
    return nh, payload, as_quote, kept


def random_ipv6(rng):
    """An IPv6 frame behind 0 to 2 VLAN tags with a random header chain (random_chain: 0 to MAX_IPV6_EXT + 3
    extension headers, UDP, TCP, ICMPv6 echo or error), and whether the filter keeps it beyond the decoder's DNS.
    (Built by hand: scapy would take most of the test's time.)"""
    nh, payload, _, kept = random_chain(rng, MAX_IPV6_EXT + 3, ("udp", "udp", "tcp", "echo", "error", "error"))
    src = ipaddress.IPv6Address(f"2001:db8:{rng.randrange(4):x}::{rng.randrange(1, 200):x}").packed
    dst = ipaddress.IPv6Address("2001:db8:53::53").packed
    ip = struct.pack("!IHBB", 6 << 28, len(payload), nh, 64) + src + dst + payload
    vlans = rng.choice(((), (7,), (7, 8)))
    return ether(ip, vlans, {0: (), 1: (0x8100,), 2: (0x88A8, 0x8100)}[len(vlans)]), kept


def other_frames():
    return [
        bytes(Ether(src="02:00:00:00:00:0c", dst="ff:ff:ff:ff:ff:ff") / ARP()),
        ether(bytes(IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=123, dport=123) / Raw(bytes(48)))),
        ether(bytes(IP(src="10.0.0.1", dst="10.0.0.2") / ICMP())),
        ether(bytes(IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=443))),
        ether(bytes(IPv6(src="2001:db8::1", dst="2001:db8::2") / UDP(sport=1, dport=2) / Raw(bytes(10)))),
        ether(bytes(IPv6(src="2001:db8::1", dst="2001:db8::2") / IPv6ExtHdrFragment(nh=58) / Raw(bytes(8)))),
    ]


@pytest.fixture(scope="module")
def chains():
    """3,000 random IPv6 header chains (random_ipv6), with the headers of each."""
    rng = random.Random(11)
    return [random_ipv6(rng) for _ in range(3000)]


def test_filter_and_decoder_agree_on_random_ipv6_header_chains(chains):
    """Every chain the decoder takes DNS from is kept, and every ICMPv6 error it counts whose quote is DNS; every other
    is dropped, but for chains longer than the filter walks (kept for the decoder to judge)."""
    program = dns_filter([53])
    frames = [f for f, _ in chains] + other_frames()
    verdicts = decoder_verdicts(frames)
    beyond = [k for _, k in chains] + [False] * len(other_frames())
    icmp_kept = 0
    for frame, verdict, kept_beyond in zip(frames, verdicts, beyond, strict=True):
        kept = bool(run_cbpf(program, frame))
        if verdict == "dns":
            assert kept, frame.hex()
        else:
            assert kept == kept_beyond, (verdict, frame.hex())
            icmp_kept += kept and verdict == "icmp"
    assert verdicts.count("dns") > 1000 and verdicts.count("other") > 800
    assert icmp_kept > 200 and verdicts.count("icmp") - icmp_kept > 100  # errors about DNS and about other traffic
    looped = dns_filter([53], skip_outgoing=True)  # on loopback, the frames this host sends are skipped
    dns = frames[verdicts.index("dns")]
    assert run_cbpf(looped, dns) and not run_cbpf(looped, dns, pkttype=PACKET_OUTGOING)


# ---------------------------------------------------------------------------------------------
# ICMP and ICMPv6 errors


def quote4(l4, proto=UDP, frag=0, flags=0, options=b"", cut=None, client="10.3.0.9"):
    """The IPv4 packet an ICMP error quotes: a response from the server to a client, cut to `cut` bytes."""
    ip = IP(src="192.0.2.53", dst=client, proto=17 if proto is UDP else 6, frag=frag, flags=flags, options=options)
    return bytes(ip / l4)[:cut]


def quote6(l4, *ext, cut=None):
    """The IPv6 packet an ICMPv6 error quotes, extension headers first, cut to `cut` bytes."""
    pkt = IPv6(src="2001:db8:53::53", dst="2001:db8:1::9")
    for header in ext:
        pkt = pkt / header
    return bytes(pkt / l4)[:cut]


def icmp4(icmp_type, quote, sender="10.3.0.9", vlans=(), options=b""):
    """An ICMP error from sender to the server; its code 3 (port unreachable) or 0."""
    ip = IP(src=sender, dst="192.0.2.53", options=options)
    return ether(bytes(ip / ICMP(type=icmp_type, code=3 if icmp_type == 3 else 0) / Raw(quote)), vlans,
                 (0x8100,) * len(vlans))


def icmp6(icmp_type, quote, *ext, sender="2001:db8:1::9", vlans=()):
    """An ICMPv6 error from sender to the server, behind extension headers ext."""
    headers = [IPv6(src=sender, dst="2001:db8:53::53")] + [h.copy() for h in ext]
    headers[-1].nh = 58  # ICMPv6 follows (scapy would say no next header before raw bytes)
    pkt = headers[0]
    for header in headers[1:]:
        pkt = pkt / header
    icmp = struct.pack("!BBHI", icmp_type, 4 if icmp_type == 1 else 0, 0, 1280 if icmp_type == 2 else 0)
    return ether(bytes(pkt / Raw(icmp + quote)), vlans, (0x8100,) * len(vlans))


RESPONSE = UDP(sport=53, dport=40000) / Raw(QUERY)
QUERY_UDP = UDP(sport=40000, dport=53) / Raw(QUERY)
NTP = UDP(sport=123, dport=123) / Raw(bytes(48))


def icmp_errors():
    """(frame, kept) for ICMP and ICMPv6 errors and messages: kept, those of a type the decoder counts quoting UDP or
    TCP on a DNS port, or a fragment of UDP or TCP with no ports in the quote; behind VLAN tags, IPv4 options and
    IPv6 extension headers, on either side of the quote."""
    hbh, dest, route = IPv6ExtHdrHopByHop(), IPv6ExtHdrDestOpt(), IPv6ExtHdrRouting(addresses=["2001:db8::7"])
    tcp53 = TCP(sport=53, dport=40000, flags="PA") / Raw(b"\x00\x20" + QUERY)
    frag6 = IPv6ExtHdrFragment(nh=17, offset=0, m=1, id=7)
    return [
        (icmp4(3, quote4(RESPONSE)), True),  # the client's port closed before the response arrived
        (icmp4(3, quote4(QUERY_UDP)), True),
        (icmp4(11, quote4(tcp53, TCP)), True),
        (icmp4(3, quote4(RESPONSE, cut=28)), True),  # what RFC 792 requires: the IP header and 8 bytes
        (icmp4(3, quote4(RESPONSE, flags="MF")), True),  # a first fragment, its ports in the quote
        (icmp4(11, quote4(Raw(bytes(40)), frag=100)), True),  # a later fragment: no ports to judge by
        (icmp4(3, quote4(RESPONSE, options=IPOption_RR())), True),  # IPv4 options in the quote ...
        (icmp4(3, quote4(RESPONSE), options=IPOption_RR()), True),  # ... and in the error
        (icmp4(3, quote4(RESPONSE), vlans=(5,)), True),
        (icmp4(11, quote4(QUERY_UDP), vlans=(5, 6)), True),
        (icmp4(3, quote4(NTP)), False),  # about other traffic
        (icmp4(3, quote4(NTP, flags="MF")), False),
        (icmp4(3, quote4(TCP(sport=40000, dport=443), TCP)), False),
        (icmp4(12, quote4(RESPONSE)), False),  # parameter problem, redirect, echo: not counted by the decoder
        (icmp4(5, quote4(RESPONSE)), False),
        (icmp4(8, quote4(RESPONSE)), False),
        (icmp4(3, quote4(RESPONSE, cut=20)), False),  # cut before the ports
        (icmp4(3, quote6(RESPONSE)), False),  # an IPv6 quote in ICMP
        (icmp4(3, bytes(IP(src="192.0.2.53", dst="10.3.0.9") / ICMP(type=0))), False),
        (icmp6(1, quote6(RESPONSE)), True),
        (icmp6(2, quote6(RESPONSE, frag6)), True),  # packet too big for a fragmented response
        (icmp6(3, quote6(tcp53)), True),
        (icmp6(1, quote6(QUERY_UDP, hbh, route)), True),
        (icmp6(1, quote6(RESPONSE, cut=48)), True),
        (icmp6(1, quote6(Raw(bytes(8)), IPv6ExtHdrFragment(nh=17, offset=100, id=7))), True),
        (icmp6(1, quote6(NTP, dest, dest, dest, dest)), True),  # more headers than the filter walks in a quote
        (icmp6(1, quote6(RESPONSE), hbh, dest), True),
        (icmp6(3, quote6(RESPONSE), vlans=(5, 6)), True),
        (icmp6(1, quote6(NTP)), False),
        (icmp6(1, quote6(NTP, hbh, route)), False),
        (icmp6(4, quote6(RESPONSE)), False),  # parameter problem, echo request
        (icmp6(128, quote6(RESPONSE)), False),
        (icmp6(1, quote6(RESPONSE, cut=40)), False),
        (icmp6(1, quote4(RESPONSE)), False),
    ]


def test_icmp_errors_about_dns_are_kept():
    """The filter keeps exactly the ICMP/ICMPv6 errors of icmp_errors() that quote DNS; every one the decoder counts
    and keeps as an address event (`dnsprobe read` and live capture count the same errors about DNS); the others it
    finds no DNS in."""
    cases = icmp_errors()
    frames = [f for f, _ in cases]
    program = dns_filter([53])
    for frame, kept, verdict in zip(frames, [k for _, k in cases], decoder_verdicts(frames), strict=True):
        assert bool(run_cbpf(program, frame)) == kept, frame.hex()
        assert verdict in (("icmp",) if kept else ("icmp", "other")), frame.hex()
    assert not run_cbpf(dns_filter([5353]), icmp4(3, quote4(RESPONSE)))  # the DNS ports the filter is built with
    assert run_cbpf(dns_filter([53, 5353]), icmp6(1, quote6(UDP(sport=5353, dport=5353))))


# Each rejects some clients of edge_traffic and of the random chains (fragments among their frames) and keeps others.
LISTS = [{"ipv6_allow": ("2001:db8:1::/48", "2001:db8:2::/48"), "ipv4_deny": ("10.1.0.0/16",)},
         {"ipv6_deny": ("2001:db8:2::/47",), "ipv4_allow": ("10.3.0.0/16", "10.4.0.0/16")}]


@pytest.mark.parametrize("lists", LISTS, ids=["v6-allow-v4-deny", "v6-deny-v4-allow"])
def test_ip_lists_in_the_filter_and_inverted(captures, chains, lists):
    """With the lists compiled in, a frame the decoder reads DNS from without lists (or an ICMP error about DNS it
    counts) is kept by the capture sockets' program exactly when the decoder keeps it with the lists, and by the
    RejectedCounter's inverted program exactly when the decoder counts it as ip_filtered: the same count, fragment
    by fragment and error by error, in both families. The lists judge an error by its own addresses, as the decoder
    does."""
    edge = next(p for p in captures if p.name == "edge.pcap")
    errors = [icmp4(3, quote4(RESPONSE, client=a), sender=a) for a in ("10.1.0.9", "10.3.0.9", "10.5.0.9")]
    errors += [icmp6(1, quote6(RESPONSE), sender=f"2001:db8:{n}::9") for n in (1, 3, 5)]
    frames = [f for _, _, f in ethernet_frames(edge)] + [f for f, _ in chains[:600]] + errors
    ip_filter = IpFilter(FilterConfig(**lists))
    plain, verdicts = decoder_verdicts(frames), decoder_verdicts(frames, ip_filter)
    unlisted = dns_filter([53])
    kept = dns_filter([53], ip_filter=ip_filter)
    counted = dns_filter([53], ip_filter=ip_filter, invert_ip_filter=True)
    fragments = {4: 0, 6: 0}  # rejected fragments, by family
    icmp = {"icmp": 0, "filtered": 0}  # errors about DNS, kept and rejected
    for frame, dns, verdict in zip(frames, plain, verdicts, strict=True):
        if dns != "dns" and not (dns == "icmp" and run_cbpf(unlisted, frame)):
            continue
        assert bool(run_cbpf(kept, frame)) == (verdict == dns), frame.hex()
        assert bool(run_cbpf(counted, frame)) == (verdict == "filtered"), frame.hex()
        family = fragment_family(frame)
        if verdict == "filtered" and family and dns == "dns":
            fragments[family] += 1
        if dns == "icmp":
            icmp[verdict] += 1
    assert verdicts.count("filtered") > 100 and verdicts.count("dns") > 100
    assert fragments[4] > 10 and fragments[6] > 10, fragments
    assert icmp["icmp"] > 20 and icmp["filtered"] > 20, icmp


def fragment_family(frame):
    """4 or 6 for a fragment (IPv4, or IPv6 with a fragment header anywhere in its chain), else None."""
    pkt = Ether(frame)
    if IP in pkt and (pkt[IP].flags.MF or pkt[IP].frag > 0):
        return 4
    return 6 if IPv6ExtHdrFragment in pkt else None


def test_the_kernel_takes_every_program():
    """The kernel's checker (SO_ATTACH_FILTER on a UDP socket: jumps within the program, scratch memory written
    before it is read, a return at every end) takes the filter with the most ports and with IP lists, inverted or
    not, and the fanout program."""
    lists = IpFilter(FilterConfig(ipv4_allow=tuple(f"10.{i}.0.0/16" for i in range(8)),
                                  ipv6_deny=tuple(f"2001:db8:{i:x}::/48" for i in range(8))))
    most = range(1, MAX_FILTER_PORTS + 1)
    programs = [fanout_program(), dns_filter([53]), dns_filter([53], skip_outgoing=True), dns_filter(most),
                dns_filter(most, ip_filter=lists), dns_filter([53], ip_filter=lists, invert_ip_filter=True)]
    for program in programs:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            attach_filter(sock, program)
    assert max(map(len, programs)) > 1000
