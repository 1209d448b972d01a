"""ICMP and ICMPv6 errors about DNS, live as offline: a capture of DNS transactions and of the errors they drew
(destination unreachable, time exceeded, packet too big; IPv4 and IPv6; quotes of queries and responses, over UDP
and TCP, cut to RFC 792's 8 bytes, behind a VLAN tag or IPv6 extension headers) is replayed with tcpreplay (or the
raw sender) through a veth pair into `dnsprobe capture`, whose kernel filter must pass the errors: the counters and
the C-DNS address events equal those of `dnsprobe read` of the same capture.
"""

import collections
import ipaddress
import json
import os
import shutil
from pathlib import Path

import cbor2
import pytest
from scapy.layers.dns import DNS, DNSQR, DNSRR
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrHopByHop
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import wrpcap
from support.dnsprobe import run_dnsprobe

from export.cdns import format as F

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")

SERVER4, SERVER6 = "192.0.2.53", "2001:db8:53::53"
ROUTER4, ROUTER6 = "10.99.0.1", "2001:db8:99::1"


def errors_about_dns(path):
    """Writes the capture: 48 UDP and 4 TCP transactions, IPv4 and IPv6, and after each UDP one an ICMP or ICMPv6
    error about its query or its response. Returns the number of frames."""
    frames = []
    eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:35")
    for i in range(48):
        v6 = i % 2 == 1
        client = f"2001:db8:c::{i + 1:x}" if v6 else f"10.3.{i}.7"
        server = SERVER6 if v6 else SERVER4
        ip = IPv6 if v6 else IP
        qname = f"e{i}.example.com"
        query = ip(src=client, dst=server) / UDP(sport=20000 + i, dport=53) / DNS(id=i, rd=1, qd=DNSQR(qname=qname))
        response = ip(src=server, dst=client) / UDP(sport=53, dport=20000 + i) / DNS(
            id=i, qr=1, rd=1, ra=1, qd=DNSQR(qname=qname), an=DNSRR(rrname=qname, rdata="192.0.2.1"))
        link = eth / Dot1Q(vlan=100) if i % 7 == 0 else eth
        frames += [link / query, link / response]
        frames.append(link / icmp_error(i, v6, client, bytes(query), bytes(response)))
    for i in range(4):  # TCP: a query, its response, then the client's port unreachable about a late segment
        client = f"10.4.{i}.7"
        seg = IP(src=client, dst=SERVER4) / TCP(sport=30000 + i, dport=53, flags="S", seq=1000)
        frames += [eth / seg, eth / (IP(src=SERVER4, dst=client) / TCP(sport=53, dport=30000 + i, flags="R", seq=1))]
        quote = bytes(IP(src=SERVER4, dst=client) / TCP(sport=53, dport=30000 + i, flags="SA"))[:28]
        frames.append(eth / IP(src=client, dst=SERVER4) / ICMP(type=3, code=3) / Raw(quote))
    for n, frame in enumerate(frames):
        frame.time = 1_700_000_000 + n / 1000
    wrpcap(str(path), frames)
    return len(frames)


def icmp_error(i, v6, client, query, response):
    """The i-th error: the client's port unreachable about the response (quoted whole or cut to 8 bytes past the IP
    header), or a router's time exceeded (about the query), packet too big (IPv6, about the response)."""
    kind = i // 2 % 3
    if not v6:
        if kind == 1:
            return IP(src=ROUTER4, dst=client) / ICMP(type=11, code=0) / Raw(query[:28])
        return IP(src=client, dst=SERVER4) / ICMP(type=3, code=3) / Raw(response if kind == 0 else response[:28])
    icmp_type, code, sender, quote = ((1, 4, client, response), (3, 0, ROUTER6, query), (2, 0, ROUTER6, response))[kind]
    head = bytes([icmp_type, code, 0, 0]) + (1280).to_bytes(4, "big")
    to = client if kind == 1 else SERVER6
    if i % 4 == 3:  # behind a hop-by-hop options header
        return IPv6(src=sender, dst=to) / IPv6ExtHdrHopByHop(nh=58) / Raw(head + quote)
    return IPv6(src=sender, dst=to, nh=58) / Raw(head + quote)


def address_events(out_dir):
    """The address-event-counts of every C-DNS file of a directory, added up: (type, code, address) -> count."""
    events = collections.Counter()
    for path in sorted(Path(out_dir).glob("*.cdns")):
        for block in cbor2.loads(path.read_bytes())[2]:
            ips = block[F.BLOCK_TABLES][F.IP_ADDRESS]
            for ev in block.get(F.ADDRESS_EVENT_COUNTS, []):
                address = ipaddress.ip_address(ips[ev[F.AE_ADDRESS_INDEX]])
                events[(ev[F.AE_TYPE], ev.get(F.AE_CODE), str(address))] += ev[F.AE_COUNT]
    return events


# IP lists that reject a router's errors (IPv6) and some clients with their errors (IPv4): in the kernel filter, they
# judge an error by its own addresses as the decoder does, and the kernel counts what they reject.
LISTS = ("--ipv4-deny", "10.3.0.0/20", "--ipv6-deny", ROUTER6 + "/128")


@pytest.mark.parametrize("lists", [(), LISTS], ids=["no-lists", "lists-in-kernel"])
def test_icmp_errors_about_dns_live_as_read(testbed, probes, out_dir, tmp_path, lists):
    pcap = tmp_path / "errors.pcap"
    frames = errors_about_dns(pcap)
    ref = tmp_path / "read"
    ref.mkdir()
    run_dnsprobe("read", pcap, "-o", ref, "-q", "--no-progress", "--format", "cdns", *lists)
    expected = json.loads(next(ref.glob("*.stats.json")).read_text())["counters"]
    if not lists:  # the capture is as meant
        assert expected["icmp_unreachable"] == 28 and expected["icmp_other_errors"] == 24
    else:
        assert expected["ip_filtered"] > 30 and expected["icmp_unreachable"] < 28 and expected["icmp_other_errors"] < 24

    probe = probes(testbed, out_dir, "--format", "cdns", *lists)
    probe.wait_ready()
    testbed.send(pcap, pps=1000)
    # Every frame is read or, rejected by the lists in the kernel filter, counted there (not in packets).
    probe.wait_for(lambda d: d["counters"]["packets"] + d["counters"]["ip_filtered"] >= frames, "every frame")
    assert probe.stop() == 0, probe.stderr
    doc = probe.stats()
    got = doc["counters"]
    assert got["kernel_received"] == got["packets"] and got["kernel_drops"] == 0  # the filter passed every error
    if lists:
        assert doc["ip_filter"] == "kernel"
        # The frames the lists reject never reach the ring: neither their count nor their bytes are read.
        unread = {"packets": expected["packets"] - got["ip_filtered"], "bytes": got["bytes"]}
        assert got == expected | unread | {"kernel_received": unread["packets"]}
    else:
        assert got == expected | {"kernel_received": frames}  # every other counter as read counts it
    events = address_events(ref)
    assert address_events(out_dir) == events
    kinds = {F.AE_TCP_RESET, F.AE_ICMP_DEST_UNREACHABLE, F.AE_ICMP_TIME_EXCEEDED, F.AE_ICMPV6_DEST_UNREACHABLE,
             F.AE_ICMPV6_TIME_EXCEEDED, F.AE_ICMPV6_PACKET_TOO_BIG}
    if lists:  # the IPv6 router's errors rejected
        kinds -= {F.AE_ICMPV6_TIME_EXCEEDED, F.AE_ICMPV6_PACKET_TOO_BIG}
    assert {t for t, _, _ in events} == kinds
