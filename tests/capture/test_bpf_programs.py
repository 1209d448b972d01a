"""The classic BPF programs of live capture, run by a small interpreter of the kernel's semantics
(support.run_cbpf) on the frames of every capture:

- the fanout program gives, for every Ethernet frame as the kernel's receive path holds it (support.received:
  the outer VLAN tag taken off, loads from the network header), exactly include/wire.h's flow_hash of the frame
  (the hash `dnsprobe read --workers` splits by), so a live worker gets the flows a read worker gets; frames
  with 0 to 3 VLAN tags of every kind too;
- the kernel filter keeps every frame from which the decoder takes a DNS message or a fragment of one, behind
  IPv6 extension headers too (hop-by-hop, routing, destination options, AH), and drops what is not DNS.
"""

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrHopByHop
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from support import SHARED_CAPTURES, bench_mix, build_traffic, edge_traffic, received, run_cbpf

from probe.capture.bpf import dns_filter, fanout_program
from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.decode import _decoderec
from probe.decode.ipfilter import IpFilter
from probe.decode.packets import PacketDecoder
from probe.model import LINKTYPE_ETHERNET, FrameBatch
from probe.stats import Stats


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpf")
    build_traffic(d / "traffic.pcap", 1, 300)
    edge_traffic(d / "edge.pcap")
    return [p for p in SHARED_CAPTURES if p.stat().st_size < 3_000_000] + [d / "traffic.pcap", d / "edge.pcap",
                                                                          bench_mix()]


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
        frame = bytes(Ether() / IPv6(src="2001:db8::1", dst="2001:db8::2") / ext / UDP(sport=4000, dport=53) / Raw(dns))
        assert run_cbpf(program, frame)
        other = bytes(Ether() / IPv6(src="2001:db8::1", dst="2001:db8::2") / ext / UDP(sport=4000, dport=80))
        assert not run_cbpf(program, other)
    deep = IPv6(src="2001:db8::1", dst="2001:db8::2")
    for _ in range(9):
        deep = deep / IPv6ExtHdrDestOpt()
    assert run_cbpf(program, bytes(Ether() / deep / UDP(sport=4000, dport=80)))  # beyond the walk: kept
    assert not run_cbpf(program, bytes(Ether() / IP() / UDP(sport=4000, dport=80)))


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
