"""tshark as an independent oracle: every DNS message dnsprobe reports is compared with tshark's
dissection of the same capture.

1. A mixed capture written with scapy (UDP and TCP, IPv4 and IPv6, many QTYPEs, NOERROR / NXDOMAIN /
   SERVFAIL / REFUSED / BADVERS, EDNS, unmatched queries and responses): per message, ID, QNAME,
   QTYPE, RCODE (with the OPT's extended bits), header flags, section counts, EDNS fields, addresses
   and ports are equal.
2. compactor's knot-live capture: the set of (ID, lower-cased QNAME, QTYPE) of our UDP queries equals
   tshark's. Exceptions, each checked exactly below:
   - QNAMEs that are not printable ASCII (294 query frames, e.g. 59, 811, 3860, 12642, 16697): tshark's
     display text is lossy (invalid UTF-8 becomes U+FFFD with its own grouping, e.g. frame 16697's
     "\\xa8\\xfa\\x91" shows as two U+FFFD; the overlong pair c0 86 in frame 12642 shows as "\\u0006";
     controls as \\001 or \\v). For those frames the name is compared on tshark's raw wire bytes
     (`-T json -x`, dns.qry.name_raw) instead, rendered as dnsprobe renders names.
   - frames 9148 and 11804: QNAMEs longer than 255 bytes; tshark shows "<Name too long>" (no expert
     error), dnsprobe (like dpkt) reports the messages malformed with a null QNAME. Compared as such.
"""

import json
import lzma
import shutil
import struct
import subprocess

import pytest
from scapy.all import (
    DNS,
    DNSQR,
    DNSRR,
    DNSRRDNSKEY,
    DNSRRHTTPS,
    DNSRRMX,
    DNSRROPT,
    DNSRRSOA,
    DNSRRSRV,
    IP,
    TCP,
    UDP,
    Ether,
    IPv6,
    Raw,
    wrpcap,
)
from support.data import COMPACTOR_DATA, needs_shared
from support.dnsprobe import dnsprobe_read

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")

T0 = 1_600_000_000
FIELDS = (
    "frame.number", "dns.id", "dns.flags", "dns.qry.name", "dns.qry.type", "dns.count.queries",
    "dns.count.answers", "dns.count.auth_rr", "dns.count.add_rr", "dns.count.labels", "dns.length",
    "udp.length", "udp.srcport", "udp.dstport", "tcp.srcport", "tcp.dstport", "ip.src", "ip.dst",
    "ipv6.src", "ipv6.dst", "dns.rr.udp_payload_size", "dns.resp.edns0_version", "dns.resp.z.do",
    "dns.resp.ext_rcode", "_ws.malformed", "_ws.expert.severity",
)
PI_ERROR = 0x00800000  # Wireshark's expert severity "Error"


def tshark(pcap, display_filter, fields=FIELDS):
    """tshark's per-frame field values as dicts (first occurrence of each field)."""
    cmd = ["tshark", "-n", "-r", str(pcap), "-Y", display_filter, "-T", "fields", "-E", "separator=/t",
           "-E", "occurrence=f"]
    for f in fields:
        cmd += ["-e", f]
    proc = subprocess.run(cmd, capture_output=True, check=True)
    lines = proc.stdout.decode("utf-8", "replace").splitlines()
    return [dict(zip(fields, line.split("\t"), strict=True)) for line in lines]


def has_error(frame):
    sev = frame.get("_ws.expert.severity", "")
    return bool(frame.get("_ws.malformed")) or any(int(s) >= PI_ERROR for s in sev.split(",") if s)


# --------------------------------------------------------------------------------------------------
# 1. Mixed synthetic capture

# (id, transport, ip version, qname, qtype, rcode (extended), EDNS UDP size or None, DO, query?, response?)
MIXED = [
    (0x1001, "udp", 4, "www.example.com", 1, 0, 1232, True, True, True),
    (0x1002, "udp", 6, "www.example.com", 28, 0, 4096, False, True, True),
    (0x1003, "udp", 4, "nonexistent.example.net", 1, 3, None, False, True, True),
    (0x1004, "udp", 6, "broken.example.org", 15, 2, 1232, True, True, True),
    (0x1005, "tcp", 4, "example.com", 16, 0, None, False, True, True),
    (0x1006, "tcp", 6, "example.com", 2, 0, 1232, False, True, True),
    (0x1007, "udp", 4, "example.com", 6, 0, 1400, True, True, True),
    (0x1008, "udp", 4, "1.2.0.192.in-addr.arpa", 12, 3, None, False, True, True),
    (0x1009, "udp", 6, "_sip._tcp.example.com", 33, 0, 1232, False, True, True),
    (0x100A, "udp", 4, "Mixed.Case.Example", 65, 0, 1232, True, True, True),
    (0x100B, "tcp", 4, "signed.example", 48, 0, 4096, True, True, True),
    (0x100C, "udp", 4, "lost.example", 1, None, 1232, False, True, False),
    (0x100D, "udp", 6, "orphan.example", 28, 0, 1232, False, False, True),
    (0x100E, "tcp", 4, "tcp-unanswered.example", 1, None, None, False, True, False),
    (0x100F, "udp", 4, "refused.example", 1, 5, None, False, True, True),
    (0x1010, "udp", 6, "badvers.example", 1, 16, 1232, False, True, True),
    (0x1011, "tcp", 6, "nx.example", 28, 3, 1232, True, True, True),
    (0x1012, "udp", 4, "a.b.c.d.e.f.example", 255, 0, 1232, False, True, True),
]


def _answers(qname, qtype):
    if qtype == 1 or qtype == 255:
        return [DNSRR(rrname=qname, type="A", ttl=60, rdata="192.0.2.10")]
    if qtype == 28:
        return [DNSRR(rrname=qname, type="AAAA", ttl=60, rdata="2001:db8::10")]
    if qtype == 15:
        return [DNSRRMX(rrname=qname, ttl=60, preference=10, exchange="mx.example")]
    if qtype == 16:
        return [DNSRR(rrname=qname, type="TXT", ttl=60, rdata=["hello", "world"])]
    if qtype == 2:
        return [DNSRR(rrname=qname, type="NS", ttl=60, rdata=f"ns{i}.example.com") for i in (1, 2)]
    if qtype == 6:
        return [DNSRRSOA(rrname=qname, ttl=60, mname="ns1.example.com", rname="host.example.com", serial=1)]
    if qtype == 12:
        return [DNSRR(rrname=qname, type="PTR", ttl=60, rdata="host.example.com")]
    if qtype == 33:
        return [DNSRRSRV(rrname=qname, ttl=60, priority=1, weight=2, port=5060, target="sip.example.com")]
    if qtype == 65:
        return [DNSRRHTTPS(rrname=qname, ttl=60, svc_priority=1, target_name=".")]
    if qtype == 48:
        return [DNSRRDNSKEY(rrname=qname, ttl=60, flags=257, algorithm=13, publickey=b"\x05" * 64)]
    raise AssertionError(qtype)


def _mixed_capture():
    frames = []
    for i, (mid, transport, ipv, qname, qtype, rcode, edns, do, has_q, has_r) in enumerate(MIXED):
        client, server = ("192.0.2.1", "198.51.100.53") if ipv == 4 else ("2001:db8::1", "2001:db8::53")
        cport = 50000 + i
        t = float(i)
        qopt = [DNSRROPT(rclass=edns, z=0x8000 if do else 0)] if edns else []
        q = DNS(id=mid, rd=1, cd=int(do), qd=DNSQR(qname=qname, qtype=qtype), ar=qopt)
        ropt = [DNSRROPT(rclass=1232, z=0, extrcode=rcode >> 4)] if edns and rcode is not None else []
        r = None
        if rcode is not None:
            r = DNS(
                id=mid, qr=1, aa=int(i % 2 == 0), rd=1, ra=1, rcode=rcode & 0xF, qd=DNSQR(qname=qname, qtype=qtype),
                an=_answers(qname, qtype) if rcode == 0 else [],
                ns=[DNSRRSOA(rrname="example", mname="ns.example", rname="h.example")] if rcode == 3 else [],
                ar=ropt,
            )
        l3 = (lambda s, d: IP(src=s, dst=d)) if ipv == 4 else (lambda s, d: IPv6(src=s, dst=d))
        eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")

        def add(pkt, dt, _t=t):
            pkt.time = T0 + _t + dt
            frames.append(pkt)

        if transport == "udp":
            if has_q:
                add(eth / l3(client, server) / UDP(sport=cport, dport=53) / q, 0.0)
            if has_r:
                add(eth / l3(server, client) / UDP(sport=53, dport=cport) / r, 0.1)
            continue
        cseq, sseq = 1000 * (i + 1), 7000 * (i + 1)
        qb = bytes(q)
        qdata = struct.pack("!H", len(qb)) + qb
        add(eth / l3(client, server) / TCP(sport=cport, dport=53, flags="S", seq=cseq), 0.0)
        add(eth / l3(server, client) / TCP(sport=53, dport=cport, flags="SA", seq=sseq, ack=cseq + 1), 0.01)
        add(eth / l3(client, server) / TCP(sport=cport, dport=53, flags="A", seq=cseq + 1, ack=sseq + 1), 0.02)
        add(eth / l3(client, server) / TCP(sport=cport, dport=53, flags="PA", seq=cseq + 1, ack=sseq + 1)
            / Raw(qdata), 0.03)
        if has_r:
            rb = bytes(r)
            add(eth / l3(server, client) / TCP(sport=53, dport=cport, flags="PA", seq=sseq + 1,
                                                ack=cseq + 1 + len(qdata)) / Raw(struct.pack("!H", len(rb)) + rb), 0.1)
    return frames


def _flag(word, mask):
    return bool(word & mask)


def _int(value, default=0):
    return int(value, 0) if value else default


def test_mixed_capture_matches_tshark(tmp_path, out_dir):
    pcap = tmp_path / "mixed.pcap"
    wrpcap(str(pcap), _mixed_capture())
    rows = dnsprobe_read(pcap, out_dir)
    frames = tshark(pcap, "dns")
    assert not [f for f in frames if has_error(f)]
    msgs = {}
    for f in frames:
        key = (int(f["dns.id"], 16), _flag(int(f["dns.flags"], 16), 0x8000))
        assert key not in msgs, f"two frames for {key}"
        msgs[key] = f
    expected_q = {m[0] for m in MIXED if m[8]}
    expected_r = {m[0] for m in MIXED if m[9]}
    assert {k[0] for k in msgs if not k[1]} == expected_q
    assert {k[0] for k in msgs if k[1]} == expected_r
    assert sorted(r["id"] for r in rows) == sorted(m[0] for m in MIXED)
    compared = 0
    for row in rows:
        mid = row["id"]
        assert row["malformed"] is False
        assert row["query_present"] == (mid in expected_q) and row["response_present"] == (mid in expected_r)
        for is_resp in (False, True):
            f = msgs.get((mid, is_resp))
            if f is None:
                continue
            compared += 1
            what = (hex(mid), "response" if is_resp else "query")
            flags = int(f["dns.flags"], 16)
            tcp = bool(f["tcp.srcport"])
            ipv = 6 if f["ipv6.src"] else 4
            sport = int(f["tcp.srcport"] or f["udp.srcport"])
            dport = int(f["tcp.dstport"] or f["udp.dstport"])
            src, dst = (f["ipv6.src"], f["ipv6.dst"]) if ipv == 6 else (f["ip.src"], f["ip.dst"])
            client, cport, server, sport_ = (dst, dport, src, sport) if is_resp else (src, sport, dst, dport)
            assert (row["src"], row["srcp"], row["dst"], row["dstp"]) == (client, cport, server, sport_), what
            assert (row["ipv"], row["prot"]) == (ipv, 6 if tcp else 17), what
            assert (row["qname"], row["qtype"]) == (f["dns.qry.name"], int(f["dns.qry.type"])), what
            assert row["labels"] == int(f["dns.count.labels"]), what
            assert row["opcode"] == (flags >> 11) & 0xF, what
            dns_len = int(f["dns.length"]) if tcp else int(f["udp.length"]) - 8
            has_opt = bool(f["dns.rr.udp_payload_size"])
            if is_resp:
                rcode = (flags & 0xF) | (_int(f["dns.resp.ext_rcode"]) << 4)
                assert row["rcode"] == rcode, what
                assert (row["aa"], row["tc"]) == (_flag(flags, 0x0400), _flag(flags, 0x0200)), what
                counts = (row["ancount"], row["nscount"], row["arcount"])
                sections = ("dns.count.answers", "dns.count.auth_rr", "dns.count.add_rr")
                assert counts == tuple(int(f[c]) for c in sections), what
                assert row["dns_res_len"] == dns_len, what
                assert row["res_edns_udp"] == _int(f["dns.rr.udp_payload_size"]), what
            else:
                bits = (row["rd"], row["ra"], row["z"], row["ad"], row["cd"])
                assert bits == tuple(_flag(flags, m) for m in (0x0100, 0x0080, 0x0040, 0x0020, 0x0010)), what
                assert row["qdcount"] == int(f["dns.count.queries"]), what
                assert row["dns_len"] == dns_len, what
                assert row["edns_udp"] == _int(f["dns.rr.udp_payload_size"]), what
                assert row["edns_version"] == _int(f["dns.resp.edns0_version"]), what
                assert row["edns_do"] == (has_opt and f["dns.resp.z.do"] in ("1", "True")), what
    assert compared == len(expected_q) + len(expected_r) == 33


# --------------------------------------------------------------------------------------------------
# 2. knot-live: queries on UDP

# Frames whose QNAME tshark shows as "<Name too long>" (longer than 255 bytes); dnsprobe: malformed.
KNOT_NAME_TOO_LONG_FRAMES = {9148, 11804}


def _plain(name):
    return name.isascii() and name.isprintable() and "\\" not in name


def _raw_names(pcap, frame_numbers):
    """frame number -> QNAME from tshark's raw wire bytes, rendered as dnsprobe renders names."""
    cmd = ["tshark", "-n", "-r", str(pcap), "-x", "-T", "json",
           "-Y", "frame.number in {" + ", ".join(map(str, sorted(frame_numbers))) + "}"]
    doc = json.loads(subprocess.run(cmd, capture_output=True, check=True).stdout)

    def find(node, key):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == key:
                    return v
                found = find(v, key)
                if found is not None:
                    return found
        return None

    out = {}
    for pkt in doc:
        layers = pkt["_source"]["layers"]
        number = int(find(layers, "frame.number"))
        wire = bytes.fromhex(find(layers, "dns.qry.name_raw")[0])
        labels, pos = [], 0
        while wire[pos]:
            n = wire[pos]
            assert n < 64, f"frame {number}: compressed or extended label in the question"
            labels.append(wire[pos + 1 : pos + 1 + n])
            pos += n + 1
        out[number] = b".".join(labels).decode("utf-8", "backslashreplace")
    return out


@needs_shared
def test_knot_live_udp_queries_match_tshark(tmp_path, out_dir):
    pcap = tmp_path / "knot-live.pcap"
    with lzma.open(COMPACTOR_DATA / "knot-live.raw.pcap.xz") as src, open(pcap, "wb") as dst:
        shutil.copyfileobj(src, dst)
    fields = ("frame.number", "dns.id", "dns.flags", "dns.qry.name", "dns.qry.type", "_ws.malformed",
              "_ws.expert.severity")
    frames = [
        f for f in tshark(pcap, "udp.port == 53 && dns && !icmp && !icmpv6", fields)
        if not _flag(int(f["dns.flags"], 16), 0x8000)
    ]
    # No UDP query of this capture has a tshark expert error or malformed mark.
    assert [f["frame.number"] for f in frames if has_error(f)] == []
    too_long = {int(f["frame.number"]): f for f in frames if f["dns.qry.name"] == "<Name too long>"}
    assert set(too_long) == KNOT_NAME_TOO_LONG_FRAMES
    raw = _raw_names(pcap, [int(f["frame.number"]) for f in frames if not _plain(f["dns.qry.name"])
                            and int(f["frame.number"]) not in too_long])
    assert len(raw) == 294  # non-ASCII, control characters or invalid UTF-8 in the QNAME

    theirs = set()
    for f in frames:
        number = int(f["frame.number"])
        if number in too_long:
            continue
        name = f["dns.qry.name"]
        name = raw.get(number, "" if name == "<Root>" else name)
        qtype = int(f["dns.qry.type"]) if f["dns.qry.type"] else None  # None: no question (QDCOUNT 0)
        theirs.add((int(f["dns.id"], 16), name.lower(), qtype))

    rows = dnsprobe_read(pcap, out_dir)
    queries = [r for r in rows if r["query_present"] and r["prot"] == 17]
    malformed = [r for r in queries if r["malformed"]]
    ours = {(r["id"], (r["qname"] or "").lower(), r["qtype"]) for r in queries if not r["malformed"]}

    assert len(theirs) > 7000
    assert ours == theirs, (sorted(ours - theirs, key=str)[:10], sorted(theirs - ours, key=str)[:10])
    # The two QNAMEs over 255 bytes: malformed in our output, "<Name too long>" in tshark's.
    assert sorted((r["id"], r["qname"], r["qtype"]) for r in malformed) == sorted(
        (int(f["dns.id"], 16), None, None) for f in too_long.values()  # walked no further than the name
    )
