"""DNS content end to end: scapy writes real pcap files, the real `dnsprobe read` decodes them, and
the Parquet rows are read back and checked value by value.

Covers EDNS (NSID, client subnet, cookies, DAU/DHU/N3U, DO, version, UDP size, extended RCODE,
extended DNS errors), TC, RR types dpkt cannot parse (HTTPS, SVCB, RRSIG, DNSKEY, DS, CAA, an
unassigned type) under both parsers, non-UTF-8 QNAME bytes, malformed and truncated messages, the rows of
unmatched queries and responses, QNAME case kept, and an AXFR over TCP, its messages reassembled and merged into
one row. What matching does (timeouts, question mismatch, retries, zone transfers, bounds) is tested on the
matcher itself, in tests/match/test_semantics.py.
"""

import json
import struct

from scapy.all import (
    DNS,
    DNSQR,
    DNSRR,
    DNSRRDNSKEY,
    DNSRRDS,
    DNSRRHTTPS,
    DNSRROPT,
    DNSRRRSIG,
    DNSRRSOA,
    DNSRRSVCB,
    EDNS0COOKIE,
    EDNS0DAU,
    EDNS0DHU,
    EDNS0N3U,
    EDNS0TLV,
    IP,
    TCP,
    UDP,
    EDNS0ClientSubnet,
    EDNS0ExtendedDNSError,
    Ether,
    IPv6,
    Raw,
    wrpcap,
)
from support.dnsprobe import dnsprobe_read

T0 = 1_600_000_000  # capture time base, whole seconds (exact in the pcap's microsecond timestamps)
CLIENT4, SERVER4 = "192.0.2.1", "198.51.100.53"
CLIENT6, SERVER6 = "2001:db8::1", "2001:db8::53"

# Response-side and query-side columns: null when that side is absent.
RESPONSE_COLUMNS = (
    "aa", "tc", "ancount", "arcount", "nscount", "rcode", "edns_nsid", "res_len", "dns_res_len",
    "response_time", "response_delay_us", "edns_ede", "response_messages", "res_edns_udp",
)
QUERY_COLUMNS = (
    "len", "ttl", "udp_sum", "dns_len", "rd", "ra", "z", "ad", "cd", "qdcount", "edns_udp", "edns_version",
    "edns_do", "edns_dnssec_dau", "edns_dnssec_dhu", "edns_dnssec_n3u", "edns_client_subnet", "edns_other",
    "query_time", "response_delay_us",
)


def _ip(src, dst):
    return (IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst))


def udp(t, src, sport, dst, dport, dns):
    """One UDP frame carrying `dns` (a scapy DNS layer or raw bytes) at capture time T0 + t."""
    payload = Raw(load=dns) if isinstance(dns, bytes) else dns
    pkt = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / _ip(src, dst) / UDP(sport=sport, dport=dport)
    pkt = pkt / payload
    pkt.time = T0 + t
    return pkt


def query(t, dns, sport=40000, client=CLIENT4, server=SERVER4):
    return udp(t, client, sport, server, 53, dns)


def response(t, dns, sport=40000, client=CLIENT4, server=SERVER4):
    return udp(t, server, 53, client, sport, dns)


def opt(udp_size=1232, do=False, version=0, ext_rcode=0, options=()):
    return DNSRROPT(rclass=udp_size, z=0x8000 if do else 0, version=version, extrcode=ext_rcode, rdata=list(options))


def run(tmp_path, pkts, *extra, name="capture"):
    """Write PKTS to a pcap, run `dnsprobe read` on it; returns (rows, stats counters)."""
    pcap = tmp_path / f"{name}.pcap"
    wrpcap(str(pcap), pkts)
    out = tmp_path / f"out-{name}"
    out.mkdir()
    rows = dnsprobe_read(pcap, out, *extra)
    (stats_file,) = out.glob("*.stats.json")
    return rows, json.loads(stats_file.read_text())["counters"]


def by_id(rows):
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate ids in {ids}"
    return {r["id"]: r for r in rows}


def frame_len(pkt):
    return len(bytes(pkt))


# --------------------------------------------------------------------------------------------------
# EDNS


def test_edns_options(tmp_path):
    q1 = DNS(
        id=0x0101, rd=1, qd=DNSQR(qname="edns.example", qtype="A"),
        ar=opt(1232, do=True, options=[
            EDNS0TLV(optcode=3, optlen=0),  # NSID request: empty
            EDNS0ClientSubnet(source_plen=24, address="192.0.2.0"),
            EDNS0COOKIE(client_cookie=b"\x01\x02\x03\x04\x05\x06\x07\x08"),
            EDNS0DAU(alg_code=[8, 13]),
            EDNS0DHU(alg_code=[1, 2]),
            EDNS0N3U(alg_code=[1]),
        ]),
    )
    r1 = DNS(
        id=0x0101, qr=1, aa=1, rd=1, qd=DNSQR(qname="edns.example", qtype="A"),
        an=DNSRR(rrname="edns.example", type="A", rdata="192.0.2.80"),
        ar=opt(4096, options=[EDNS0TLV(optcode=3, optdata=b"ns1.example")]),
    )
    # IPv6 client subnet, EDNS version 1, answered BADVERS (extended RCODE 16: ext 1 << 4 | 0).
    q2 = DNS(
        id=0x0102, qd=DNSQR(qname="v6.example", qtype="AAAA"),
        ar=opt(1400, version=1, options=[EDNS0ClientSubnet(family=2, source_plen=48, address="2001:db8:1234::")]),
    )
    r2 = DNS(id=0x0102, qr=1, qd=DNSQR(qname="v6.example", qtype="AAAA"), ar=opt(1232, ext_rcode=1))
    # Extended DNS errors in a SERVFAIL response: 6 (DNSSEC Bogus) and 18 (Prohibited).
    q3 = DNS(id=0x0103, rd=1, qd=DNSQR(qname="bogus.example", qtype="A"), ar=opt(1232, do=True))
    r3 = DNS(
        id=0x0103, qr=1, rcode=2, qd=DNSQR(qname="bogus.example", qtype="A"),
        ar=opt(1232, options=[
            EDNS0ExtendedDNSError(info_code=6, extra_text=b"bad sig"), EDNS0ExtendedDNSError(info_code=18),
        ]),
    )
    # No OPT in either message.
    q4 = DNS(id=0x0104, qd=DNSQR(qname="plain.example", qtype="A"))
    r4 = DNS(id=0x0104, qr=1, rcode=3, qd=DNSQR(qname="plain.example", qtype="A"))
    pkts = [
        query(0.0, q1, 40001), response(0.01, r1, 40001),
        query(1.0, q2, 40002, CLIENT6, SERVER6), response(1.02, r2, 40002, CLIENT6, SERVER6),
        query(2.0, q3, 40003), response(2.03, r3, 40003),
        query(3.0, q4, 40004), response(3.04, r4, 40004),
    ]
    rows, stats = run(tmp_path, pkts)
    assert len(rows) == 4 and stats["matched"] == 4 and stats["malformed"] == 0
    rows = by_id(rows)

    r = rows[0x0101]
    assert (r["edns_udp"], r["edns_version"], r["edns_do"]) == (1232, 0, True)
    assert r["edns_nsid"] == "ns1.example"  # from the response; the query's NSID is empty
    assert r["edns_client_subnet"] == "192.0.2.0/24"
    assert (r["edns_dnssec_dau"], r["edns_dnssec_dhu"], r["edns_dnssec_n3u"]) == ("8,13", "1,2", "1")
    assert r["edns_other"] == "8,10"  # client subnet and cookie; NSID (empty) and DAU/DHU/N3U excluded
    assert r["res_edns_udp"] == 4096
    assert (r["rcode"], r["aa"], r["rd"], r["edns_ede"]) == (0, True, True, [])
    assert (r["edns_ping"], r["edns_client_subnet_asn"], r["edns_client_subnet_country"]) == (False, "", "")

    r = rows[0x0102]
    assert (r["ipv"], r["src"], r["dst"]) == (6, CLIENT6, SERVER6)
    assert r["edns_client_subnet"] == "2001:db8:1234::/48"
    assert (r["edns_udp"], r["edns_version"], r["edns_do"], r["edns_other"]) == (1400, 1, False, "8")
    assert r["edns_nsid"] == ""
    assert r["rcode"] == 16  # BADVERS
    assert r["res_edns_udp"] == 1232

    r = rows[0x0103]
    assert r["rcode"] == 2
    assert r["edns_ede"] == [6, 18]
    assert (r["edns_do"], r["edns_other"], r["edns_client_subnet"], r["edns_dnssec_dau"]) == (True, "", "", "")

    r = rows[0x0104]
    assert (r["edns_udp"], r["edns_version"], r["edns_do"], r["edns_nsid"], r["edns_other"]) == (0, 0, False, "", "")
    assert (r["rcode"], r["edns_ede"], r["res_edns_udp"]) == (3, [], 0)


def test_tc_response(tmp_path):
    q = DNS(id=0x0201, rd=1, qd=DNSQR(qname="big.example", qtype="TXT"))
    r = DNS(id=0x0201, qr=1, tc=1, ra=1, rd=1, qd=DNSQR(qname="big.example", qtype="TXT"))
    q2 = DNS(id=0x0202, rd=1, qd=DNSQR(qname="small.example", qtype="TXT"))
    r2 = DNS(id=0x0202, qr=1, aa=1, qd=DNSQR(qname="small.example", qtype="TXT"))
    rows, _ = run(tmp_path, [query(0, q, 40001), response(0.1, r, 40001), query(1, q2), response(1.1, r2)])
    rows = by_id(rows)
    assert (rows[0x0201]["tc"], rows[0x0201]["aa"], rows[0x0201]["qtype"]) == (True, False, 16)
    assert (rows[0x0202]["tc"], rows[0x0202]["aa"]) == (False, True)


# --------------------------------------------------------------------------------------------------
# RR types dpkt 1.9.8 cannot parse, and a QNAME that is not UTF-8

UNPARSED_BY_DPKT = {
    # qtype: (id, answer RRs)
    65: (0x0301, [DNSRRHTTPS(rrname="svc.example", ttl=300, svc_priority=1, target_name=".")]),
    64: (0x0302, [DNSRRSVCB(rrname="svc.example", ttl=300, svc_priority=0, target_name="alias.example")]),
    46: (0x0303, [
        DNSRR(rrname="svc.example", type="A", ttl=300, rdata="192.0.2.7"),
        DNSRRRSIG(rrname="svc.example", ttl=300, typecovered=1, algorithm=13, labels=2, keytag=4242,
                  signersname="example", signature=b"\x01" * 64),
    ]),
    48: (0x0304, [
        DNSRRDNSKEY(rrname="svc.example", ttl=300, flags=257, algorithm=13, publickey=b"\x02" * 64),
        DNSRRDNSKEY(rrname="svc.example", ttl=300, flags=256, algorithm=13, publickey=b"\x03" * 64),
    ]),
    43: (0x0305, [DNSRRDS(rrname="svc.example", ttl=300, keytag=4242, algorithm=13, digesttype=2,
                          digest=b"\x04" * 32)]),
    257: (0x0306, [DNSRR(rrname="svc.example", type=257, ttl=300, rdata=b"\x00\x05issueca.example")]),
    65280: (0x0307, [DNSRR(rrname="svc.example", type=65280, ttl=300, rdata=b"\xde\xad\xbe\xef"),
                     DNSRR(rrname="svc.example", type=65280, ttl=300, rdata=b"")]),
}
FF_ID = 0x0308
FF_QNAME = b"\xffab.example"


def _unparsed_capture():
    pkts = []
    for i, (qtype, (mid, answers)) in enumerate(UNPARSED_BY_DPKT.items()):
        q = DNS(id=mid, rd=1, qd=DNSQR(qname="svc.example", qtype=qtype), ar=opt(1232, do=True))
        r = DNS(
            id=mid, qr=1, aa=1, qd=DNSQR(qname="svc.example", qtype=qtype), an=answers,
            ns=DNSRRSOA(rrname="example", mname="ns.example", rname="h.example", serial=7),
            ar=opt(1232),
        )
        pkts += [query(i, q, 41000 + i), response(i + 0.25, r, 41000 + i)]
    q = DNS(id=FF_ID, qd=DNSQR(qname=FF_QNAME, qtype="A"))
    r = DNS(id=FF_ID, qr=1, rcode=3, qd=DNSQR(qname=FF_QNAME, qtype="A"))
    pkts += [query(20, q, 42000), response(20.5, r, 42000)]
    return pkts


def test_rr_types_dpkt_cannot_parse(tmp_path):
    pkts = _unparsed_capture()
    rows, stats = run(tmp_path, pkts)
    assert stats["malformed"] == 0 and stats["dpkt_fallback"] == 0
    assert stats["matched"] == len(UNPARSED_BY_DPKT) + 1 and len(rows) == len(UNPARSED_BY_DPKT) + 1
    rows_by_id = by_id(rows)
    for qtype, (mid, answers) in UNPARSED_BY_DPKT.items():
        r = rows_by_id[mid]
        assert (r["qtype"], r["qname"], r["malformed"]) == (qtype, "svc.example", False), qtype
        assert (r["ancount"], r["nscount"], r["arcount"], r["qdcount"]) == (len(answers), 1, 1, 1), qtype
        assert (r["query_present"], r["response_present"], r["aa"], r["rcode"]) == (True, True, True, 0), qtype
        assert r["edns_do"] is True and r["res_edns_udp"] == 1232

    # QNAME byte 0xff: kept, escaped as \xff, not malformed.
    r = rows_by_id[FF_ID]
    assert r["qname"] == "\\xffab.example"
    assert r["domainname"] == "\\xffab.example"  # two labels: itself, lower-cased
    assert (r["labels"], r["malformed"], r["rcode"], r["response_present"]) == (2, False, 3, True)

    # dpkt as parser of record: same rows; the walker decodes what dpkt cannot (one response per RR
    # type above, plus the query and the response with the 0xff QNAME, which dpkt refuses as non-UTF-8).
    rows_dpkt, stats_dpkt = run(tmp_path, pkts, "--parser", "dpkt", name="dpkt")
    assert rows_dpkt == rows
    assert stats_dpkt["dpkt_fallback"] == len(UNPARSED_BY_DPKT) + 2
    assert stats_dpkt["malformed"] == 0


# --------------------------------------------------------------------------------------------------
# Malformed and truncated messages


def _hdr(mid, flags=0x0100, qd=1, an=0, ns=0, ar=0):
    return struct.pack("!HHHHHH", mid, flags, qd, an, ns, ar)


QUESTION = b"\x01a\x07example\x00\x00\x01\x00\x01"  # a.example A IN, at offset 12
MALFORMED = {
    # name: (message bytes, is a response, qname the walker still reads before the damage)
    "header 5 bytes": (b"\x05\x01\x01\x00\x00", False, None),
    "question cut in name": (_hdr(0x0502) + b"\x01a\x07exam", False, None),
    "question cut in qtype": (_hdr(0x0503) + b"\x01a\x07example\x00\x00", False, "a.example"),
    "rdlength past end": (
        _hdr(0x0504, 0x8180, an=1) + QUESTION + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x0e\x10\x00\x64\xc0\x00\x02\x01",
        True, "a.example",
    ),
    "RR header cut": (_hdr(0x0505, 0x8180, an=1) + QUESTION + b"\xc0\x0c\x00\x01\x00", True, "a.example"),
    "label type 0x40": (_hdr(0x0506) + b"\x40abc\x00\x00\x01\x00\x01", False, None),
    "label type 0x80": (_hdr(0x0507) + b"\x01a\x80\x00\x00\x01\x00\x01", False, None),
    "pointer to itself": (_hdr(0x0508) + b"\xc0\x0c\x00\x01\x00\x01", False, None),
    "pointer loop": (_hdr(0x0509) + b"\x01a\xc0\x0c\x00\x01\x00\x01", False, None),
    "forward pointer": (_hdr(0x050A) + b"\x01a\xc0\x14\x00\x01\x00\x01\x01b\x00", False, None),
    "pointer past end": (_hdr(0x050B) + b"\xc0", False, None),
    "answer owner forward pointer": (
        _hdr(0x050C, 0x8180, an=1) + QUESTION + b"\xc0\x30\x00\x01\x00\x01\x00\x00\x0e\x10\x00\x04\xc0\x00\x02\x01",
        True, "a.example",
    ),
    "name longer than 255": (_hdr(0x050D) + b"\x3f" + b"x" * 63 + (b"\x3f" + b"y" * 63) * 4 + b"\x00\x00\x01\x00\x01",
                             False, None),
    "EDNS option past OPT": (
        _hdr(0x050E, ar=1) + QUESTION + b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x06\x00\x0a\x00\x08\x01\x02",
        False, "a.example",
    ),
}


def test_malformed_messages(tmp_path):
    pkts = [query(i, msg, 43000 + i) if not is_resp else response(i, msg, 43000 + i)
            for i, (msg, is_resp, _) in enumerate(MALFORMED.values())]
    # A good transaction after the damage still matches.
    good_q = DNS(id=0x05FF, qd=DNSQR(qname="ok.example"))
    good_r = DNS(id=0x05FF, qr=1, qd=DNSQR(qname="ok.example"), an=DNSRR(rrname="ok.example", rdata="192.0.2.9"))
    pkts += [query(50, good_q, 43999), response(50.1, good_r, 43999)]
    rows, stats = run(tmp_path, pkts)
    assert stats["malformed"] == len(MALFORMED)
    assert stats["dns_messages"] == len(MALFORMED) + 2 and stats["matched"] == 1
    assert len(rows) == len(MALFORMED) + 1
    by_port = {r["srcp"]: r for r in rows}
    for i, (name, (msg, is_resp, qname)) in enumerate(MALFORMED.items()):
        r = by_port[43000 + i]
        assert r["malformed"] is True, name
        assert (r["query_present"], r["response_present"]) == (not is_resp, is_resp), name
        assert r["dns_res_len" if is_resp else "dns_len"] == len(msg), name
        assert r["id"] == (None if len(msg) < 12 else struct.unpack_from("!H", msg)[0]), name
        assert r["qname"] == qname, name
        assert r["srcp"] == 43000 + i and r["dst"] == SERVER4, name
    good = by_port[43999]
    assert (good["malformed"], good["response_present"], good["ancount"]) == (False, True, 1)

    # The dpkt parser of record gives the same rows and does not crash on any of them.
    rows_dpkt, stats_dpkt = run(tmp_path, pkts, "--parser", "dpkt", name="dpkt")
    assert rows_dpkt == rows
    assert stats_dpkt["malformed"] == len(MALFORMED)


# --------------------------------------------------------------------------------------------------
# Unmatched messages (the side missing is null) and QNAME case kept (matching itself: tests/match/)


def test_unmatched_query_and_response(tmp_path):
    q = DNS(id=0x0601, rd=1, qd=DNSQR(qname="lonely.example", qtype="MX"), ar=opt(1232, do=True))
    r = DNS(id=0x0602, qr=1, aa=1, qd=DNSQR(qname="orphan.example", qtype="A"),
            an=DNSRR(rrname="orphan.example", rdata="192.0.2.33"), ar=opt(4096))
    qp, rp = query(0, q, 44001), response(1, r, 44002)
    rows, stats = run(tmp_path, [qp, rp])
    assert (stats["query_only"], stats["response_only"], stats["matched"]) == (1, 1, 0)
    rows = by_id(rows)

    qo = rows[0x0601]
    assert (qo["query_present"], qo["response_present"], qo["malformed"]) == (True, False, False)
    for c in RESPONSE_COLUMNS:
        assert qo[c] is None, c
    assert (qo["qname"], qo["qtype"], qo["rd"]) == ("lonely.example", 15, True)
    assert (qo["edns_do"], qo["edns_udp"]) == (True, 1232)
    assert (qo["len"], qo["dns_len"]) == (frame_len(qp), len(q))
    assert (qo["src"], qo["srcp"], qo["dst"], qo["dstp"]) == (CLIENT4, 44001, SERVER4, 53)
    assert qo["unixtime"] == T0 and qo["query_time"] == T0 * 1_000_000_000

    ro = rows[0x0602]
    assert (ro["query_present"], ro["response_present"], ro["malformed"]) == (False, True, False)
    for c in QUERY_COLUMNS:
        assert ro[c] is None, c
    assert (ro["qname"], ro["qtype"], ro["aa"], ro["ancount"], ro["rcode"]) == ("orphan.example", 1, True, 1, 0)
    assert (ro["res_len"], ro["dns_res_len"], ro["res_edns_udp"]) == (frame_len(rp), len(r), 4096)
    # Identity from the response: the client is its destination.
    assert (ro["src"], ro["srcp"], ro["dst"], ro["dstp"]) == (CLIENT4, 44002, SERVER4, 53)
    assert ro["unixtime"] == T0 + 1 and ro["response_messages"] == 1


def test_qname_case(tmp_path):
    q = DNS(id=0x0901, rd=1, qd=DNSQR(qname="ExAmPlE.com", qtype="A"))
    r = DNS(id=0x0901, qr=1, qd=DNSQR(qname="example.COM", qtype="A"),
            an=DNSRR(rrname="example.com", rdata="192.0.2.3"))
    q2 = DNS(id=0x0902, rd=1, qd=DNSQR(qname="WwW.ExAmPlE.CoM", qtype="A"))
    r2 = DNS(id=0x0902, qr=1, qd=DNSQR(qname="www.example.com", qtype="A"))
    rows, stats = run(tmp_path, [query(0, q, 47001), response(0.1, r, 47001), query(1, q2, 47002),
                                 response(1.1, r2, 47002)])
    assert stats["matched"] == 2 and len(rows) == 2
    rows = by_id(rows)
    assert (rows[0x0901]["qname"], rows[0x0901]["domainname"], rows[0x0901]["labels"]) == (
        "ExAmPlE.com", "example.com", 2)
    assert rows[0x0901]["ancount"] == 1
    assert (rows[0x0902]["qname"], rows[0x0902]["domainname"], rows[0x0902]["labels"]) == (
        "WwW.ExAmPlE.CoM", "example.com", 3)


# --------------------------------------------------------------------------------------------------
# AXFR over TCP


def test_axfr_over_tcp(tmp_path):
    client, server, cport = CLIENT4, SERVER4, 48000
    cseq, sseq = 1000, 5000
    base = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")

    def seg(t, from_client, flags, seq, ack, payload=b""):
        src, dst, sp, dp = (client, server, cport, 53) if from_client else (server, client, 53, cport)
        pkt = base / IP(src=src, dst=dst) / TCP(sport=sp, dport=dp, flags=flags, seq=seq, ack=ack)
        if payload:
            pkt = pkt / Raw(load=payload)
        pkt.time = T0 + t
        return pkt

    soa = DNSRRSOA(rrname="zone.example", ttl=3600, mname="ns.zone.example", rname="h.zone.example", serial=42)
    qmsg = bytes(DNS(id=0x0A01, rd=0, qd=DNSQR(qname="zone.example", qtype="AXFR")))
    answers = [
        [soa, DNSRR(rrname="zone.example", type="NS", ttl=3600, rdata="ns.zone.example"),
         DNSRR(rrname="ns.zone.example", type="A", ttl=3600, rdata="192.0.2.53")],
        [DNSRR(rrname=f"h{i}.zone.example", type="A", ttl=3600, rdata=f"192.0.2.{i}") for i in range(1, 5)],
        [DNSRR(rrname="www.zone.example", type="A", ttl=3600, rdata="192.0.2.80"), soa],
    ]
    rmsgs = [bytes(DNS(id=0x0A01, qr=1, aa=1, qd=DNSQR(qname="zone.example", qtype="AXFR") if i == 0 else [],
                       an=an)) for i, an in enumerate(answers)]
    pkts = [
        seg(0.000, True, "S", cseq, 0),
        seg(0.010, False, "SA", sseq, cseq + 1),
        seg(0.020, True, "A", cseq + 1, sseq + 1),
        seg(0.021, True, "PA", cseq + 1, sseq + 1, struct.pack("!H", len(qmsg)) + qmsg),
    ]
    s = sseq + 1
    resp_frames = []
    for i, m in enumerate(rmsgs):
        data = struct.pack("!H", len(m)) + m
        resp_frames.append(seg(0.030 + i * 0.005, False, "PA", s, cseq + 3 + len(qmsg), data))
        s += len(data)
    pkts += resp_frames
    pkts += [seg(0.050, True, "FA", cseq + 3 + len(qmsg), s), seg(0.051, False, "FA", s, cseq + 4 + len(qmsg))]
    rows, stats = run(tmp_path, pkts)
    assert len(rows) == 1, rows
    (r,) = rows
    assert (r["qtype"], r["qname"], r["prot"], r["id"]) == (252, "zone.example", 6, 0x0A01)
    assert (r["query_present"], r["response_present"], r["malformed"]) == (True, True, False)
    assert r["ancount"] == 3 + 4 + 2
    assert r["response_messages"] == 3
    assert r["res_len"] == sum(frame_len(p) for p in resp_frames)
    assert r["dns_res_len"] == sum(len(m) for m in rmsgs)
    assert (r["dns_len"], r["len"]) == (len(qmsg), frame_len(pkts[3]))
    assert r["response_delay_us"] == 9_000  # first response message
    assert r["tcp_hs_rtt"] == 20.0  # SYN → client's ACK, ms
    assert (stats["matched"], stats["zone_transfer_messages"], stats["response_only"]) == (1, 2, 0)
