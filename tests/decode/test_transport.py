"""Transport and link layers on generated traffic: UDP, DNS over TCP, IPv6 extension headers, IP fragments,
VLAN tags, link types, compressed inputs, statistics and the DNS port setting.

Every test builds packets with scapy, writes a real capture file (nanosecond pcap unless said otherwise), runs
the real `dnsprobe read` and checks the Parquet rows and the statistics JSON it wrote.
"""

import gzip
import json
import lzma
import struct
from decimal import Decimal

import pytest
import zstandard
from scapy.layers.dns import DNS, DNSQR, DNSRR, DNSRROPT, DNSRRSOA, EDNS0TLV, EDNS0ClientSubnet
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_Router_Alert, fragment
from scapy.layers.inet6 import (
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
    fragment6,
)
from scapy.layers.ipsec import AH
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Ether
from scapy.packet import Raw
from scapy.utils import PcapNgWriter
from support.dnsprobe import at_us, by_id, probe_run
from support.frames import (
    C4,
    C6,
    CPORT,
    ETH_IPV4,
    ETH_IPV6,
    MAC_C,
    NS,
    S4,
    S6,
    T0,
    TTL_C,
    TcpConn,
    ether,
    framed,
    ip_layer,
    total_len,
    udp_frame,
    udp_l3,
    write_pcap,
    write_pcapng_ns,
)
from support.messages import big_response, q_dns, r_dns

from export.parquet.schema import COLUMNS, DNSPROBE_COLUMNS


def test_udp_ipv4_pair_every_column(tmp_path):
    qdns = bytes(DNS(
        id=0x1234, rd=1, ad=1, cd=1, qd=[DNSQR(qname="www.Example.com", qtype="A")],
        ar=[DNSRROPT(rclass=1232, z=0x8000, rdata=[
            EDNS0TLV(optcode=5, optdata=b"\x08\x0d"),
            EDNS0TLV(optcode=6, optdata=b"\x01\x02"),
            EDNS0TLV(optcode=7, optdata=b"\x01"),
            EDNS0ClientSubnet(source_plen=24, address="192.0.2.0"),
            EDNS0TLV(optcode=10, optdata=b"cookie01"),
        ])],
    ))
    rdns = bytes(DNS(
        id=0x1234, qr=1, aa=1, tc=1, rd=1, ra=1, qd=[DNSQR(qname="www.Example.com", qtype="A")],
        an=[DNSRR(rrname="www.Example.com", type="A", ttl=300, rdata="203.0.113.10"),
            DNSRR(rrname="www.Example.com", type="A", ttl=300, rdata="203.0.113.11")],
        ns=[DNSRR(rrname="Example.com", type="NS", ttl=300, rdata="ns1.example.com")],
        ar=[DNSRR(rrname="ns1.example.com", type="A", ttl=300, rdata="203.0.113.53"),
            DNSRROPT(rclass=4096, z=0, rdata=[EDNS0TLV(optcode=3, optdata=b"ns1.example"),
                                               EDNS0TLV(optcode=15, optdata=b"\x00\x03")])],
    ))
    qf, rf = udp_frame(qdns), udp_frame(rdns, to_server=False)
    qts, rts = T0, T0 + 12_345_678
    rows, stats = probe_run(write_pcap(tmp_path / "udp.pcap", [(qts, qf), (rts, rf)]), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert list(row) == [name for name, _, _ in COLUMNS]
    assert len(DNSPROBE_COLUMNS) == 55
    expected = {
        "id": 0x1234,
        "unixtime": 1_597_844_513,
        "time": 1_597_844_513_851_855,
        "qname": "www.Example.com",
        "domainname": "example.com",
        "len": len(qf),
        "frag": 0,
        "ttl": TTL_C,
        "ipv": 4,
        "prot": 17,
        "src": C4,
        "srcp": CPORT,
        "dst": S4,
        "dstp": 53,
        "udp_sum": Ether(qf)[UDP].chksum,
        "dns_len": len(qdns),
        "aa": True,  # response
        "tc": True,  # response
        "rd": True,  # query
        "ra": False,  # query (the response has RA)
        "z": False,
        "ad": True,  # query (the response has no AD)
        "cd": True,  # query
        "ancount": 2,
        "arcount": 2,
        "nscount": 1,
        "qdcount": 1,
        "opcode": 0,
        "rcode": 0,
        "qtype": 1,
        "qclass": 1,
        "country": "",
        "asn": "",
        "edns_udp": 1232,
        "edns_version": 0,
        "edns_do": True,
        "edns_ping": False,
        "edns_nsid": "ns1.example",
        "edns_dnssec_dau": "8,13",
        "edns_dnssec_dhu": "1,2",
        "edns_dnssec_n3u": "1",
        "edns_client_subnet": "192.0.2.0/24",
        "edns_other": "8,10",
        "edns_client_subnet_asn": "",
        "edns_client_subnet_country": "",
        "labels": 3,
        "res_len": len(rf),
        "time_micro": 851_855,
        "resp_frag": 0,
        "proc_time": 0,
        "is_google": False,
        "is_opendns": False,
        "dns_res_len": len(rdns),
        "server_location": "",
        "tcp_hs_rtt": None,
        "timestamp": at_us(qts),
        "query_present": True,
        "response_present": True,
        "response_delay_us": 12_345,
        "query_time": at_us(qts),
        "response_time": at_us(rts),
        "vlan": None,
        "edns_ede": [3],
        "malformed": False,
        "response_messages": 1,
        "res_edns_udp": 4096,
        "transport": "udp",
        "dnstap_type": None,  # from packets, not dnstap
        "server_identity": None,
        # enrichment and answers are off by default: null
        "public_resolver": None,
        "registered_domain": None,
        "public_suffix": None,
        "answers": None,
    }
    # Guard the guard: the lengths really are those of the frames (Ethernet header included).
    assert len(qf) == 14 + 20 + 8 + len(qdns) and len(rf) == 14 + 20 + 8 + len(rdns)
    assert row == expected
    assert stats["packets"] == 2 and stats["bytes"] == len(qf) + len(rf)
    assert (stats["dns_messages"], stats["queries"], stats["responses"], stats["matched"]) == (2, 1, 1, 1)
    assert stats["fragments"] == 0  # the DF flag is not a fragment
    assert stats["records"] == 1


def test_ethernet_padding_and_ipv4_options(tmp_path):
    # A root priming query is short enough that Ethernet pads its frame; the response carries an IP option.
    qdns = q_dns(0x1235, ".", "NS")
    rdns = r_dns(0x1235, ".", "NS", answers=0)
    qf = udp_frame(qdns, cport=40001)
    ropt = ip_layer(False, options=[IPOption_Router_Alert()]) / UDP(sport=53, dport=40001) / Raw(rdns)
    rf = ether(bytes(ropt))
    assert len(qdns) == 17 and len(qf) == 60 and qf.endswith(b"\xee")  # 59 bytes + 1 of padding
    assert Ether(rf)[IP].ihl == 6
    rows, stats = probe_run(write_pcap(tmp_path / "pad.pcap", [(T0, qf), (T0 + 1000, rf)]), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert (row["dns_len"], row["len"], row["qtype"], row["labels"]) == (17, 60, 2, 0)
    assert (row["dns_res_len"], row["res_len"]) == (len(rdns), len(rf))
    assert row["response_present"] and not row["malformed"]
    assert stats["malformed"] == 0 and stats["truncated_frames"] == 0


# --- 2. DNS over TCP ----------------------------------------------------------------------------------------------


def test_tcp_message_split_over_segments_rtt_and_lengths(tmp_path):
    conn = TcpConn(41000)
    qdns, rdns = q_dns(0x0A01, "split.example.com"), r_dns(0x0A01, "split.example.com", answers=6)
    q, r = framed(qdns), framed(rdns)
    frames = conn.handshake(T0, T0 + 400_000, T0 + 1_234_567)
    # The first query segment carries half of the length prefix.
    qsegs = [conn.data("c", q[:1]), conn.data("c", q[1:20]), conn.data("c", q[20:])]
    rsegs = [conn.data("s", r[:100]), conn.data("s", r[100:])]
    frames += [(T0 + 2_000_000 + i * 100_000, f) for i, f in enumerate(qsegs)]
    frames += [(T0 + 5_000_000 + i * 500, f) for i, f in enumerate(rsegs)]
    frames += [(T0 + 6_000_000, conn.frame("c", "FA")), (T0 + 6_100_000, conn.frame("s", "FA"))]
    rows, stats = probe_run(write_pcap(tmp_path / "tcp.pcap", frames), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert row["tcp_hs_rtt"] == 1.234567  # client ACK − SYN, in ms
    assert (row["prot"], row["ipv"], row["udp_sum"], row["ttl"]) == (6, 4, 0, TTL_C)
    assert (row["src"], row["srcp"], row["dst"], row["dstp"]) == (C4, 41000, S4, 53)
    assert row["qname"] == "split.example.com" and row["ancount"] == 6
    assert row["len"] == total_len(*qsegs)  # summed over the three frames
    assert row["res_len"] == total_len(*rsegs)
    assert row["dns_len"] == len(qdns) and row["dns_res_len"] == len(rdns)  # without the 2-byte prefix
    assert row["query_time"] == at_us(T0 + 2_000_000)  # the segment carrying the first byte
    assert row["response_time"] == at_us(T0 + 5_000_000)
    assert row["response_delay_us"] == 3_000
    assert (row["query_present"], row["response_present"], row["malformed"]) == (True, True, False)
    assert stats["tcp_streams"] == 2
    assert stats["tcp_segments"] == 3 + 3 + 2 + 2
    assert (stats["tcp_retransmitted"], stats["tcp_out_of_order"], stats["tcp_dropped_bytes"]) == (0, 0, 0)
    assert stats["matched"] == 1


def test_tcp_two_messages_in_one_segment(tmp_path):
    conn = TcpConn(41001)
    q1, q2 = q_dns(1, "one.example.com"), q_dns(2, "two.example.com", qtype="AAAA")
    r1, r2 = r_dns(1, "one.example.com", answers=2), r_dns(2, "two.example.com", qtype="AAAA", answers=0)
    frames = conn.handshake(T0, T0 + 1000, T0 + 2000)
    qseg = conn.data("c", framed(q1) + framed(q2))
    # Pipelined answers out of order: r2 and the start of r1 in one segment, the rest of r1 in the next.
    rseg_a = conn.data("s", framed(r2) + framed(r1)[:10])
    rseg_b = conn.data("s", framed(r1)[10:])
    frames += [(T0 + 10_000, qseg), (T0 + 20_000, rseg_a), (T0 + 30_000, rseg_b)]
    rows, stats = probe_run(write_pcap(tmp_path / "tcp2.pcap", frames), tmp_path / "out")

    got = by_id(rows)
    assert set(got) == {1, 2}
    a, b = got[1], got[2]
    assert (a["qname"], a["qtype"], b["qname"], b["qtype"]) == ("one.example.com", 1, "two.example.com", 28)
    assert a["response_present"] and b["response_present"]
    assert a["len"] == b["len"] == len(qseg)
    assert (a["dns_len"], b["dns_len"]) == (len(q1), len(q2))
    assert (a["dns_res_len"], b["dns_res_len"]) == (len(r1), len(r2))
    assert b["res_len"] == len(rseg_a)
    assert a["res_len"] == len(rseg_a) + len(rseg_b)
    assert a["query_time"] == b["query_time"] == at_us(T0 + 10_000)
    assert (a["response_time"], b["response_time"]) == (at_us(T0 + 20_000), at_us(T0 + 20_000))
    assert a["tcp_hs_rtt"] == b["tcp_hs_rtt"] == 0.002
    assert (stats["dns_messages"], stats["matched"], stats["tcp_streams"]) == (4, 2, 2)


def test_tcp_retransmissions_make_no_duplicate_rows(tmp_path):
    conn = TcpConn(41002)
    qdns, rdns = q_dns(0x0B01, "retrans.example.com"), r_dns(0x0B01, "retrans.example.com", answers=3)
    q = framed(qdns)
    frames = conn.handshake(T0, T0 + 1000, T0 + 2000)
    seg1, seg2 = conn.data("c", q[:15]), conn.data("c", q[15:])
    rseg = conn.data("s", framed(rdns))
    frames += [(T0 + 10_000, seg1), (T0 + 11_000, seg1), (T0 + 12_000, seg2),
               (T0 + 20_000, rseg), (T0 + 21_000, rseg)]
    # Second connection: a retransmission that overlaps what was seen and carries new bytes after it.
    conn2 = TcpConn(41003)
    q2dns = q_dns(0x0B02, "overlap.example.com")
    q2 = framed(q2dns)
    frames += conn2.handshake(T0 + 30_000, T0 + 31_000, T0 + 32_000)
    start = conn2.next["c"]
    part = conn2.data("c", q2[:12])
    whole = conn2.frame("c", "PA", q2, seq=start)  # same start, whole message
    frames += [(T0 + 40_000, part), (T0 + 41_000, whole)]
    rows, stats = probe_run(write_pcap(tmp_path / "tcp3.pcap", frames), tmp_path / "out")

    got = by_id(rows)
    assert set(got) == {0x0B01, 0x0B02}
    row = got[0x0B01]
    assert row["len"] == len(seg1) + len(seg2)  # the duplicate frame is not counted
    assert row["res_len"] == len(rseg)
    assert row["query_time"] == at_us(T0 + 10_000) and row["response_time"] == at_us(T0 + 20_000)
    assert row["dns_len"] == len(qdns) and row["dns_res_len"] == len(rdns)
    over = got[0x0B02]
    assert over["qname"] == "overlap.example.com" and not over["response_present"]
    assert over["len"] == len(part) + len(whole)
    assert stats["tcp_retransmitted"] == 2
    assert (stats["dns_messages"], stats["queries"], stats["responses"]) == (3, 2, 1)
    assert stats["duplicate_queries"] == 0 and stats["matched"] == 1 and stats["query_only"] == 1


def test_tcp_reordered_segments(tmp_path):
    conn = TcpConn(41004)
    qdns, rdns = q_dns(0x0C01, "reorder.example.com"), r_dns(0x0C01, "reorder.example.com", answers=2)
    q, r = framed(qdns), framed(rdns)
    frames = conn.handshake(T0, T0 + 1000, T0 + 2000)
    seg1, seg2 = conn.data("c", q[:9]), conn.data("c", q[9:])
    rseg1, rseg2, rseg3 = conn.data("s", r[:30]), conn.data("s", r[30:60]), conn.data("s", r[60:])
    # The second query segment is captured first; the response arrives 3, 1, 2.
    frames += [(T0 + 10_000, seg2), (T0 + 11_000, seg1),
               (T0 + 20_000, rseg3), (T0 + 21_000, rseg1), (T0 + 22_000, rseg2)]
    rows, stats = probe_run(write_pcap(tmp_path / "tcp4.pcap", frames), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert row["qname"] == "reorder.example.com" and row["ancount"] == 2 and not row["malformed"]
    assert row["len"] == len(seg1) + len(seg2)
    assert row["res_len"] == len(rseg1) + len(rseg2) + len(rseg3)
    assert row["dns_len"] == len(qdns) and row["dns_res_len"] == len(rdns)
    # Stream order: a message's time is that of the segment carrying its first byte.
    assert row["query_time"] == at_us(T0 + 11_000) and row["response_time"] == at_us(T0 + 21_000)
    assert stats["tcp_out_of_order"] == 2
    assert stats["tcp_retransmitted"] == 0 and stats["tcp_dropped_bytes"] == 0
    assert stats["matched"] == 1


@pytest.mark.parametrize("parser", ["fast", "wire"])
def test_tcp_flood_of_tiny_held_segments_is_capped_and_counted(tmp_path, parser):
    # A direction first seen mid-stream with 1 byte, then tiny overlapping segments ahead of a gap: more than
    # decode.tcp_max_ooo_segments (set to 40) are dropped and counted; the gap's filler releases the rest; a
    # normal connection in between is exported.
    hostile, conn = TcpConn(41010, isn_c=70_000), TcpConn(41011)
    qdns, rdns = q_dns(0x0C11, "normal.example.com"), r_dns(0x0C11, "normal.example.com")
    frames = [(T0, hostile.frame("c", "PA", b"\x00", seq=70_000))]
    frames += [(T0 + 1000 + i, hostile.frame("c", "PA", b"\x00\x0c\x00", seq=70_002 + 2 * i)) for i in range(50)]
    frames += conn.handshake(T0 + 2000, T0 + 2100, T0 + 2200)
    frames += [(T0 + 3000, conn.data("c", framed(qdns))), (T0 + 3100, conn.data("s", framed(rdns)))]
    frames += [(T0 + 4000, hostile.frame("c", "PA", b"\x00\x0c", seq=70_001))]
    rows, stats = probe_run(write_pcap(tmp_path / "ooo.pcap", frames), tmp_path / "out", "--parser", parser,
                            "--set", "decode.tcp_max_ooo_segments=40")

    assert [r["qname"] for r in rows] == ["normal.example.com"] and rows[0]["response_present"]
    assert (stats["tcp_out_of_order"], stats["tcp_ooo_dropped"]) == (40, 10)
    assert stats["tcp_dropped_bytes"] >= 10 * 3


def test_tcp_connection_first_seen_mid_stream(tmp_path):
    # Sequence numbers wrap inside the query; no handshake is seen.
    conn = TcpConn(41005, isn_c=(1 << 32) - 10, isn_s=(1 << 32) - 3)
    qdns, rdns = q_dns(0x0D01, "mid.example.com"), r_dns(0x0D01, "mid.example.com")
    q, r = framed(qdns), framed(rdns)
    seg1, seg2 = conn.data("c", q[:10]), conn.data("c", q[10:])
    rseg1, rseg2 = conn.data("s", r[:40]), conn.data("s", r[40:])
    assert Ether(seg2)[TCP].seq == 0 and Ether(rseg2)[TCP].seq == 37
    # A second connection picked up in the middle of a message: its first bytes are a message's tail.
    conn2 = TcpConn(41006, isn_c=77_000, isn_s=88_000)
    q2dns, r2dns = q_dns(0x0D02, "resync.example.com"), r_dns(0x0D02, "resync.example.com")
    tail = conn2.data("c", b"\x00\x01\x00\x01")
    q2seg, r2seg = conn2.data("c", framed(q2dns)), conn2.data("s", framed(r2dns))
    frames = [(T0, conn.frame("c", "A")), (T0 + 1_000, seg1), (T0 + 2_000, seg2),
              (T0 + 3_000, rseg1), (T0 + 4_000, rseg2),
              (T0 + 10_000, tail), (T0 + 11_000, q2seg), (T0 + 12_000, r2seg)]
    rows, stats = probe_run(write_pcap(tmp_path / "tcp5.pcap", frames), tmp_path / "out")

    got = by_id(rows)
    assert set(got) == {0x0D01, 0x0D02}
    row = got[0x0D01]
    assert row["qname"] == "mid.example.com" and row["response_present"]
    assert row["tcp_hs_rtt"] is None  # no handshake seen
    assert row["len"] == len(seg1) + len(seg2) and row["res_len"] == len(rseg1) + len(rseg2)
    assert row["query_time"] == at_us(T0 + 1_000) and row["response_time"] == at_us(T0 + 3_000)
    assert (row["src"], row["srcp"], row["dst"], row["dstp"], row["prot"]) == (C4, 41005, S4, 53, 6)
    row2 = got[0x0D02]
    assert row2["qname"] == "resync.example.com" and row2["response_present"]
    assert row2["len"] == len(q2seg) and row2["query_time"] == at_us(T0 + 11_000)
    assert stats["tcp_streams"] == 4  # the bare ACK opens nothing; 2 connections × 2 directions
    assert stats["tcp_resync"] == 1 and stats["tcp_dropped_bytes"] == 4
    assert stats["matched"] == 2 and stats["malformed"] == 0


def test_tcp_fast_open_query_in_syn(tmp_path):
    # TCP Fast Open (RFC 7413), recommended for DNS by RFC 7766: the query rides on the SYN. Here the SYN is
    # retransmitted, and the client also resends the query after the handshake (as when the server's SYN/ACK
    # does not acknowledge the SYN's data): one query all the same.
    conn = TcpConn(41008)
    qdns, rdns = q_dns(0x0F01, "tfo.example.com"), r_dns(0x0F01, "tfo.example.com")
    syn = conn.frame("c", "S", framed(qdns))
    assert conn.next["c"] == 1000 + 1 + 2 + len(qdns)
    resent = conn.frame("c", "PA", framed(qdns), seq=1001)
    frames = [(T0, syn), (T0 + 500, syn), (T0 + 1000, conn.frame("s", "SA")), (T0 + 2000, conn.frame("c", "A")),
              (T0 + 2500, resent), (T0 + 3000, conn.data("s", framed(rdns)))]
    rows, stats = probe_run(write_pcap(tmp_path / "tfo.pcap", frames), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert row["query_present"] and row["response_present"]
    assert (row["qname"], row["len"], row["dns_len"], row["query_time"]) == (
        "tfo.example.com", len(syn), len(qdns), at_us(T0))
    assert row["tcp_hs_rtt"] == 0.0015  # from the (retransmitted) SYN that was answered
    assert (stats["dns_messages"], stats["duplicate_queries"], stats["matched"]) == (2, 0, 1)
    assert stats["tcp_retransmitted"] == 2 and stats["tcp_dropped_bytes"] == 0


def test_tcp_over_ipv6(tmp_path):
    conn = TcpConn(41007, v6=True)
    qdns, rdns = q_dns(0x0E01, "six.example.com", "AAAA"), r_dns(0x0E01, "six.example.com", "AAAA", answers=0)
    frames = conn.handshake(T0, T0 + 500_000, T0 + 750_000)
    qseg, rseg = conn.data("c", framed(qdns)), conn.data("s", framed(rdns))
    frames += [(T0 + 800_000, qseg), (T0 + 900_000, rseg)]
    rows, _ = probe_run(write_pcap(tmp_path / "tcp6.pcap", frames), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert (row["ipv"], row["prot"], row["src"], row["dst"], row["ttl"]) == (6, 6, C6, S6, TTL_C)
    assert row["tcp_hs_rtt"] == 0.75
    assert row["len"] == len(qseg) and row["res_len"] == len(rseg) and row["dns_len"] == len(qdns)


# --- 3. IPv6 extension headers ---------------------------------------------------------------------------------


def test_ipv6_extension_headers_before_udp(tmp_path):
    qdns = q_dns(0x6E01, "ext.example.org", "AAAA")
    soa = DNSRR(rrname="example.org", type="SOA", ttl=3600,
                rdata=b"\x02ns\x00\x04host\x00" + struct.pack("!IIIII", 1, 2, 3, 4, 5))
    rdns = bytes(DNS(id=0x6E01, qr=1, rd=1, ra=1, rcode=3, qd=[DNSQR(qname="ext.example.org", qtype="AAAA")],
                     ns=[soa]))
    ext = IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt() / IPv6ExtHdrRouting(addresses=["2001:db8::99"])
    qf = udp_frame(qdns, v6=True, ext=ext, cport=40600)
    # The response goes through an authentication header and a destination-options header.
    ah = AH(nh=60, payloadlen=4, spi=0x100, seq=1, icv=bytes(12)) / IPv6ExtHdrDestOpt()
    rf = udp_frame(rdns, to_server=False, v6=True, ext=ah, cport=40600)
    rows, stats = probe_run(write_pcap(tmp_path / "v6.pcap", [(T0, qf), (T0 + 2_000_001, rf)]), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    want = {
        "ipv": 6, "prot": 17, "src": C6, "srcp": 40600, "dst": S6, "dstp": 53, "ttl": TTL_C,
        "qname": "ext.example.org", "domainname": "example.org", "qtype": 28, "labels": 3,
        "rcode": 3, "ancount": 0, "nscount": 1, "len": len(qf), "res_len": len(rf),
        "dns_len": len(qdns), "dns_res_len": len(rdns), "udp_sum": Ether(qf)[UDP].chksum,
        "query_time": at_us(T0), "response_time": at_us(T0 + 2_000_001), "response_delay_us": 2_000,
        "malformed": False, "vlan": None,
    }
    assert {k: row[k] for k in want} == want
    assert len(qf) == 14 + 40 + 8 + 8 + 24 + 8 + len(qdns)  # the extension headers are part of the frame
    assert stats["non_dns"] == 0 and stats["truncated_frames"] == 0


# --- 4. IP fragments --------------------------------------------------------------------------------------------


def test_ipv4_fragments_out_of_order_reassembled(tmp_path):
    qdns, rdns = q_dns(0x4F01, "big.example.com", "TXT"), big_response(0x4F01)
    qf = udp_frame(qdns, cport=40700)
    dgram = ip_layer(False, id=4242) / UDP(sport=53, dport=40700) / Raw(rdns)
    frags = [ether(bytes(f)) for f in fragment(dgram, fragsize=1200)]
    assert len(frags) == 3 and len(rdns) > 2400
    f1, f2, f3 = frags
    # Last fragment first, the first one duplicated.
    cap = [(T0, qf), (T0 + 1_000_000, f3), (T0 + 1_000_100, f1), (T0 + 1_000_200, f1), (T0 + 1_000_300, f2)]
    rows, stats = probe_run(write_pcap(tmp_path / "frag4.pcap", cap), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert row["response_present"] and not row["malformed"]
    assert (row["qname"], row["qtype"], row["ancount"]) == ("big.example.com", 16, 14)
    assert row["dns_res_len"] == len(rdns)
    assert row["res_len"] == len(f1) + len(f2) + len(f3)  # the duplicate fragment is not counted
    assert row["response_time"] == at_us(T0 + 1_000_000)  # first fragment captured
    assert row["response_delay_us"] == 1_000
    assert (stats["fragments"], stats["fragments_reassembled"], stats["fragments_dropped"]) == (4, 1, 1)
    assert stats["matched"] == 1 and stats["non_dns"] == 0


def test_ipv4_many_overlapping_fragments_reassembled(tmp_path):
    # A response in 64-byte fragments 8 bytes apart (each overlapping the next seven), last one first and
    # the rest backwards: the datagram holds its own bytes once (bounded), each fragment adds 8 new ones.
    qdns, rdns = q_dns(0x4F02, "big.example.com", "TXT"), big_response(0x4F02)
    udp = bytes(UDP(sport=53, dport=40701) / Raw(rdns))
    last = (len(udp) - 1) // 8 * 8
    frames = [(T0, udp_frame(qdns, cport=40701))]
    for i, off in enumerate(range(last, -1, -8)):
        ip = ip_layer(False, id=4343, proto=17, frag=off // 8, flags=0 if off == last else "MF")
        frames.append((T0 + 1_000_000 + i, ether(bytes(ip / Raw(udp[off : off + 64])))))
    rows, stats = probe_run(write_pcap(tmp_path / "overlap.pcap", frames), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert row["response_present"] and not row["malformed"] and row["ancount"] == 14
    assert row["dns_res_len"] == len(rdns) and row["res_len"] == sum(len(f) for _, f in frames[1:])
    assert (stats["fragments"], stats["fragments_reassembled"], stats["fragments_dropped"]) == (len(frames) - 1, 1, 0)


def test_ipv4_tiny_last_fragment_unpadded(tmp_path):
    # Captured on the sending host: the last fragment holds 4 bytes and its frame, 38 bytes, has no padding.
    qdns = q_dns(0x4F03, "tiny.example.com", "NULL")
    rdns = bytes(DNS(id=0x4F03, qr=1, rd=1, ra=1, qd=[DNSQR(qname="tiny.example.com", qtype="NULL")],
                     an=[DNSRR(rrname="tiny.example.com", type="NULL", ttl=60, rdata=b"x" * 1134)]))
    dgram = bytes(UDP(sport=53, dport=40705, len=8 + len(rdns), chksum=0) / Raw(rdns))
    assert len(dgram) == 1204
    head = ether(bytes(ip_layer(False, id=99, flags="MF", frag=0, proto=17) / Raw(dgram[:1200])), pad=False)
    tail = ether(bytes(ip_layer(False, id=99, frag=150, proto=17) / Raw(dgram[1200:])), pad=False)
    assert len(tail) == 38
    cap = [(T0, udp_frame(qdns, cport=40705)), (T0 + 1000, head), (T0 + 2000, tail)]
    rows, stats = probe_run(write_pcap(tmp_path / "tiny.pcap", cap), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert row["response_present"] and not row["malformed"] and row["ancount"] == 1
    assert (row["dns_res_len"], row["res_len"]) == (len(rdns), len(head) + len(tail))
    assert (stats["fragments"], stats["fragments_reassembled"], stats["truncated_frames"]) == (2, 1, 0)


def test_ipv6_fragments_reassembled(tmp_path):
    qdns, rdns = q_dns(0x6F01, "big.example.com", "TXT"), big_response(0x6F01)
    qf = udp_frame(qdns, v6=True, cport=40701)
    dgram = ip_layer(False, v6=True) / IPv6ExtHdrFragment(id=0xABCDEF) / UDP(sport=53, dport=40701) / Raw(rdns)
    frags = [ether(bytes(f)) for f in fragment6(dgram, 1280)]
    assert len(frags) == 3
    cap = [(T0, qf)] + [(T0 + 500_000 + i, f) for i, f in enumerate(reversed(frags))]
    rows, stats = probe_run(write_pcap(tmp_path / "frag6.pcap", cap), tmp_path / "out")

    assert len(rows) == 1
    row = rows[0]
    assert row["response_present"] and row["ipv"] == 6 and row["ancount"] == 14 and not row["malformed"]
    assert row["dns_res_len"] == len(rdns)
    assert row["res_len"] == total_len(*frags)
    assert row["response_time"] == at_us(T0 + 500_000)
    assert (stats["fragments"], stats["fragments_reassembled"], stats["fragments_dropped"]) == (3, 1, 0)


def test_incomplete_fragment_sets_are_dropped_and_counted(tmp_path):
    # IPv4: the middle fragment is missing until after the timeout; IPv6: only the first fragment.
    q4, r4 = q_dns(0x4F02, "big.example.com", "TXT"), big_response(0x4F02)
    f1, f2, f3 = [ether(bytes(f)) for f in fragment(
        ip_layer(False, id=7) / UDP(sport=53, dport=40702) / Raw(r4), fragsize=1200)]
    q6, r6 = q_dns(0x6F02, "big.example.com", "TXT"), big_response(0x6F02)
    g1 = ether(bytes(fragment6(
        ip_layer(False, v6=True) / IPv6ExtHdrFragment(id=9) / UDP(sport=53, dport=40703) / Raw(r6), 1280)[0]))
    later_q, later_r = q_dns(0x0001, "later.example.com"), r_dns(0x0001, "later.example.com")
    cap = [
        (T0, udp_frame(q4, cport=40702)), (T0 + 100, f1), (T0 + 200, f3),
        (T0 + 300, udp_frame(q6, v6=True, cport=40703)), (T0 + 400, g1),
        # 10 s later (fragment timeout 5 s): the held fragments expire; the late one starts a new set.
        (T0 + 10 * NS, udp_frame(later_q, cport=40704)), (T0 + 10 * NS + 100, f2),
        (T0 + 10 * NS + 200, udp_frame(later_r, to_server=False, cport=40704)),
    ]
    # One frame per batch, so the expiry sweep runs in the middle of the file.
    rows, stats = probe_run(write_pcap(tmp_path / "fragx.pcap", cap), tmp_path / "out", "--set", "run.batch_size=1")

    got = by_id(rows)
    assert set(got) == {0x4F02, 0x6F02, 0x0001}
    assert not got[0x4F02]["response_present"] and not got[0x6F02]["response_present"]
    assert got[0x0001]["response_present"]
    assert (stats["fragments"], stats["fragments_reassembled"], stats["fragments_dropped"]) == (4, 0, 4)
    assert stats["query_only"] == 2 and stats["matched"] == 1 and stats["packets"] == len(cap)


def test_length_sums_over_int32_are_capped_and_counted(tmp_path):
    # Forged original lengths (a pcap can claim up to 2^31-1 per frame) summed over a TCP message's
    # segments, a datagram's fragments and a zone transfer's messages pass the int32 columns' maximum.
    big, huge = 0x40000000, 0x7FFFFFF0
    conn = TcpConn(41500)
    q = framed(q_dns(0x7C01, "tcp.example.com"))
    r = framed(r_dns(0x7C01, "tcp.example.com"))
    cap = [(T0 + i, f) for i, f in enumerate(f for _, f in conn.handshake(0, 0, 0))]
    cap += [(T0 + 10, conn.data("c", q[:10]), huge), (T0 + 11, conn.data("c", q[10:]), huge)]
    cap += [(T0 + 20, conn.data("s", r))]

    qf, rf = q_dns(0x7C02, "big.example.com", "TXT"), big_response(0x7C02)
    frags = [ether(bytes(f)) for f in fragment(
        ip_layer(False, id=77) / UDP(sport=53, dport=41501) / Raw(rf), fragsize=1200)]
    cap += [(T0 + 30, udp_frame(qf, cport=41501))] + [(T0 + 31 + i, f, big) for i, f in enumerate(frags)]

    xfr = TcpConn(41502)
    soa = DNSRRSOA(rrname="zone.example", mname="ns.zone.example", rname="h.zone.example", serial=7)
    a = DNSRR(rrname="a.zone.example", type="A", rdata="192.0.2.7")
    qx = q_dns(0x7C03, "zone.example", "AXFR")
    rx = [bytes(DNS(id=0x7C03, qr=1, aa=1, qd=[DNSQR(qname="zone.example", qtype="AXFR")] if i == 0 else [],
                    an=an)) for i, an in enumerate([[soa, a], [a], [a, soa]])]
    cap += [(T0 + 40 + i, f) for i, f in enumerate(f for _, f in xfr.handshake(0, 0, 0))]
    cap += [(T0 + 50, xfr.data("c", framed(qx)))] + [(T0 + 51 + i, xfr.data("s", framed(m)), big)
                                                     for i, m in enumerate(rx)]
    rows, stats = probe_run(write_pcap(tmp_path / "forged.pcap", cap), tmp_path / "out")

    got = by_id(rows)
    assert set(got) == {0x7C01, 0x7C02, 0x7C03} and all(r["response_present"] for r in rows)
    assert got[0x7C01]["len"] == 0x7FFFFFFF and got[0x7C01]["res_len"] == len(cap[5][1])
    assert got[0x7C02]["res_len"] == 0x7FFFFFFF and got[0x7C02]["dns_res_len"] == len(rf)
    assert got[0x7C03]["res_len"] == 0x7FFFFFFF and got[0x7C03]["response_messages"] == 3
    assert got[0x7C03]["dns_res_len"] == sum(map(len, rx)) and got[0x7C03]["ancount"] == 5
    assert stats["lengths_capped"] == 3
    assert stats["bytes"] == sum(c[2] if len(c) > 2 else len(c[1]) for c in cap)  # the frames' own lengths


# --- 5. VLAN tags -----------------------------------------------------------------------------------------------


def test_vlan_tags_outer_id(tmp_path):
    cases = [  # (id, cport, vlans, tag protocol ids, ipv6)
        (0x5101, 40801, (100,), (0x8100,), False),
        (0x5102, 40802, (200, 300), (0x88A8, 0x8100), False),  # 802.1ad service tag + 802.1Q
        (0x5103, 40803, (400, 401), (0x9100, 0x8100), True),  # pre-standard QinQ, IPv6 inside
        (0x5104, 40804, (4094,), (0x8100,), True),
    ]
    cap, lens = [], {}
    for i, (qid, cport, vlans, tpids, v6) in enumerate(cases):
        qf = ether(udp_l3(q_dns(qid, f"v{qid:x}.example.net"), cport=cport, v6=v6), vlans, tpids)
        rf = ether(udp_l3(r_dns(qid, f"v{qid:x}.example.net"), to_server=False, cport=cport, v6=v6), vlans, tpids)
        cap += [(T0 + i * 1000, qf), (T0 + i * 1000 + 500, rf)]
        lens[qid] = (len(qf), len(rf))
    rows, stats = probe_run(write_pcap(tmp_path / "vlan.pcap", cap), tmp_path / "out")

    got = by_id(rows)
    assert {qid: got[qid]["vlan"] for qid in got} == {0x5101: 100, 0x5102: 200, 0x5103: 400, 0x5104: 4094}
    assert {qid: (got[qid]["len"], got[qid]["res_len"]) for qid in got} == lens  # tags included
    assert lens[0x5102][0] == lens[0x5101][0] + 4
    assert {qid: got[qid]["ipv"] for qid in got} == {0x5101: 4, 0x5102: 4, 0x5103: 6, 0x5104: 6}
    assert all(r["response_present"] for r in rows)
    assert stats["non_ip"] == 0 and stats["matched"] == 4


# --- 6. link types, pcapng, compression -------------------------------------------------------------------------

# An exchange over IPv4 and IPv6 as bare IP packets, wrapped per link type below.
_EXCHANGE = [
    (T0, udp_l3(q_dns(0x7001, "link.example.com"), cport=40901)),
    (T0 + 1_500_999, udp_l3(r_dns(0x7001, "link.example.com", answers=2), to_server=False, cport=40901)),
    (T0 + 2_000_000, udp_l3(q_dns(0x7002, "link6.example.com", "AAAA"), cport=40902, v6=True)),
    (T0 + 2_000_007, udp_l3(r_dns(0x7002, "link6.example.com", "AAAA", answers=0), to_server=False, cport=40902,
                            v6=True)),
]


def _etype(l3):
    return ETH_IPV6 if l3[0] >> 4 == 6 else ETH_IPV4


def _sll(l3):
    return bytes(CookedLinux(pkttype=0, lladdrtype=1, lladdrlen=6, src=bytes.fromhex("02000000000c0000"),
                             proto=_etype(l3)) / Raw(l3))


def _sll2(l3):
    return bytes(CookedLinuxV2(proto=_etype(l3), ifindex=3, lladdrtype=1, pkttype=4, lladdrlen=6,
                               src=bytes.fromhex("02000000000c0000")) / Raw(l3))


def _null(l3):
    # BSD loopback: address family in the capturing host's byte order (here little-endian; 30 = macOS AF_INET6).
    return struct.pack("<I", 30 if l3[0] >> 4 == 6 else 2) + l3


def _loop(l3):
    # OpenBSD loopback: address family in network byte order (24 = OpenBSD AF_INET6).
    return struct.pack(">I", 24 if l3[0] >> 4 == 6 else 2) + l3


# name -> (linktype, wrap, link header length)
LINKS = {
    "sll": (113, _sll, 16),
    "sll2": (276, _sll2, 20),
    "raw": (101, lambda l3: l3, 0),
    "null": (0, _null, 4),
    "loop": (108, _loop, 4),
}


def _compress(kind, data):
    if kind == "gz":
        return gzip.compress(data)
    if kind == "xz":
        return lzma.compress(data)
    return zstandard.ZstdCompressor().compress(data)


@pytest.fixture(scope="module")
def ethernet_reference(tmp_path_factory):
    """Rows of the exchange in a plain Ethernet nanosecond pcap."""
    d = tmp_path_factory.mktemp("eth")
    pcap = write_pcap(d / "eth.pcap", [(ts, ether(l3)) for ts, l3 in _EXCHANGE])
    rows, _ = probe_run(pcap, d / "out")
    return pcap, rows


def test_ethernet_reference_rows(ethernet_reference):
    _, rows = ethernet_reference
    got = by_id(rows)
    assert set(got) == {0x7001, 0x7002}
    want = {
        0x7001: (4, 14 + len(_EXCHANGE[0][1]), 14 + len(_EXCHANGE[1][1]), at_us(T0), at_us(T0 + 1_500_999), 1_500),
        0x7002: (6, 14 + len(_EXCHANGE[2][1]), 14 + len(_EXCHANGE[3][1]), at_us(T0 + 2_000_000),
                 at_us(T0 + 2_000_007), 0),
    }
    for qid, row in got.items():
        assert (row["ipv"], row["len"], row["res_len"], row["query_time"], row["response_time"],
                row["response_delay_us"]) == want[qid]


def _shift_lengths(rows, delta):
    return [{**r, "len": r["len"] + delta, "res_len": r["res_len"] + delta} for r in rows]


@pytest.mark.parametrize("name", sorted(LINKS))
def test_link_types_give_the_same_rows(name, ethernet_reference, tmp_path):
    linktype, wrap, hlen = LINKS[name]
    pcap = write_pcap(tmp_path / f"{name}.pcap", [(ts, wrap(l3)) for ts, l3 in _EXCHANGE], linktype=linktype)
    assert pcap.read_bytes()[20:24] == struct.pack("<I", linktype)
    rows, stats = probe_run(pcap, tmp_path / "out")
    assert rows == _shift_lengths(ethernet_reference[1], hlen - 14)
    assert stats["non_ip"] == 0 and stats["truncated_frames"] == 0


@pytest.mark.parametrize("kind", ["gz", "xz", "zst"])
def test_compressed_pcap_gives_the_same_rows(kind, ethernet_reference, tmp_path):
    pcap, want = ethernet_reference
    packed = tmp_path / f"eth.pcap.{kind}"
    packed.write_bytes(_compress(kind, pcap.read_bytes()))
    rows, _ = probe_run(packed, tmp_path / "out")
    assert rows == want


def test_pcapng_nanosecond_gives_the_same_rows(ethernet_reference, tmp_path):
    pcap = write_pcapng_ns(tmp_path / "eth.pcapng", [(ts, ether(l3)) for ts, l3 in _EXCHANGE])
    rows, _ = probe_run(pcap, tmp_path / "out")
    assert rows == ethernet_reference[1]


def test_pcapng_scapy_microseconds(ethernet_reference, tmp_path):
    path = tmp_path / "scapy.pcapng"
    writer = PcapNgWriter(str(path))
    for ts, l3 in _EXCHANGE:
        pkt = Ether(ether(l3))
        pkt.time = Decimal(ts) / NS
        writer.write(pkt)
    writer.close()
    rows, _ = probe_run(path, tmp_path / "out")
    # Same rows, with the time stamps cut to the microsecond the file holds.
    want = []
    for r in ethernet_reference[1]:
        qt, rt = r["query_time"] // 1000 * 1000, r["response_time"] // 1000 * 1000
        want.append({**r, "query_time": qt, "response_time": rt, "response_delay_us": (rt - qt) // 1000})
    assert rows == want
    assert [r["response_delay_us"] for r in rows] == [1_501, 0]


# --- 7. statistics JSON -----------------------------------------------------------------------------------------


def test_stats_json_counts_what_happened(tmp_path):
    qdns, rdns = q_dns(0x7A01, "stats.example.com"), r_dns(0x7A01, "stats.example.com")
    qf, rf = udp_frame(qdns, cport=41100), udp_frame(rdns, to_server=False, cport=41100)
    mdns = udp_frame(q_dns(0, "printer.local"), cport=5353, port=5353)
    arp = bytes(Ether(src=MAC_C, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=C4, pdst=S4, hwsrc=MAC_C))
    ping = ether(bytes(ip_layer(True) / ICMP(type=8) / Raw(b"ping")))
    other_tcp = ether(bytes(ip_layer(True) / TCP(sport=41101, dport=443, flags="S")))
    conn = TcpConn(41102)
    tdns, tres = q_dns(0x7A02, "tcp.example.com"), r_dns(0x7A02, "tcp.example.com")
    tcp = conn.handshake(T0 + 10, T0 + 20, T0 + 30)
    tcp += [(T0 + 40, conn.data("c", framed(tdns))), (T0 + 50, conn.data("s", framed(tres)))]
    # A port-unreachable error quoting a query, and a query frame cut by a 50-byte snaplen.
    quoted = bytes(ip_layer(True) / UDP(sport=41103, dport=53) / Raw(q_dns(0x7A03)))[:28]  # IP header + 8 bytes
    unreach = ether(bytes(ip_layer(False) / ICMP(type=3, code=3) / Raw(quoted)))
    cut = udp_frame(q_dns(0x7A04, "cut.example.com"), cport=41104)
    # IPv6 "no next header" with nothing after it, unpadded (sending host): a 54-byte frame that is not DNS.
    nothing6 = ether(bytes(ip_layer(True, v6=True, nh=59)), pad=False)
    assert len(nothing6) == 54
    cap = [(T0, qf), (T0 + 1, mdns), (T0 + 2, arp), (T0 + 3, ping), (T0 + 4, other_tcp), (T0 + 5, rf),
           (T0 + 6, unreach), (T0 + 7, cut[:50], len(cut)), (T0 + 8, nothing6)] + tcp
    out = tmp_path / "out"
    rows, c = probe_run(write_pcap(tmp_path / "stats.pcap", cap), out)

    assert len(rows) == 2
    assert c["packets"] == len(cap) == 14
    assert c["bytes"] == sum(len(f) for _, f, *_ in cap) + len(cut) - 50  # wire lengths
    assert c["non_ip"] == 1  # ARP
    assert c["non_dns"] == 4  # port 5353, ICMP echo, TCP to 443, IPv6 without payload
    assert c["icmp_unreachable"] == 1 and c["truncated_frames"] == 1
    assert (c["tcp_segments"], c["tcp_streams"]) == (5, 2)
    assert (c["dns_messages"], c["queries"], c["responses"], c["malformed"]) == (4, 2, 2, 0)
    assert (c["matched"], c["query_only"], c["response_only"]) == (2, 0, 0)
    assert (c["records"], c["files"]) == (2, 1)
    doc = json.loads(next(out.glob("*.stats.json")).read_text())
    assert doc["errors"] == [] and len(doc["files_written"]) == 1
    assert sorted(p.name for p in out.glob("*.parquet")) == doc["files_written"]


# --- 8. configurable DNS port -----------------------------------------------------------------------------------


@pytest.fixture
def two_port_pcap(tmp_path):
    cap = [
        (T0, udp_frame(q_dns(0x8001, "alt.example.com"), cport=41200, port=5353)),
        (T0 + 1000, udp_frame(r_dns(0x8001, "alt.example.com"), to_server=False, cport=41200, port=5353)),
        (T0 + 2000, udp_frame(q_dns(0x8002, "std.example.com"), cport=41201)),
        (T0 + 3000, udp_frame(r_dns(0x8002, "std.example.com"), to_server=False, cport=41201)),
    ]
    return write_pcap(tmp_path / "ports.pcap", cap)


@pytest.mark.parametrize(
    "flags, ids, non_dns",
    [
        ((), {0x8002}, 2),
        (("--dns-port", "5353"), {0x8001}, 2),
        (("--dns-port", "53", "--dns-port", "5353"), {0x8001, 0x8002}, 0),
    ],
)
def test_dns_port_setting(two_port_pcap, tmp_path, flags, ids, non_dns):
    rows, stats = probe_run(two_port_pcap, tmp_path / "out", *flags)
    got = by_id(rows)
    assert set(got) == ids
    for qid, row in got.items():
        port = 5353 if qid == 0x8001 else 53
        assert (row["dstp"], row["srcp"], row["response_present"]) == (port, 41200 + (qid - 0x8001), True)
    assert stats["non_dns"] == non_dns and stats["matched"] == len(ids)


def test_dns_port_5353_only_ignores_everything_on_53(tmp_path):
    cap = [(T0, udp_frame(q_dns(0x8003, "std.example.com"), cport=41202)),
           (T0 + 1000, udp_frame(r_dns(0x8003, "std.example.com"), to_server=False, cport=41202))]
    rows, stats = probe_run(write_pcap(tmp_path / "p53.pcap", cap), tmp_path / "out", "--dns-port", "5353")
    assert rows == []
    assert (stats["packets"], stats["non_dns"], stats["dns_messages"], stats["records"]) == (2, 2, 0, 0)
