"""C-DNS (RFC 8618) read-back: `dnsprobe inspect FILE.cdns` and `dnsprobe inspect --pcap`.

1. compactor's gold.cbor.xz, written by another implementation from gold.pcap.xz: our reader gives the
   same 999 transactions as `dnsprobe read gold.pcap.xz`, in the same order, every column both have
   equal. No field is recorded differently by compactor. (gold.pcap.info's "VLAN IDs: 10" is compactor's
   configured filter, stored as the collection parameter vlan-ids; the frames carry no tag, and C-DNS
   items have no VLAN field.)
2. `--pcap` on gold.cbor.xz (compactor recorded the full sections): every rebuilt DNS message equals the
   original one in content (header, questions, RRs with the names in owner and RDATA expanded by dpkt)
   and, because the owner and RDATA names are compressed as the original server did, byte for byte; tshark dissects
   both alike; `dnsprobe read` of the rebuilt pcap gives the original transactions.
3. A C-DNS file built here by hand with cbor2 exercises what gold does not: query-only, response-only,
   TCP over IPv6, query OPT (DO, client subnet, NSID) from the signature, response OPT from the recorded
   additional section (NSID, extended error, extended RCODE), a malformed message, negative
   implementation keys, absent tables, a second block-parameters entry (other ticks per second, client
   addresses stored as a 24-bit prefix, no sections), and a block with no tables at all.
4. Bad input: truncated (cut in a block, no closing break, cut compressed stream), wrong file type id,
   wrong major version, table index out of range, trailing bytes, not CBOR: one line naming the file
   and the problem, exit 1, no traceback; the blocks before the problem are printed.
"""

import copy
import gzip
import json
import lzma
import shutil
import struct
import subprocess

import cbor2
import dpkt
import pytest
import zstandard
from support.data import COMPACTOR_DATA, DNSPROBE_DATA, ROOT, needs_shared, skip_without_shared
from support.dnsprobe import dnsprobe_read, run_dnsprobe

from export.cdns import format as F
from export.cdns.reader import CDNS_ABSENT_COLUMNS, CdnsFile, read_records

GOLD_CDNS = COMPACTOR_DATA / "gold.cbor.xz"
GOLD_PCAP = COMPACTOR_DATA / "gold.pcap.xz"
SECTION_BITS = 0x3F800  # query-response hint bits 11..17: extra questions and all RR sections


def _key(row):
    return (row["query_time"], row["response_time"], row["src"], row["srcp"], row["id"])


@pytest.fixture(scope="module")
def gold_parquet(tmp_path_factory):
    return dnsprobe_read(GOLD_PCAP, tmp_path_factory.mktemp("gold"))


@pytest.fixture(scope="module")
def gold_cdns():
    skip_without_shared(GOLD_CDNS)
    return list(read_records(GOLD_CDNS))


# -- 1. compactor's file agrees with the capture it came from ---------------------------------------------


def test_gold_same_transactions_and_fields(gold_parquet, gold_cdns):
    assert len(gold_cdns) == len(gold_parquet) == 999  # gold.pcap.info: 999 matched pairs
    assert all(r["query_present"] and r["response_present"] for r in gold_cdns)
    assert [_key(r) for r in gold_cdns] == [_key(r) for r in gold_parquet]  # same order too
    columns = set(gold_cdns[0])
    assert columns == set(gold_parquet[0]) - set(CDNS_ABSENT_COLUMNS)
    for ours, theirs in zip(gold_parquet, gold_cdns):
        assert {c: ours[c] for c in columns} == theirs
    # What makes the comparison meaningful: the file has variety in the compared fields.
    assert {r["rcode"] for r in gold_cdns} == {0, 3}
    assert {r["aa"] for r in gold_cdns} == {False, True}
    assert min(r["response_delay_us"] for r in gold_cdns) < 0  # a response captured before its query
    assert len({r["qtype"] for r in gold_cdns}) >= 5
    assert len({r["nscount"] for r in gold_cdns}) > 3 and {r["arcount"] for r in gold_cdns} >= {0, 12}


@needs_shared
def test_gold_preamble():
    with CdnsFile(GOLD_CDNS) as f:
        assert f.version[:2] == (1, 0)
        params = f.preamble[3][0]
        assert params[0][0] == 1_000_000  # ticks per second
        assert params[1][6] == [10]  # collection parameter vlan-ids: the configured VLAN of gold.pcap.info
        assert params[1][-1] == 53  # an implementation-specific (negative) key, ignored
        assert f.block_parameters[0].qr_hints & SECTION_BITS == SECTION_BITS
        blocks = list(f.blocks())
    assert len(blocks) == 1 and blocks[0][1][1] == 999  # block statistics: qr-data-items


def test_gold_vlan_is_not_in_the_frames(gold_parquet):
    assert {r["vlan"] for r in gold_parquet} == {None}


@needs_shared
@pytest.mark.parametrize("compress", [gzip.compress, zstandard.ZstdCompressor().compress, lambda b: b])
def test_compression_recognised_by_content(tmp_path, gold_cdns, compress):
    path = tmp_path / "gold.bin"  # the name says nothing
    path.write_bytes(compress(lzma.decompress(GOLD_CDNS.read_bytes())))
    assert list(read_records(path)) == gold_cdns


# -- `dnsprobe inspect` on C-DNS --------------------------------------------------------------------------


@needs_shared
def test_inspect_cdns_like_parquet(gold_parquet, tmp_path):
    run_dnsprobe("read", GOLD_PCAP, "-o", tmp_path, "-q", "--no-progress")
    parquet = sorted(tmp_path.glob("*.parquet"))[0]
    table = run_dnsprobe("inspect", GOLD_CDNS, "--limit", "3").stdout
    assert "www.wind-energy-the-facts.org" in table and "delay_us" in table and "AAAA" in table
    for args in (("--limit", "5"), ("--limit", "4", "--columns", "qname,query_time,response_time,rcode,aa,ttl")):
        ours = run_dnsprobe("inspect", GOLD_CDNS, "--json", *args).stdout
        assert ours == run_dnsprobe("inspect", parquet, "--json", *args).stdout
    lines = run_dnsprobe("inspect", GOLD_CDNS, "--json", "--limit", "0", "--all-columns").stdout.splitlines()
    assert len(lines) == 999
    assert json.loads(lines[1])["response_time"] == "2016-06-29T15:52:14.331104Z"
    proc = run_dnsprobe("inspect", GOLD_CDNS, "--columns", "udp_sum", check=False)
    assert proc.returncode == 2 and "unknown column(s): udp_sum" in proc.stderr
    both = run_dnsprobe("inspect", GOLD_CDNS, parquet, "--json", "--limit", "0").stdout.splitlines()
    assert len(both) == 2 * 999


# -- 2. --pcap rebuilds the DNS messages ------------------------------------------------------------------


def _dns_messages(pcap):
    """(direction, DNS bytes) of every UDP or TCP DNS message of a pcap, in order (dpkt)."""
    out = []
    with open(pcap, "rb") as fh:
        for _, buf in dpkt.pcap.Reader(fh):
            ip = dpkt.ethernet.Ethernet(buf).data
            seg = ip.data
            data = bytes(seg.data)
            if isinstance(seg, dpkt.tcp.TCP):
                if not data:
                    continue
                data = data[2:]
            out.append(((bytes(ip.src), seg.sport, bytes(ip.dst), seg.dport), data))
    return out


def _expand(buf, off, rdlen, layout):
    """RDATA with the names of its layout (cdns_format.RDATA_NAME_LAYOUT) read by dpkt, the rest as bytes."""
    end = off + rdlen
    if layout is None:
        return buf[off:end]
    parts = []
    for part in layout:
        if part == "N":
            name, off = dpkt.dns.unpack_name(buf, off)
            parts.append(name)
        elif part == "S":
            parts.append(buf[off : off + 1 + buf[off]])
            off += 1 + buf[off]
        else:
            size = end - off if part == "*" else part
            parts.append(buf[off : off + size])
            off += size
    assert off == end
    return tuple(parts)


def _content(buf, edns_z=True):
    """A DNS message's content, independent of name compression: header, questions, and each RR with the
    names of its owner and RDATA expanded (by dpkt) and the rest of the RDATA as bytes. Bytes after the
    last RR are not content. edns_z=False: the OPT's flags other than DO are left out (C-DNS has no field
    for them)."""
    mid, flags, qd, an, ns, ar = struct.unpack_from("!6H", buf)
    off = 12
    questions = []
    for _ in range(qd):
        name, off = dpkt.dns.unpack_name(buf, off)
        questions.append((name, *struct.unpack_from("!HH", buf, off)))
        off += 4
    sections = []
    for count in (an, ns, ar):
        rrs = []
        for _ in range(count):
            name, off = dpkt.dns.unpack_name(buf, off)
            rtype, rclass, ttl, rdlen = struct.unpack_from("!HHIH", buf, off)
            off += 10
            if rtype == 41 and not edns_z:
                ttl &= 0xFFFF8000
            rrs.append((name, rtype, rclass, ttl, _expand(buf, off, rdlen, F.RDATA_NAME_LAYOUT.get(rtype))))
            off += rdlen
        sections.append(rrs)
    return mid, flags, questions, sections


@pytest.fixture(scope="module")
def gold_rebuilt(tmp_path_factory):
    out = tmp_path_factory.mktemp("rebuilt") / "gold.pcap"
    proc = run_dnsprobe("inspect", "--pcap", out, GOLD_CDNS)
    assert f"{out}: 1998 packets, 1998 DNS messages" in proc.stdout
    original = tmp_path_factory.mktemp("orig") / "gold.pcap"
    original.write_bytes(lzma.decompress(GOLD_PCAP.read_bytes()))
    return original, out


def test_pcap_rebuild_equal_dns_content(gold_rebuilt):
    original, rebuilt = gold_rebuilt
    want, got = _dns_messages(original), _dns_messages(rebuilt)
    assert len(want) == len(got) == 1998

    def by_key(msgs):
        return {(flow, buf[:2]): buf for flow, buf in msgs}  # flow and DNS ID are unique in this capture

    want, got = by_key(want), by_key(got)
    assert want.keys() == got.keys()
    for key, buf in want.items():
        assert _content(got[key]) == _content(buf), key
    # Names compressed as the original server did (owner names and RFC 1035 RDATA names): same bytes.
    assert sum(got[k] == want[k] for k in want) == 1998


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_pcap_rebuild_tshark_sees_the_same(gold_rebuilt):
    fields = ("ip.src", "ip.dst", "udp.srcport", "udp.dstport", "dns.id", "dns.flags", "dns.qry.name",
              "dns.qry.type", "dns.count.answers", "dns.count.auth_rr", "dns.count.add_rr", "dns.resp.name",
              "dns.resp.type", "dns.resp.ttl", "dns.ns", "dns.a", "dns.aaaa", "dns.soa.mname")

    def dissect(pcap):
        cmd = ["tshark", "-r", str(pcap), "-T", "fields", "-E", "occurrence=a"]
        for f in fields:
            cmd += ["-e", f]
        return sorted(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines())

    original, rebuilt = gold_rebuilt
    assert dissect(rebuilt) == dissect(original)


def test_pcap_rebuild_reads_back_as_the_original(gold_rebuilt, gold_parquet, tmp_path):
    rows = dnsprobe_read(gold_rebuilt[1], tmp_path)
    assert [_key(r) for r in rows] == [_key(r) for r in gold_parquet]
    padded = 0
    for ours, theirs in zip(rows, gold_parquet):
        # Frame lengths too, but for Ethernet's padding of short frames to 60 bytes, which C-DNS cannot know.
        if ours["len"] != theirs["len"]:
            assert ours["len"] < theirs["len"] == 60
            padded += 1
        assert ours | {"len": theirs["len"]} == theirs  # UDP checksums too: same messages, same headers
    assert padded < 10


# -- 3. a hand-made file: what gold does not have ---------------------------------------------------------

T0 = 1_600_000_000
ALL_QR_HINTS = 0x3FBFF  # every Q/R field but response-processing-data, sections included
ALL_SIG_HINTS = 0x1FFFF


def _opt(code, value):
    return code.to_bytes(2, "big") + len(value).to_bytes(2, "big") + value


def _name(text):
    return b"".join(bytes([len(p)]) + p.encode() for p in text.split(".") if p) + b"\0"


def _handmade(two_params=True):
    """A C-DNS file (as a list: file type id, preamble, blocks) written with cbor2 and the CDDL's keys."""
    storage0 = {0: 1_000_000, 1: 100, 2: {0: ALL_QR_HINTS, 1: ALL_SIG_HINTS, 2: 3, 3: 1}, 3: [0, 5], 4: [1, 5, 41],
                -7: "implementation data"}
    storage1 = {0: 1000, 1: 100, 2: {0: 0x3FF, 1: ALL_SIG_HINTS, 2: 0, 3: 0}, 3: [0], 4: [1], 6: 24}
    preamble = {0: 1, 1: 0, 2: 7, 3: [{0: storage0, 1: {0: 5000, 6: [10], -2: True}}], -1: "ignored"}
    if two_params:
        preamble[3].append({0: storage1})
    q_opt = _opt(3, b"") + _opt(8, b"\x00\x01\x18\x00\xc6\x33\x64")  # NSID request, client subnet 198.51.100/24
    r_opt = _opt(3, b"ns1") + _opt(15, b"\x00\x12")  # NSID "ns1", extended error 18 (prohibited)
    tables = {
        0: [b"\xc0\x00\x02\x01", b"\xc0\x00\x02\x35", b"\x20\x01\x0d\xb8" + bytes(11) + b"\x01",
            b"\x20\x01\x0d\xb8" + bytes(11) + b"\x53"],
        1: [{0: 1, 1: 1}, {0: 5, 1: 1}, {0: 28, 1: 1}, {0: 41, 1: 1232}, {0: 2, 1: 1}],
        2: [_name("www.Example.com"), _name("alias.example.net"), _name("example.org"), q_opt, r_opt, b"\0",
            _name("late.example"), _name("example.com"), _name("ns.example.com")],
        3: [
            # 0: UDP/IPv4 query+response, both with OPT; query DO + RD, response RD RA; BADVERS-free NXDOMAIN
            {0: 1, 1: 53, 2: 0, 4: 0b1111, 5: 0, 6: 0x1890, 7: 0, 8: 0, 9: 1, 10: 0, 11: 0, 12: 1, 13: 0, 14: 1232,
             15: 3, 16: 3 | 16, -4: "x"},
            # 1: TCP/IPv6, query only, no OPT, CD set
            {0: 3, 1: 53, 2: 0b11, 4: 0b1, 5: 0, 6: 0x01, 7: 0, 8: 2, 9: 1, 10: 0, 11: 0, 12: 0},
            # 2: UDP/IPv4, response only, AA set
            {0: 1, 1: 53, 2: 0, 4: 0b10, 5: 0, 6: 0x4000, 8: 0, 9: 1, 16: 0},
        ],
        6: [[0], [1], [2]],
        7: [{0: 0, 1: 1, 2: 300, 3: 1},  # www.Example.com CNAME alias.example.net
            {0: 7, 1: 4, 2: 3600, 3: 8},  # example.com NS ns.example.com
            {0: 5, 1: 3, 2: 0x01008000, 3: 4}],  # OPT, udp 1232, extended rcode 1, version 0, DO
        8: [{0: 1, 1: 53, 2: 0, 3: b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03ab"}],
    }
    items = [
        {0: 100, 1: 0, 2: 40000, 3: 0xBEEF, 4: 0, 5: 63, 6: 1500, 7: 0, 8: 60, 9: 120, 11: {}, 12: {1: 0, 2: 1, 3: 2},
         -9: [1, 2]},
        {0: 200, 1: 2, 2: 50000, 3: 7, 4: 1, 5: 57, 7: 2, 8: 29},
        {0: 300, 1: 0, 2: 40001, 3: 8, 4: 2, 7: 0, 9: 33, 12: {}},
    ]
    block_a = {0: {0: [T0, 500_000]}, 1: {0: 6, 1: 3, -3: 1}, 2: tables, 3: items,
               5: [{0: 400, 1: 0, 2: 40002, 3: 0}], -1: {"ours": True}}
    blocks = [block_a]
    if two_params:
        block_b = {0: {0: [T0 + 10, 250], 1: 1},
                   2: {0: [b"\xc6\x33\x64", b"\xc0\x00\x02\x35"], 1: [{0: 1, 1: 1}], 2: [_name("prefix.test")],
                       3: [{0: 1, 1: 53, 2: 0, 4: 0b1, 6: 0, 8: 0, 9: 1}]},
                   3: [{0: 5, 1: 0, 2: 1234, 3: 99, 4: 0, 7: 0, 8: 29}]}
        blocks += [block_b, {0: {0: [T0 + 20, 0]}}]  # the last one has no tables and no items
    return ["C-DNS", preamble, blocks]


def _write(path, parts, indefinite=True, close=True):
    data = b"\x83" + cbor2.dumps(parts[0]) + cbor2.dumps(parts[1])
    if indefinite:
        data += b"\x9f" + b"".join(cbor2.dumps(b) for b in parts[2]) + (b"\xff" if close else b"")
    else:
        data += cbor2.dumps(parts[2])
    path.write_bytes(data)
    return path


def test_handmade_file(tmp_path):
    path = _write(tmp_path / "hand.cdns", _handmade())
    rows = list(read_records(path))
    assert len(rows) == 5
    matched, query_only, response_only, malformed, prefixed = rows
    base = T0 * 10**9 + 500_000_000
    assert {k: matched[k] for k in (
        "id", "qname", "domainname", "labels", "qtype", "qclass", "src", "srcp", "dst", "dstp", "ipv", "prot", "ttl",
        "dns_len", "dns_res_len", "query_time", "response_time", "response_delay_us", "rd", "ra", "cd", "aa", "tc",
        "opcode", "rcode", "ancount", "nscount", "arcount", "qdcount", "edns_udp", "edns_version", "edns_do",
        "edns_client_subnet", "edns_nsid", "edns_ede", "res_edns_udp", "edns_other", "query_present",
        "response_present", "malformed")} == {
        "id": 0xBEEF, "qname": "www.Example.com", "domainname": "example.com", "labels": 3, "qtype": 1, "qclass": 1,
        "src": "192.0.2.1", "srcp": 40000, "dst": "192.0.2.53", "dstp": 53, "ipv": 4, "prot": 17, "ttl": 63,
        "dns_len": 60, "dns_res_len": 120, "query_time": base + 100_000, "response_time": base + 1_600_000,
        "response_delay_us": 1500, "rd": True, "ra": False, "cd": False, "aa": False, "tc": False, "opcode": 0,
        "rcode": 19, "ancount": 1, "nscount": 1, "arcount": 1, "qdcount": 1, "edns_udp": 1232, "edns_version": 0,
        "edns_do": True, "edns_client_subnet": "198.51.100.0/24", "edns_nsid": "ns1", "edns_ede": [18],
        "res_edns_udp": 1232, "edns_other": "8", "query_present": True, "response_present": True, "malformed": False,
    }
    assert query_only["prot"] == 6 and query_only["ipv"] == 6 and query_only["src"] == "2001:db8::1"
    assert query_only["dst"] == "2001:db8::53" and query_only["qname"] == "example.org" and query_only["qtype"] == 28
    assert query_only["cd"] is True and query_only["rd"] is False and query_only["ttl"] == 57
    assert query_only["response_present"] is False and query_only["rcode"] is None
    assert query_only["ancount"] is None and query_only["edns_udp"] == 0
    assert query_only["query_time"] == base + 200_000 and query_only["response_time"] is None
    assert response_only["query_present"] is False and response_only["response_present"] is True
    assert response_only["response_time"] == base + 300_000 and response_only["time"] == (base + 300_000) // 1000
    assert response_only["aa"] is True and response_only["rd"] is None and response_only["dns_len"] is None
    assert response_only["ancount"] == 0 and response_only["dns_res_len"] == 33 and response_only["rcode"] == 0
    assert response_only["src"] == "192.0.2.1" and response_only["srcp"] == 40001  # the client, as always
    assert malformed["malformed"] is True and malformed["id"] == 0x1234 and malformed["query_present"] is True
    assert malformed["srcp"] == 40002 and malformed["query_time"] == base + 400_000
    assert prefixed["src"] == "198.51.100.0" and prefixed["qname"] == "prefix.test"
    assert prefixed["query_time"] == (T0 + 10) * 10**9 + 255_000_000  # 1000 ticks/s: 250 + 5 ticks
    assert prefixed["ancount"] is None  # that block's hints say sections were not recorded


def test_handmade_query_opt_in_additional_section(tmp_path):
    """RFC 8618 7.6.2: the query's OPT may be in its additional section instead of the signature."""
    parts = _handmade(two_params=False)
    tables, items = parts[2][0][2], parts[2][0][3]
    for key in (13, 14, 15):  # query-edns-version, query-udp-size, query-opt-rdata-index
        del tables[3][0][key]
    items[0][11] = {3: 2}  # additional: rrlist 2 = [the OPT RR, class 1232, DO]
    row = next(read_records(_write(tmp_path / "opt.cdns", parts)))
    assert (row["edns_udp"], row["edns_version"], row["edns_do"], row["rcode"]) == (1232, 0, True, 19)
    assert row["edns_other"] == "15"  # the options of that OPT RR: NSID (not "other") and EDE
    pcap = tmp_path / "opt.pcap"
    run_dnsprobe("inspect", "--pcap", pcap, tmp_path / "opt.cdns")
    query = dpkt.dns.DNS(next(buf for _, buf in _dns_messages(pcap) if buf[:3] == b"\xbe\xef\x01"))
    assert [rr.type for rr in query.ar] == [41]  # once: not also made up from the signature


def test_handmade_definite_block_array(tmp_path):
    a = list(read_records(_write(tmp_path / "a.cdns", _handmade())))
    assert list(read_records(_write(tmp_path / "b.cdns", _handmade(), indefinite=False))) == a


def test_handmade_pcap_reads_back(tmp_path):
    """TCP/IPv6, query-only, response-only, OPT and malformed messages rebuilt, then read by dnsprobe."""
    path = _write(tmp_path / "hand.cdns", _handmade(two_params=False))
    pcap = tmp_path / "hand.pcap"
    assert "5 DNS messages" in run_dnsprobe("inspect", "--pcap", pcap, path).stdout
    out = tmp_path / "out"
    out.mkdir()
    got = sorted(dnsprobe_read(pcap, out), key=lambda r: r["time"])
    want = sorted(read_records(path), key=lambda r: r["time"])
    # The hand-made sizes are not those of the rebuilt messages; C-DNS has no hop limit for a malformed
    # message (the rebuilt packet has 64).
    skip = ("dns_len", "dns_res_len", "ttl")
    for ours, theirs in zip(got, want, strict=True):
        assert {c: ours[c] for c in theirs if c not in skip} == {c: v for c, v in theirs.items() if c not in skip}
        assert ours["ttl"] == (64 if theirs["malformed"] else theirs["ttl"])
    msgs = _dns_messages(pcap)
    query = dpkt.dns.DNS(next(buf for _, buf in msgs if buf[:2] == b"\xbe\xef"))
    opt = query.ar[0]
    assert opt.type == 41 and opt.cls == 1232 and opt.ttl == 0x8000 and opt.rdata.endswith(b"\xc6\x33\x64")


@needs_shared
def test_pcap_needs_full_sections(tmp_path):
    path = _write(tmp_path / "hand.cdns", _handmade())
    proc = run_dnsprobe("inspect", "--pcap", tmp_path / "x.pcap", path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert str(path) in proc.stderr and "full sections were not recorded" in proc.stderr
    assert "query-question-sections" in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = run_dnsprobe("inspect", "--pcap", tmp_path / "x.pcap", GOLD_PCAP, check=False)
    assert proc.returncode == 2 and "C-DNS files only" in proc.stderr


# -- 4. bad input -----------------------------------------------------------------------------------------


def _gold_parts():
    skip_without_shared(GOLD_CDNS)
    return cbor2.loads(lzma.decompress(GOLD_CDNS.read_bytes()))


def _bad(name, parts=None, **kw):
    def make(tmp_path):
        p = _gold_parts() if parts is None else parts
        p[2] = p[2] * 2  # two blocks: the first is printed before the problem
        return _write(tmp_path / name, p, **kw)
    return make


def _cut(tmp_path):
    path = _bad("cut.cdns")(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    return path


def _modified(name, change):
    def make(tmp_path):
        parts = _gold_parts()
        change(parts)
        return _bad(name, parts)(tmp_path)
    return make


def _index_file(tmp_path):
    parts = _gold_parts()
    block = copy.deepcopy(parts[2][0])
    block[3][5][4] = 99
    parts[2] = [parts[2][0], block]
    return _write(tmp_path / "index.cdns", parts)


def _deep(tmp_path):
    path = tmp_path / "deep.cdns"
    path.write_bytes(b"\x83" + cbor2.dumps("C-DNS") + b"\x81" * 200_000 + b"\x00" + b"\x9f\xff")
    return path


def _xz_cut(tmp_path):
    path = tmp_path / "cut.cdns.xz"
    skip_without_shared(GOLD_CDNS)
    data = GOLD_CDNS.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


BAD = [
    ("no closing break", _bad("nobreak.cdns", close=False), 1998,
     "truncated: the block array has no closing break (2 blocks read)"),
    ("cut in a block", _cut, 999, "truncated: the file ends inside block 1"),
    ("cut compressed stream", _xz_cut, 0, "decompression failed"),
    ("preamble nested 200,000 deep", _deep, 0, "the file preamble is not valid CBOR: maximum container nesting depth"),
    ("wrong file type id", _modified("magic.cdns", lambda p: p.__setitem__(0, "X-DNS")), 0,
     "not a C-DNS file (file type id 'X-DNS'"),
    ("wrong major version", _modified("major.cdns", lambda p: p[1].__setitem__(0, 2)), 0,
     "unsupported C-DNS format version 2.0"),
    ("index out of range", _index_file, 999, "block 1: qr-sig index 99 out of range (the table has 8 entries)"),
    ("no block parameters", _modified("noparams.cdns", lambda p: p[1].pop(3)), 0, "block-parameters"),
    ("wrong type", _modified("type.cdns", lambda p: p[2][0][3][0].__setitem__(2, "port")), 0,
     "block 0: a field has a value of the wrong type"),
    # found by fuzz/fuzz_cdns_reader.py: an item that is an array was indexed as a map (IndexError traceback)
    ("item not a map", _modified("item.cdns", lambda p: p[2][0][3].__setitem__(0, [0, 1, 2])), 0,
     "block 0: a Q/R item is a list, not a map"),
    # block-parameters[0] → storage-parameters (0) → storage-hints (2) → query-response-hints (0)
    ("hints not a map", _modified("hints.cdns", lambda p: p[1][3][0][0].__setitem__(2, 7)), 0,
     "block parameters 0: storage-hints is not a map"),
    ("hint not a mask", _modified("hint.cdns", lambda p: p[1][3][0][0][2].__setitem__(0, "all")), 0,
     "block parameters 0: query-response-hints 'all' is not a bit mask"),
]


@pytest.mark.parametrize("make, printed, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(tmp_path, make, printed, message):
    path = make(tmp_path)
    proc = run_dnsprobe("inspect", path, "--json", "--limit", "0", "--columns", "id", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert str(path) in proc.stderr and message in proc.stderr, proc.stderr
    assert len(proc.stdout.splitlines()) == printed
    proc = run_dnsprobe("inspect", "--pcap", tmp_path / "out.pcap", path, check=False)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr and str(path) in proc.stderr


@needs_shared
def test_trailing_bytes_and_not_cdns(tmp_path):
    path = _write(tmp_path / "t.cdns", _gold_parts())
    path.write_bytes(path.read_bytes() + b"junk")
    proc = run_dnsprobe("inspect", path, "--limit", "0", check=False)
    assert proc.returncode == 1 and "unexpected bytes after the end of the C-DNS file" in proc.stderr
    pcap = tmp_path / "x.cdns"
    pcap.write_bytes(lzma.decompress(GOLD_PCAP.read_bytes()))
    proc = run_dnsprobe("inspect", pcap, check=False)
    assert proc.returncode == 1 and "neither a Parquet file nor a C-DNS file" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_dnsprobe("inspect", tmp_path / "missing.cdns", check=False)
    assert proc.returncode == 2 and "no such file" in proc.stderr


# -- 5. our writer, read back -----------------------------------------------------------------------------


# (capture, OPT flags other than DO in it): C-DNS 1.0 has no field for those flags (only DO), so the
# rebuilt OPT lacks them; testcontent-ednsflags.pcap's query sets two of them.
ROUND_TRIP = [
    (GOLD_PCAP, False),
    (COMPACTOR_DATA / "matching.pcap.xz", False),
    (COMPACTOR_DATA / "unmatched.pcap.xz", False),
    (COMPACTOR_DATA / "malformed.pcap.xz", False),  # Linux cooked capture, malformed messages
    (COMPACTOR_DATA / "testcontent.pcap.xz", False),
    (COMPACTOR_DATA / "testcontent-ednsflags.pcap.xz", True),
    (DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap", False),  # pcapng
    (DNSPROBE_DATA / "test_pcaps" / "tcp_simple.pcap", False),
    (DNSPROBE_DATA / "test_pcaps" / "tcp_axfr_zone_transfer.pcap", False),
    (DNSPROBE_DATA / "test_pcaps" / "edns_dnssec_nsid.pcap", False),  # RRSIG, NSEC, NSID
    (ROOT / "samples" / "sample-mix.pcap.xz", False),  # 20,000 packets: UDP and TCP, IPv4 and IPv6
]


def _decoded_messages(pcap):
    """(flow, DNS bytes) of every DNS message of a capture, UDP or reassembled TCP, by dnsprobe's decoder."""
    from probe.capture.pcapfile import read_capture
    from probe.config import load_config
    from probe.decode.packets import PacketDecoder
    from probe.model import M
    from probe.stats import Stats

    cfg = load_config(None)
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats())
    msgs = [m for batch in read_capture(pcap) for m in decoder.decode(batch)]
    return [((m[M.SRC], m[M.SPORT], m[M.DST], m[M.DPORT]), m[M.RAW]) for m in msgs]


def _content_or_bytes(buf, edns_z):
    try:
        return repr(_content(buf, edns_z))
    except (struct.error, IndexError, dpkt.UnpackError, AssertionError):
        return repr(buf)  # a malformed message is rebuilt from its recorded bytes


def _multiset(rows):
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


@pytest.mark.parametrize("pcap, edns_z_lost", ROUND_TRIP, ids=[p.name for p, _ in ROUND_TRIP])
def test_round_trip_through_our_cdns(tmp_path, pcap, edns_z_lost):
    (tmp_path / "pq").mkdir()
    parquet = dnsprobe_read(pcap, tmp_path / "pq")
    cdns_dir = tmp_path / "cdns"
    cdns_dir.mkdir()
    run_dnsprobe("read", pcap, "-o", cdns_dir, "-q", "--no-progress", "--format", "cdns",
                 "--set", "export.cdns_full_sections=true")
    files = sorted(cdns_dir.glob("*.cdns*"))
    assert files
    # The same transactions, every field C-DNS carries equal (malformed messages come after a block's
    # Q/R items in C-DNS, so the rows are compared as multisets). A malformed message has no hop limit in
    # C-DNS (RFC 8618 MalformedMessage): its ttl is null.
    cdns_rows = [row for f in files for row in read_records(f)]
    columns = set(cdns_rows[0])
    for r in parquet:
        if r["malformed"]:
            r["ttl"] = None
    assert _multiset(cdns_rows) == _multiset({c: r[c] for c in columns} for r in parquet)
    # Every DNS message of the capture is in the rebuilt pcap, with equal content.
    rebuilt = tmp_path / "rebuilt.pcap"
    run_dnsprobe("inspect", "--pcap", rebuilt, *files)
    want = [(flow, _content_or_bytes(buf, True)) for flow, buf in _decoded_messages(pcap)]
    got = [(flow, _content_or_bytes(buf, True)) for flow, buf in _decoded_messages(rebuilt)]
    assert len(want) == len(got)
    if edns_z_lost:
        assert sorted(want) != sorted(got)
        want = [(flow, _content_or_bytes(buf, False)) for flow, buf in _decoded_messages(pcap)]
        got = [(flow, _content_or_bytes(buf, False)) for flow, buf in _decoded_messages(rebuilt)]
    assert sorted(want) == sorted(got)


def test_cbor2_floor_is_past_the_advisories_and_what_the_reader_needs():
    # cbor2 before 5.9 recursed without its own bound into deeply nested input (CVE-2026-26209; 5.8: values
    # shared across decodes, CVE-2025-68131); 6.1 panicked on some damaged files this reader must refuse, and
    # 5.x decoders read past the preamble (the reader's tests fail with them). The floor says so.
    import importlib.metadata
    import re

    floor = re.search(r'"cbor2>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    as_tuple = lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:2])  # noqa: E731
    assert as_tuple(floor) >= (6, 2), floor
    assert as_tuple(importlib.metadata.version("cbor2")) >= as_tuple(floor)
