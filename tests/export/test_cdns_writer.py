"""C-DNS (RFC 8618) writer: every file the real `dnsprobe read --format cdns` writes is checked against
the RFC's CDDL with pycddl (tests/data/cdns/rfc8618-pycddl.cddl) and against the rules that schema cannot
express; the content is decoded here with plain cbor2 (independently of dnsprobe's reader) and compared
with the Parquet output of the same input, with compactor's expected values and figures, and with dpkt's
view of the original messages.
"""

import collections
import functools
import gzip
import ipaddress
import json
import lzma
import os
import shutil
import socket
from pathlib import Path

import cbor2
import dpkt
import pycddl
import pytest
import zstandard
from scapy.layers.dns import DNS, DNSQR, DNSRR, DNSRROPT, DNSRRSOA, DNSRRSRV, EDNS0ClientSubnet
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPerror, UDPerror
from scapy.layers.inet6 import ICMPv6DestUnreach, IPerror6, IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap
from support.data import CDNS_CDDL, COMPACTOR_DATA, DNSPROBE_DATA, ROOT
from support.dnsprobe import as_rows, read_output, run_dnsprobe
from support.frames import MAC_C, MAC_S

from export.cdns import format as F
from export.filemeta import read_meta

# pycddl 0.6 rejects the second branch of a choice between two sized byte strings (`bstr .size (0..4) /
# bstr .size (0..16)` refuses 16 bytes: "expected uint to be in range 0 <= value <= 4"), so every IPv6
# address would fail. IPAddress is spelled as the one equivalent type (a byte string of 0 to 16 bytes).
_IP_CHOICE = "IPAddress = IPv4Address / IPv6Address"
# RFC 8618 7.1 reserves negative map keys for implementation-specific entries "to any map", which its CDDL does not
# spell out; dnsprobe writes one in the collection parameters (export.filemeta), which are made open to them here,
# and only there: anywhere else a negative key still fails.
_LAST_COLLECTION_PARAMETER = "? host-id            => tstr,"


@functools.cache
def cddl_schema():
    """RFC 8618's CDDL (tests/data/cdns) for pycddl."""
    cddl = CDNS_CDDL.read_text()
    assert cddl.count(_IP_CHOICE) == 1 and cddl.count(_LAST_COLLECTION_PARAMETER) == 1
    cddl = cddl.replace(_LAST_COLLECTION_PARAMETER, _LAST_COLLECTION_PARAMETER + " * nint => any,")
    return pycddl.Schema(cddl.replace(_IP_CHOICE, "IPAddress = bstr .size (0..16)"))


SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"
SECTION_BITS = {
    (F.QUERY_EXTENDED, F.QUESTION_INDEX): "query-question-sections",
    (F.QUERY_EXTENDED, F.ANSWER_INDEX): "query-answer-sections",
    (F.QUERY_EXTENDED, F.AUTHORITY_INDEX): "query-authority-sections",
    (F.QUERY_EXTENDED, F.ADDITIONAL_INDEX): "query-additional-sections",
    (F.RESPONSE_EXTENDED, F.ANSWER_INDEX): "response-answer-sections",
    (F.RESPONSE_EXTENDED, F.AUTHORITY_INDEX): "response-authority-sections",
    (F.RESPONSE_EXTENDED, F.ADDITIONAL_INDEX): "response-additional-sections",
}
DECOMPRESS = {".gz": gzip.decompress, ".xz": lzma.decompress}


# ---------------------------------------------------------------------------------------------
# Reading and checking files


def raw_bytes(path):
    """The C-DNS bytes of a file, decompressed by its suffix."""
    data = Path(path).read_bytes()
    if path.suffix == ".zst":
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if path.suffix in DECOMPRESS:
        return DECOMPRESS[path.suffix](data)
    return data


def cdns_files(directory):
    files = sorted(p for p in Path(directory).iterdir() if ".cdns" in p.name)
    assert files, f"no C-DNS files in {directory}"
    assert not [p for p in files if p.name.endswith(".part")], "a .part file was left"
    return files


def _hint(bit_table, name):
    return 1 << bit_table[name]


FULL_VALIDATION_ITEMS = 300  # pycddl takes about 2 ms per Q/R item: larger files are validated as shapes


def _shape(value, keep=()):
    """What the CDDL can tell apart about a value: map keys, value types, the sign of integers, the length
    of short byte strings (addresses), and the values of the keys in `keep` (value-constrained)."""
    if isinstance(value, dict):
        return ("map",) + tuple(sorted((k, v if k in keep else _shape(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", bool(value)) + tuple(sorted({_shape(v) for v in value}, key=repr))
    if isinstance(value, bytes):
        return ("bytes", min(len(value), 17))
    if isinstance(value, bool) or not isinstance(value, int):
        return (type(value).__name__, value if isinstance(value, (bool, str)) else None)
    return ("uint",) if value >= 0 else ("nint",)


def _one_per_shape(values, keep=()):
    seen = {}
    for v in values:
        seen.setdefault(_shape(v, keep), v)
    return list(seen.values())


def by_shape(doc):
    """The file with every array of items or table entries cut to one element per distinct shape: for the
    CDDL (whose only value constraints in those arrays are qr-type and ae-type) it is valid exactly when
    the whole file is."""
    blocks = []
    for block in doc[2]:
        block = dict(block)
        if F.BLOCK_TABLES in block:
            block[F.BLOCK_TABLES] = {
                k: _one_per_shape(v, (F.QR_TYPE,) if k == F.QR_SIG else ()) for k, v in block[F.BLOCK_TABLES].items()
            }
        for key in (F.QUERY_RESPONSES, F.MALFORMED_MESSAGES, F.ADDRESS_EVENT_COUNTS):
            if key in block:
                block[key] = _one_per_shape(block[key], (F.AE_TYPE,) if key == F.ADDRESS_EVENT_COUNTS else ())
        blocks.append(block)
    return cbor2.dumps([doc[0], doc[1], blocks])


def check_file(path):
    """Validate one file: CDDL, streaming layout, and the rules the CDDL cannot say. Returns the decoded file."""
    data = raw_bytes(path)
    doc = cbor2.loads(data)
    items = sum(len(b.get(F.QUERY_RESPONSES, ())) for b in doc[2])
    cddl_schema().validate_cbor(data if items <= FULL_VALIDATION_ITEMS else by_shape(doc))
    # Streamed layout: a definite array of 3 and an indefinite block array closed by a break.
    head = b"\x83" + cbor2.dumps("C-DNS") + cbor2.dumps(doc[1])
    assert data.startswith(head) and data[len(head)] == 0x9F and data[-1] == 0xFF
    preamble = doc[1]
    assert preamble[F.MAJOR_FORMAT_VERSION] == 1 and preamble[F.MINOR_FORMAT_VERSION] == 0
    params = preamble[F.BLOCK_PARAMETERS][0]
    storage = params[F.STORAGE_PARAMETERS]
    hints = storage[F.STORAGE_HINTS]
    max_items = storage[F.MAX_BLOCK_ITEMS]
    assert storage[F.TICKS_PER_SECOND] == 1_000_000
    assert sorted(storage[F.OPCODES]) == list(range(16))
    present = collections.defaultdict(int)  # hint table key -> bits seen
    for block in doc[2]:
        assert F.BLOCK_PARAMETERS_INDEX not in block[F.BLOCK_PREAMBLE]
        assert len(block[F.BLOCK_PREAMBLE][F.EARLIEST_TIME]) == 2
        tables = block.get(F.BLOCK_TABLES, {})
        for key, table in tables.items():
            assert table, f"empty table {key}"
        assert (F.QLIST in tables) == (F.QRR in tables)
        assert (F.RRLIST in tables) == (F.RR in tables)
        size = {key: len(tables.get(key, ())) for key in range(9)}

        def idx(value, table, what, size=size):
            assert isinstance(value, int) and 0 <= value < size[table], f"{what} index {value} out of range"

        for sig in tables.get(F.QR_SIG, ()):
            for key in sig:
                present[F.QUERY_RESPONSE_SIGNATURE_HINTS] |= 1 << key
            idx(sig[F.SERVER_ADDRESS_INDEX], F.IP_ADDRESS, "server address")
            if F.QUERY_CLASSTYPE_INDEX in sig:
                idx(sig[F.QUERY_CLASSTYPE_INDEX], F.CLASSTYPE, "classtype")
            if F.QUERY_OPT_RDATA_INDEX in sig:
                idx(sig[F.QUERY_OPT_RDATA_INDEX], F.NAME_RDATA, "opt rdata")
        refs = ((F.NAME_INDEX, F.NAME_RDATA), (F.CLASSTYPE_INDEX, F.CLASSTYPE))
        rr_refs = refs + ((F.RDATA_INDEX, F.NAME_RDATA),)
        for lists, entries, entry_refs in ((F.QLIST, F.QRR, refs), (F.RRLIST, F.RR, rr_refs)):
            for indexes in tables.get(lists, ()):
                assert indexes
                for i in indexes:
                    idx(i, entries, f"table {entries}")
            for entry in tables.get(entries, ()):
                for key, table in entry_refs:
                    idx(entry[key], table, f"table {entries} key {key}")
        for rr in tables.get(F.RR, ()):
            present[F.RR_HINTS] |= (1 << F.RR_HINT_BITS["ttl"]) if F.TTL in rr else 0
            present[F.RR_HINTS] |= 1 << F.RR_HINT_BITS["rdata-index"]
        for mm in tables.get(F.MALFORMED_MESSAGE_DATA, ()):
            idx(mm[F.MM_SERVER_ADDRESS_INDEX], F.IP_ADDRESS, "malformed server")
        items = block.get(F.QUERY_RESPONSES, [])
        malformed = block.get(F.MALFORMED_MESSAGES, [])
        events = block.get(F.ADDRESS_EVENT_COUNTS, [])
        assert len(items) <= max_items and len(malformed) <= max_items and len(events) <= max_items
        stats = block[F.BLOCK_STATISTICS]
        assert stats[F.QR_DATA_ITEMS] == len(items) and stats[F.MALFORMED_ITEMS] == len(malformed)
        for item in items:
            for key in item:
                if key < F.RESPONSE_PROCESSING_DATA:
                    present[F.QUERY_RESPONSE_HINTS] |= 1 << key
            idx(item[F.CLIENT_ADDRESS_INDEX], F.IP_ADDRESS, "client")
            idx(item[F.QR_SIGNATURE_INDEX], F.QR_SIG, "signature")
            if F.QUERY_NAME_INDEX in item:
                idx(item[F.QUERY_NAME_INDEX], F.NAME_RDATA, "query name")
            for side in (F.QUERY_EXTENDED, F.RESPONSE_EXTENDED):
                for key, value in item.get(side, {}).items():
                    present[F.QUERY_RESPONSE_HINTS] |= _hint(F.QR_HINT_BITS, SECTION_BITS[(side, key)])
                    idx(value, F.QLIST if key == F.QUESTION_INDEX else F.RRLIST, "section")
        for mm in malformed:
            idx(mm[F.MESSAGE_DATA_INDEX], F.MALFORMED_MESSAGE_DATA, "malformed data")
            idx(mm[F.CLIENT_ADDRESS_INDEX], F.IP_ADDRESS, "malformed client")
            present[F.OTHER_DATA_HINTS] |= 1 << F.OTHER_DATA_HINT_BITS["malformed-messages"]
        for ev in events:
            idx(ev[F.AE_ADDRESS_INDEX], F.IP_ADDRESS, "event address")
            present[F.OTHER_DATA_HINTS] |= 1 << F.OTHER_DATA_HINT_BITS["address-event-counts"]
    for key, bits in present.items():
        assert bits & ~hints[key] == 0, f"hint table {key}: fields {bits & ~hints[key]:#x} written but not declared"
    return doc, present


def read_cdns(out_dir):
    """(decoded files, union of the hint bits of the fields present) of every C-DNS file of a directory."""
    docs = []
    present = collections.defaultdict(int)
    for path in cdns_files(out_dir):
        doc, seen = check_file(path)
        docs.append(doc)
        for key, bits in seen.items():
            present[key] |= bits
    return docs, present


def run(pcap, out_dir, *extra):
    run_dnsprobe("read", pcap, "-o", out_dir, "-q", "--no-progress", "--format", "cdns", *extra)
    stats = json.loads(next(Path(out_dir).glob("*.stats.json")).read_text())
    return stats["counters"], stats


# ---------------------------------------------------------------------------------------------
# Decoding items into rows with Parquet's column names


def _addr(packed):
    return str(ipaddress.ip_address(packed)) if len(packed) in (4, 16) else packed.hex()


def _labels(wire):
    labels, pos = [], 0
    while wire[pos]:
        labels.append(wire[pos + 1 : pos + 1 + wire[pos]])
        pos += wire[pos] + 1
    return labels


def name_text(wire):
    return b".".join(_labels(wire)).decode("utf-8", "backslashreplace")


def records(docs):
    """(Q/R rows, malformed rows) of decoded files, each row a dict with Parquet's column names."""
    rows, bad = [], []
    for doc in docs:
        for block in doc[2]:
            secs, ticks = block[F.BLOCK_PREAMBLE][F.EARLIEST_TIME]
            base = secs * 1_000_000 + ticks
            t = block.get(F.BLOCK_TABLES, {})
            ip, names, sigs, cts = (t.get(k, []) for k in (F.IP_ADDRESS, F.NAME_RDATA, F.QR_SIG, F.CLASSTYPE))
            for it in block.get(F.QUERY_RESPONSES, []):
                sig = sigs[it[F.QR_SIGNATURE_INDEX]]
                sflags = sig[F.QR_SIG_FLAGS]
                hq, hr = bool(sflags & F.QR_HAS_QUERY), bool(sflags & F.QR_HAS_RESPONSE)
                fl = sig[F.QR_DNS_FLAGS]
                ct = cts[sig[F.QUERY_CLASSTYPE_INDEX]] if F.QUERY_CLASSTYPE_INDEX in sig else {}
                when = base + it[F.TIME_OFFSET]
                tflags = sig[F.QR_TRANSPORT_FLAGS]

                def qbit(bit, hq=hq, fl=fl):
                    return bool(fl >> bit & 1) if hq else None

                def rbit(bit, hr=hr, fl=fl):
                    return bool(fl >> (bit + 8) & 1) if hr else None

                rows.append({
                    "id": it[F.TRANSACTION_ID], "time": when,
                    "qname": name_text(names[it[F.QUERY_NAME_INDEX]]) if F.QUERY_NAME_INDEX in it else None,
                    "src": _addr(ip[it[F.CLIENT_ADDRESS_INDEX]]), "srcp": it[F.CLIENT_PORT],
                    "dst": _addr(ip[sig[F.SERVER_ADDRESS_INDEX]]), "dstp": sig[F.SERVER_PORT],
                    "ipv": 6 if tflags & F.TRANSPORT_IPV6 else 4,
                    "prot": 6 if (tflags & F.TRANSPORT_MASK) >> F.TRANSPORT_SHIFT == F.TRANSPORT_TCP else 17,
                    "ttl": it.get(F.CLIENT_HOPLIMIT), "dns_len": it.get(F.QUERY_SIZE),
                    "dns_res_len": it.get(F.RESPONSE_SIZE),
                    "qtype": ct.get(F.TYPE), "qclass": ct.get(F.CLASS), "opcode": sig[F.QUERY_OPCODE],
                    "rcode": sig.get(F.RESPONSE_RCODE), "qdcount": sig[F.QUERY_QDCOUNT] if hq else None,
                    "aa": rbit(6), "tc": rbit(5), "rd": qbit(4), "ra": qbit(3), "z": qbit(2), "ad": qbit(1),
                    "cd": qbit(0), "edns_do": qbit(7),
                    "edns_udp": sig.get(F.QUERY_UDP_SIZE, 0) if hq else None,
                    "edns_version": sig.get(F.QUERY_EDNS_VERSION, 0) if hq else None,
                    "query_present": hq, "response_present": hr,
                    "response_delay_us": it.get(F.RESPONSE_DELAY),
                    "query_time": when if hq else None,
                    "response_time": (when + it[F.RESPONSE_DELAY] if hq else when) if hr else None,
                    "malformed": False,
                })
            mmd = t.get(F.MALFORMED_MESSAGE_DATA, [])
            for mm in block.get(F.MALFORMED_MESSAGES, []):
                data = mmd[mm[F.MESSAGE_DATA_INDEX]]
                bad.append({
                    "time": base + mm[F.TIME_OFFSET], "src": _addr(ip[mm[F.CLIENT_ADDRESS_INDEX]]),
                    "srcp": mm[F.CLIENT_PORT], "dst": _addr(ip[data[F.MM_SERVER_ADDRESS_INDEX]]),
                    "dstp": data[F.MM_SERVER_PORT], "payload": data[F.MM_PAYLOAD],
                    "ipv": 6 if data[F.MM_TRANSPORT_FLAGS] & F.TRANSPORT_IPV6 else 4,
                })
    return rows, bad


COMPARED = (
    "id", "qname", "src", "srcp", "dst", "dstp", "ipv", "prot", "ttl", "dns_len", "dns_res_len", "qtype", "qclass",
    "opcode", "rcode", "qdcount", "aa", "tc", "rd", "ra", "z", "ad", "cd", "edns_do", "edns_udp", "edns_version",
    "query_present", "response_present", "response_delay_us",
)


def parquet_rows(directory):
    rows = as_rows(read_output(directory))
    for row in rows:
        for col in ("query_time", "response_time"):
            row[col] = None if row[col] is None else row[col] // 1000  # µs, as the C-DNS ticks
    return rows


def assert_same_as_parquet(pcap, tmp_path, *cdns_extra):
    """cdns_extra: options of the C-DNS run only (the Parquet run refuses C-DNS options)."""
    pq_dir, c_dir = tmp_path / "parquet", tmp_path / "cdns"
    pq_dir.mkdir()
    c_dir.mkdir()
    run_dnsprobe("read", pcap, "-o", pq_dir, "-q", "--no-progress")
    counters, _ = run(pcap, c_dir, *cdns_extra)
    rows, bad = records(read_cdns(c_dir)[0])
    expected = parquet_rows(pq_dir)
    good = [r for r in expected if not r["malformed"]]
    malformed = [r for r in expected if r["malformed"]]
    assert len(rows) == len(good) and len(bad) == len(malformed)
    # (Parquet puts unanswered queries in row groups of their own, export.time_order; C-DNS keeps the order of
    # completion: compared in one order)
    order = lambda r: repr([r[c] for c in ("time",) + COMPARED])  # noqa: E731
    rows, good = sorted(rows, key=order), sorted(good, key=order)
    for mine, theirs in zip(rows, good):
        for col in COMPARED + ("time", "query_time", "response_time"):
            assert mine[col] == theirs[col], (col, mine, {c: theirs[c] for c in COMPARED})
    for mine, theirs in zip(bad, malformed):
        for col in ("time", "src", "srcp", "dst", "dstp", "ipv"):
            assert mine[col] == theirs[col], (col, mine, theirs)
        assert len(mine["payload"]) == (theirs["dns_len"] if theirs["query_present"] else theirs["dns_res_len"])
    assert counters["records"] == len(expected)
    return rows, bad


# ---------------------------------------------------------------------------------------------
# Parquet and C-DNS of the same input agree


@pytest.mark.parametrize(
    "pcap",
    [SAMPLE, COMPACTOR_DATA / "knot-live.raw.pcap.xz", COMPACTOR_DATA / "malformed.pcap.xz"]
    + sorted(DNSPROBE_DATA.rglob("*.pcap"))[:2],
    ids=lambda p: p.name,
)
def test_parquet_and_cdns_agree_field_by_field(pcap, tmp_path):
    assert_same_as_parquet(pcap, tmp_path)


def test_agree_with_full_sections_and_xz(tmp_path):
    assert_same_as_parquet(SAMPLE, tmp_path, "--set", "export.cdns_full_sections=true", "--cdns-compression", "xz")


# ---------------------------------------------------------------------------------------------
# compactor's matching edge cases


def _block_totals(docs):
    total = collections.Counter()
    for doc in docs:
        for block in doc[2]:
            total.update(block[F.BLOCK_STATISTICS])
    return total


def test_matching_query_only_and_response_only(tmp_path):
    counters, _ = run(COMPACTOR_DATA / "matching.pcap.xz", tmp_path)
    docs, _ = read_cdns(tmp_path)
    rows, bad = records(docs)
    totals = _block_totals(docs)
    assert totals[F.PROCESSED_MESSAGES] == counters["dns_messages"] == 11
    assert totals[F.QR_DATA_ITEMS] == 8 and not bad
    assert totals[F.UNMATCHED_QUERIES] == counters["query_only"] == 3
    assert totals[F.UNMATCHED_RESPONSES] == counters["response_only"] == 2
    kinds = collections.Counter((r["query_present"], r["response_present"]) for r in rows)
    assert kinds == {(True, True): 3, (True, False): 3, (False, True): 2}
    for r in rows:
        if not r["query_present"]:  # response-only: no query fields; client is the response's destination
            assert r["ttl"] is None and r["dns_len"] is None and r["response_delay_us"] is None
            assert r["dstp"] == 53 and r["dns_res_len"] > 0
        if not r["response_present"]:
            assert r["rcode"] is None and r["dns_res_len"] is None and r["response_delay_us"] is None
    # The TCP response seen without its query (frame 39) is response-only over TCP.
    assert any(r["prot"] == 6 and not r["query_present"] for r in rows)


def test_unmatched_response_before_query(tmp_path):
    run(COMPACTOR_DATA / "unmatched.pcap.xz", tmp_path)
    docs, _ = read_cdns(tmp_path)
    rows, _ = records(docs)
    assert [(r["id"], r["query_present"], r["response_present"]) for r in rows] == [
        (0x0F71, False, True), (0x0FCF, True, False)
    ]
    totals = _block_totals(docs)
    assert (totals[F.UNMATCHED_QUERIES], totals[F.UNMATCHED_RESPONSES]) == (1, 1)


def test_malformed_messages_kept_with_their_bytes(tmp_path):
    counters, _ = run(COMPACTOR_DATA / "malformed.pcap.xz", tmp_path)
    docs, present = read_cdns(tmp_path)
    rows, bad = records(docs)
    assert counters["malformed"] == len(bad) == 2 and len(rows) == 11
    assert _block_totals(docs)[F.MALFORMED_ITEMS] == 2
    # The recorded payloads are the UDP payloads of frames 21 and 24, byte for byte.
    frames = list(dpkt.pcap.Reader(lzma.open(COMPACTOR_DATA / "malformed.pcap.xz")))  # Linux cooked (SLL)
    payloads = [bytes(dpkt.sll.SLL(frames[i][1]).data.data.data) for i in (20, 23)]
    assert [b["payload"] for b in bad] == payloads
    assert all((b["src"], b["dst"], b["dstp"]) == ("192.168.1.2", "192.168.1.252", 53) for b in bad)
    assert present[F.OTHER_DATA_HINTS] & 1


def test_edns_flags_equal_compactor(tmp_path):
    """compactor's expected output for this capture (test-scripts/testcontent-ednsflags.diag): its
    signature and item, but for its own non-RFC bits above bit 14 of qr-dns-flags (CO, DE)."""
    run(COMPACTOR_DATA / "testcontent-ednsflags.pcap.xz", tmp_path, "--set", "export.cdns_full_sections=true")
    (doc,), _ = read_cdns(tmp_path)
    (block,) = doc[2]
    t = block[F.BLOCK_TABLES]
    (item,) = block[F.QUERY_RESPONSES]
    sig = t[F.QR_SIG][item[F.QR_SIGNATURE_INDEX]]
    ip, names = t[F.IP_ADDRESS], t[F.NAME_RDATA]
    assert block[F.BLOCK_PREAMBLE] == {0: [1459884804, 561484]}
    assert ip[sig[0]] == bytes.fromhex("D34F7BEF") and ip[item[1]] == bytes.fromhex("56EDAABC")
    assert t[F.CLASSTYPE][sig[8]] == {0: 33, 1: 1} and names[sig[15]] == b""
    expected_sig = {1: 53, 2: 32, 4: 15, 5: 0, 6: 1032320 & 0x7FFF, 7: 0, 9: 1, 10: 0, 11: 0, 12: 1, 13: 0,
                    14: 4096, 16: 3}
    assert {k: sig[k] for k in expected_sig} == expected_sig and set(sig) == set(expected_sig) | {0, 8, 15}
    expected_item = {0: 0, 2: 51644, 3: 61888, 5: 52, 6: 90, 8: 97, 9: 509}
    assert {k: item[k] for k in expected_item} == expected_item
    assert names[item[7]] == bytes.fromhex(
        "0D787473736B6235716F6E38736E095F6B65726265726F73045F7463700454455643065F7369746573026463065F6D73646373"
        "033137320232300332323202333800"
    )
    # Response sections: authority SOA, NSEC, 2 RRSIGs; additional: the OPT RR (TTL = DO + CO bits).
    assert F.QUERY_EXTENDED not in item  # the query's only extra RR is its OPT, held by the signature

    def resolve(rrlist_index):
        out = []
        for i in t[F.RRLIST][rrlist_index]:
            rr = t[F.RR][i]
            ct = t[F.CLASSTYPE][rr[F.CLASSTYPE_INDEX]]
            out.append((names[rr[F.NAME_INDEX]], ct[0], ct[1], rr[F.TTL], names[rr[F.RDATA_INDEX]]))
        return out

    ext = item[F.RESPONSE_EXTENDED]
    assert set(ext) == {F.AUTHORITY_INDEX, F.ADDITIONAL_INDEX}
    authority = resolve(ext[F.AUTHORITY_INDEX])
    assert [(rr[1], rr[2], rr[3]) for rr in authority] == [(6, 1, 86400), (47, 1, 86400), (46, 1, 86400)] + [
        (46, 1, 86400)
    ]
    assert authority[0][4].startswith(b"\x01a\x0croot-servers\x03net\x00\x05nstld")  # SOA names expanded
    assert resolve(ext[F.ADDITIONAL_INDEX]) == [(b"\x00", 41, 4096, 57344, b"")]


def test_address_events_equal_compactor(tmp_path):
    """knot-live.info lists compactor's TCP reset and ICMP/ICMPv6 destination-unreachable events by
    code and address; the address-event-counts of our files add up to exactly those."""
    counters, _ = run(COMPACTOR_DATA / "knot-live.raw.pcap.xz", tmp_path)
    docs, present = read_cdns(tmp_path)
    text = (COMPACTOR_DATA / "knot-live.info").read_text()
    expected = collections.Counter()
    section_type = {"TCP RESETS": F.AE_TCP_RESET, "ICMP DEST UNREACHABLE": F.AE_ICMP_DEST_UNREACHABLE,
                    "ICMPv6 DEST UNREACHABLE": F.AE_ICMPV6_DEST_UNREACHABLE}
    current = None
    for line in text.splitlines():
        if line.rstrip(":") in section_type:
            current = section_type[line.rstrip(":")]
        elif current is not None and "Count:" in line:
            fields = line.split()
            code = int(fields[fields.index("Code:") + 1]) if "Code:" in fields else None
            expected[(current, code, fields[-1])] += int(fields[fields.index("Count:") + 1])
        elif not line.strip():
            current = None
    got = collections.Counter()
    for doc in docs:
        for block in doc[2]:
            ip = block[F.BLOCK_TABLES][F.IP_ADDRESS]
            for ev in block.get(F.ADDRESS_EVENT_COUNTS, []):
                got[(ev[F.AE_TYPE], ev.get(F.AE_CODE), _addr(ip[ev[F.AE_ADDRESS_INDEX]]))] += ev[F.AE_COUNT]
    assert got == expected and sum(expected.values()) == counters["icmp_unreachable"] + counters["tcp_resets"]
    assert present[F.OTHER_DATA_HINTS] & 2
    totals = _block_totals(docs)
    assert totals[F.UNMATCHED_QUERIES] == counters["query_only"] and totals[F.MALFORMED_ITEMS] == counters["malformed"]
    assert totals[F.PROCESSED_MESSAGES] == counters["dns_messages"]


# ---------------------------------------------------------------------------------------------
# Full sections: every field declared is written, and the sections equal dpkt's view of the messages

T0 = 1_600_000_000
CLIENT, SERVER = "192.0.2.1", "198.51.100.53"
ETHER = Ether(src=MAC_C, dst=MAC_S)  # (Ether() would look the MAC up: seconds a frame)


def _frame(t, src, sport, dst, dport, dns, proto=UDP):
    ip = IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst, ttl=61)
    pkt = ETHER / ip / proto(sport=sport, dport=dport) / (Raw(load=dns) if isinstance(dns, bytes) else dns)
    pkt.time = T0 + t
    return pkt


def _rich_capture(path):
    ecs = EDNS0ClientSubnet(source_plen=24, address="203.0.113.0")
    q1 = DNS(id=1, rd=1, qd=[DNSQR(qname="www.example.com", qtype="A"), DNSQR(qname="example.com", qtype="MX")],
             an=[DNSRR(rrname="x.example", type="A", rdata="192.0.2.7")],
             ns=[DNSRR(rrname="example.com", type="NS", rdata="ns1.example.com")],
             ar=[DNSRROPT(rclass=1232, z=0x8000, rdata=[ecs]), DNSRR(rrname="extra.example", type="TXT", rdata="hi")])
    r1 = DNS(id=1, qr=1, aa=1, rd=1, ra=1, qd=[DNSQR(qname="www.example.com", qtype="A")],
             an=[DNSRR(rrname="www.example.com", type="CNAME", rdata="web.example.com"),
                 DNSRR(rrname="web.example.com", type="A", rdata="192.0.2.80"),
                 DNSRR(rrname="example.com", type="MX", rdata=b"\x00\x0a\x04mail\xc0\x10")],
             ns=[DNSRRSOA(rrname="example.com", mname="ns1.example.com", rname="host.example.com", serial=7),
                 DNSRRSRV(rrname="_sip._udp.example.com", port=5060, target="sip.example.com")],
             ar=[DNSRROPT(rclass=1232, rdata=[ecs])])
    q2 = DNS(id=2, qd=[DNSQR(qname="only.query.example")])
    r3 = DNS(id=3, qr=1, rcode=3, qd=[DNSQR(qname="only.response.example")],
             ar=[DNSRR(rrname="unknown.example", type=65400, rdata=b"\x01\x02")])
    frames = [
        _frame(0.0, CLIENT, 40000, SERVER, 53, q1),
        _frame(0.001, SERVER, 53, CLIENT, 40000, r1),
        _frame(0.002, "2001:db8::1", 40001, "2001:db8::53", 53, q2),
        _frame(0.003, SERVER, 53, CLIENT, 40002, r3),
        _frame(0.004, CLIENT, 40003, SERVER, 53, b"\x12\x34\x01"),  # malformed: short header
        _frame(0.005, CLIENT, 40004, SERVER, 53, b"", proto=lambda **kw: TCP(flags="R", **kw)),
    ]
    unreachable = ETHER / IP(src="198.51.100.1", dst=SERVER) / ICMP(type=3, code=3) / IPerror(
        src=SERVER, dst="192.0.2.99") / UDPerror(sport=53, dport=40005)
    unreachable.time = T0 + 0.006
    unreach6 = ETHER / IPv6(src="2001:db8::fe", dst="2001:db8::53") / ICMPv6DestUnreach(code=4) / IPerror6(
        src="2001:db8::53", dst="2001:db8::99") / UDPerror(sport=53, dport=40006)
    unreach6.time = T0 + 0.007
    wrpcap(str(path), frames + [unreachable, unreach6])
    return [bytes(q1), bytes(r1)]


def _rich_run(tmp_path, *extra):
    """(query bytes, response bytes, decoded files, hint bits present) of the rich capture written as C-DNS."""
    pcap = tmp_path / "rich.pcap"
    q1, r1 = _rich_capture(pcap)
    out = tmp_path / "out"
    out.mkdir()
    run(pcap, out, *extra)
    return (q1, r1) + read_cdns(out)


def test_full_sections_every_hint_written_and_sections_equal_dpkt(tmp_path):
    q1, r1, docs, present = _rich_run(
        tmp_path, "--set", "export.cdns_full_sections=true", "--set", "export.cdns_qr_type=resolver"
    )
    hints = docs[0][1][F.BLOCK_PARAMETERS][0][F.STORAGE_PARAMETERS][F.STORAGE_HINTS]
    assert dict(present) == hints  # the hints declare exactly what is written
    (block,) = docs[0][2]
    t = block[F.BLOCK_TABLES]
    names, cts = t[F.NAME_RDATA], t[F.CLASSTYPE]
    item = block[F.QUERY_RESPONSES][0]
    assert t[F.QR_SIG][item[F.QR_SIGNATURE_INDEX]][F.QR_TYPE] == F.QR_TYPES["resolver"]

    def rrs(rrlist_index):
        out = []
        for i in t[F.RRLIST][rrlist_index]:
            rr = t[F.RR][i]
            ct = cts[rr[F.CLASSTYPE_INDEX]]
            name, rdata = names[rr[F.NAME_INDEX]], names[rr[F.RDATA_INDEX]]
            out.append((name_text(name), ct[F.TYPE], ct[F.CLASS], rr[F.TTL], rdata))
        return out

    def dpkt_rrs(section):
        return [(rr.name, rr.type, rr.cls, rr.ttl) for rr in section]

    query, response = dpkt.dns.DNS(q1), dpkt.dns.DNS(r1)
    qext, rext = item[F.QUERY_EXTENDED], item[F.RESPONSE_EXTENDED]
    extra_q = [t[F.QRR][i] for i in t[F.QLIST][qext[F.QUESTION_INDEX]]]
    assert [(name_text(names[q[F.NAME_INDEX]]), cts[q[F.CLASSTYPE_INDEX]][F.TYPE]) for q in extra_q] == [
        ("example.com", 15)
    ]
    assert [rr[:4] for rr in rrs(qext[F.ANSWER_INDEX])] == dpkt_rrs(query.an)
    assert [rr[:4] for rr in rrs(qext[F.AUTHORITY_INDEX])] == dpkt_rrs(query.ns)
    assert [rr[:4] for rr in rrs(qext[F.ADDITIONAL_INDEX])] == dpkt_rrs(query.ar[1:])  # OPT in the signature
    answers = rrs(rext[F.ANSWER_INDEX])
    assert [rr[:4] for rr in answers] == dpkt_rrs(response.an)
    assert _labels(answers[0][4]) == [b"web", b"example", b"com"]  # CNAME pointer expanded
    assert answers[1][4] == bytes(response.an[1].rdata)
    assert answers[2][4][:2] == b"\x00\x0a" and _labels(answers[2][4][2:]) == [b"mail", b"example", b"com"]
    authority = rrs(rext[F.AUTHORITY_INDEX])
    assert [rr[:4] for rr in authority] == dpkt_rrs(response.ns)
    soa = authority[0][4]
    assert _labels(soa) == [b"ns1", b"example", b"com"]
    assert authority[1][4][6:] == b"\x03sip\x07example\x03com\x00"  # SRV target
    assert rrs(rext[F.ADDITIONAL_INDEX]) == [("", 41, 1232, response.ar[0].ttl, bytes(response.ar[0].rdata))]
    response_only = next(it for it in block[F.QUERY_RESPONSES] if F.QUERY_SIZE not in it)  # unknown type: as is
    assert rrs(response_only[F.RESPONSE_EXTENDED][F.ADDITIONAL_INDEX]) == [
        ("unknown.example", 65400, 1, 0, b"\x01\x02")
    ]
    # The query's OPT: UDP size, DO and its RDATA (the client-subnet option) in the signature.
    sig = t[F.QR_SIG][item[F.QR_SIGNATURE_INDEX]]
    assert sig[F.QUERY_UDP_SIZE] == 1232 and sig[F.QR_DNS_FLAGS] & F.QUERY_DO
    assert names[sig[F.QUERY_OPT_RDATA_INDEX]] == bytes(query.ar[0].rdata)
    events = {(e[F.AE_TYPE], e.get(F.AE_CODE), _addr(t[F.IP_ADDRESS][e[F.AE_ADDRESS_INDEX]]), e[F.AE_COUNT])
              for e in block[F.ADDRESS_EVENT_COUNTS]}
    assert events == {(F.AE_TCP_RESET, None, CLIENT, 1), (F.AE_ICMP_DEST_UNREACHABLE, 3, "192.0.2.99", 1),
                      (F.AE_ICMPV6_DEST_UNREACHABLE, 4, "2001:db8::99", 1)}


def test_client_privacy_prefixes_and_subnets(tmp_path):
    q1, _, docs, _ = _rich_run(
        tmp_path, "--set", "privacy.client_ipv4_prefix=16", "--set", "privacy.client_ipv6_prefix=48"
    )
    storage = docs[0][1][F.BLOCK_PARAMETERS][0][F.STORAGE_PARAMETERS]
    assert storage[F.CLIENT_ADDRESS_PREFIX_IPV4] == 16 and storage[F.CLIENT_ADDRESS_PREFIX_IPV6] == 48
    assert storage[F.STORAGE_FLAGS] & F.STORAGE_FLAG_ANONYMIZED_DATA and F.ANONYMIZATION_METHOD in storage
    (block,) = docs[0][2]
    t = block[F.BLOCK_TABLES]
    clients = {t[F.IP_ADDRESS][it[F.CLIENT_ADDRESS_INDEX]] for it in block[F.QUERY_RESPONSES]}
    assert clients == {bytes([192, 0]), bytes.fromhex("20010db80000")}
    servers = {t[F.IP_ADDRESS][s[F.SERVER_ADDRESS_INDEX]] for s in t[F.QR_SIG]}
    assert ipaddress.ip_address(SERVER).packed in servers  # servers are kept whole
    # The client-subnet option of the query's OPT RDATA is cut like a client address: 203.0.113.0/24 → /16.
    opt_rdata = bytes(dpkt.dns.DNS(q1).ar[0].rdata)
    sig = next(s for s in t[F.QR_SIG] if F.QUERY_OPT_RDATA_INDEX in s and t[F.NAME_RDATA][s[15]])
    stored = t[F.NAME_RDATA][sig[F.QUERY_OPT_RDATA_INDEX]]
    assert len(stored) == len(opt_rdata) and stored[:8] == opt_rdata[:8] and stored[8:] == bytes([203, 0, 0])


# ---------------------------------------------------------------------------------------------
# Compression, rotation, naming, errors


def test_compressed_files_decompress_to_the_same_bytes(tmp_path):
    outputs = {}
    for codec in ("none", "gzip", "xz", "zstd"):
        out = tmp_path / codec
        out.mkdir()
        run(COMPACTOR_DATA / "matching.pcap.xz", out, "--cdns-compression", codec)
        (path,) = cdns_files(out)
        assert path.name.endswith(".cdns" + F.COMPRESSION_SUFFIXES[codec])
        assert path.name.startswith("dnsprobe.20160405.193324.561484.w0.cdns")
        check_file(path)
        # The same but for the digest of the configuration, which names the codec (and output directory).
        digest = read_meta(path)["config_sha256"].encode()
        outputs[codec] = raw_bytes(path).replace(digest, b"")
        if codec != "none":
            assert path.stat().st_size < len(outputs[codec])
        if codec == "gzip":
            # gzip at level 6 by default (9 cost half as much CPU again for 0.3 % fewer bytes): the header's
            # XFL byte is 2 only at level 9 (RFC 1952; zlib sets it from the level).
            assert path.read_bytes()[8] == 0
    assert len(set(outputs.values())) == 1


def test_raw_bytes_per_transaction_of_the_standard_mix(tmp_path):
    """Raw C-DNS of the standard mix (samples/sample-mix.pcap.xz: 20,000 packets, 9,473 transactions, one
    block) stays at the 53 bytes per transaction measured. Issue 4's 40 is out of reach at 10,000 items a
    block with microsecond ticks: the Q/R items' own fields (map, keys and values; the three table indexes
    counted at their 1-byte minimum), the block's distinct QNAMEs and its distinct client addresses already
    come to more than 40 bytes per transaction, before any signature."""
    counters, _ = run(SAMPLE, tmp_path)
    (path,) = cdns_files(tmp_path)
    records = counters["records"]
    per_tx = path.stat().st_size / records
    assert per_tx <= 54, f"{per_tx:.2f} raw C-DNS bytes per transaction"
    doc = cbor2.loads(path.read_bytes())
    indexes = (F.CLIENT_ADDRESS_INDEX, F.QR_SIGNATURE_INDEX, F.QUERY_NAME_INDEX)
    floor = 0
    for block in doc[2]:
        items, tables = block[F.QUERY_RESPONSES], block[F.BLOCK_TABLES]
        for item in items:
            floor += len(cbor2.dumps({k: v for k, v in item.items() if k not in indexes})) + 2 * len(indexes)
        qnames = {item[F.QUERY_NAME_INDEX] for item in items if F.QUERY_NAME_INDEX in item}
        clients = {item[F.CLIENT_ADDRESS_INDEX] for item in items}
        floor += sum(len(cbor2.dumps(tables[F.NAME_RDATA][i])) for i in qnames)
        floor += sum(len(cbor2.dumps(tables[F.IP_ADDRESS][i])) for i in clients)
    assert 40 < floor / records < per_tx


def test_rotation_by_blocks_records_and_time(tmp_path):
    def out_of(*extra):
        return tmp_path / "_".join(e.replace("=", "-").replace(".", "") for e in extra if "=" in e)

    def files_of(*extra):
        out = out_of(*extra)
        out.mkdir()
        counters, stats = run(SAMPLE, out, *extra)
        files = cdns_files(out)
        assert [p.name for p in files] == sorted(stats["files_written"]) and counters["files"] == len(files)
        docs = [check_file(p)[0] for p in files]
        assert sum(len(b.get(F.QUERY_RESPONSES, [])) + len(b.get(F.MALFORMED_MESSAGES, []))
                   for d in docs for b in d[2]) == counters["records"]
        return docs

    docs = files_of("--set", "export.cdns_block_items=1000", "--set", "export.rotate_blocks=3")
    assert len(docs) == 4 and [len(d[2]) for d in docs] == [3, 3, 3, 1]
    assert all(len(b[F.QUERY_RESPONSES]) == 1000 for d in docs[:3] for b in d[2])
    docs = files_of("--set", "export.rotate_records=4000")
    assert [sum(len(b[F.QUERY_RESPONSES]) for b in d[2]) for d in docs] == [4000, 4000, 1473]
    docs = files_of("--set", "export.rotate_seconds=0.05")
    assert len(docs) >= 4
    # By size: the C-DNS bytes before compression, checked after each block, so the split is the same whatever
    # the codec; uncompressed, a file passes the limit by less than its last block.
    limit = 60_000
    by_size = ("--set", "export.cdns_block_items=500", "--set", f"export.rotate_bytes={limit}")
    plain = files_of(*by_size, "--cdns-compression", "none")
    files = cdns_files(out_of(*by_size))
    assert len(files) >= 3
    for f, doc in zip(files[:-1], plain[:-1], strict=True):
        last_block = len(cbor2.dumps(doc[2][-1]))
        assert limit <= f.stat().st_size < limit + last_block + 1
    xz = files_of(*by_size, "--cdns-compression", "xz", "--set", "export.file_prefix=xz.")
    assert [len(d[2]) for d in xz] == [len(d[2]) for d in plain]


def test_bad_compression_level_is_a_config_error(tmp_path):
    proc = run_dnsprobe(
        "read", COMPACTOR_DATA / "unmatched.pcap.xz", "-o", tmp_path, "--format", "cdns", "--cdns-compression", "xz",
        "--set", "export.compression_level=12", check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("dnsprobe: error: config key 'export.compression_level': 12 is not a xz level"
                                   " (0..9); see dnsprobe read --help")


def test_preamble_collection_parameters(tmp_path):
    run(COMPACTOR_DATA / "unmatched.pcap.xz", tmp_path, "--dns-port", "53", "--dns-port", "5353",
        "--set", "export.cdns_server_addresses=[192.0.2.53, '2001:db8::53']", "--query-timeout", "2.5")
    (doc,), _ = read_cdns(tmp_path)
    params = doc[1][F.BLOCK_PARAMETERS][0]
    coll = params[F.COLLECTION_PARAMETERS]
    assert coll[F.QUERY_TIMEOUT] == 2500 and coll[F.SKEW_TIMEOUT] == 0 and coll[F.HOST_ID] == ""
    assert coll[F.GENERATOR_ID].startswith("dnsprobe ") and "port 5353" in coll[F.FILTER]
    assert coll[F.SERVER_ADDRESSES] == [bytes([192, 0, 2, 53]), ipaddress.ip_address("2001:db8::53").packed]
    storage = params[F.STORAGE_PARAMETERS]
    assert storage[F.MAX_BLOCK_ITEMS] == 10000 and storage[F.STORAGE_FLAGS] == 0
    assert F.CLIENT_ADDRESS_PREFIX_IPV4 not in storage and 65 in storage[F.RR_TYPES]
    hints = storage[F.STORAGE_HINTS]
    assert hints[F.QUERY_RESPONSE_HINTS] == 0x3FF and hints[F.RR_HINTS] == 0
    assert hints[F.QUERY_RESPONSE_SIGNATURE_HINTS] == 0x1FFFF & ~(1 << 3)  # no qr-type unless configured


# ---------------------------------------------------------------------------------------------
# Live capture writes C-DNS too (as root: a veth pair, as in test_live_capture.py)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")
def test_live_capture_writes_cdns(tmp_path):
    from support.captures import KEY_COLUMNS, build_traffic
    from support.live import Probe, VethBed

    pcap = tmp_path / "traffic.pcap"
    passed = build_traffic(pcap, 0, 200)
    ref = tmp_path / "ref"
    ref.mkdir()
    run(pcap, ref)
    expected = collections.Counter(tuple(r[c] for c in KEY_COLUMNS if c != "malformed") for r in cdns_rows(ref))
    out = tmp_path / "out"
    out.mkdir()
    bed = VethBed()
    bed.up()
    probe = None
    try:
        probe = Probe(bed, out, "--format", "cdns", "--cdns-compression", "zstd")
        probe.wait_ready()
        bed.send(pcap, pps=2000)
        probe.wait_counter("packets", passed)
        assert probe.stop() == 0, probe.stderr
    finally:
        if probe is not None:
            probe.kill()
        bed.down()
    got = collections.Counter(tuple(r[c] for c in KEY_COLUMNS if c != "malformed") for r in cdns_rows(out))
    assert got == expected and sum(got.values()) == 200
    files = cdns_files(out)
    assert all(p.name.endswith(".w0.cdns.zst") for p in files)
    coll = cbor2.loads(raw_bytes(files[0]))[1][F.BLOCK_PARAMETERS][0][F.COLLECTION_PARAMETERS]
    assert coll[F.INTERFACES] == [bed.iface] and coll[F.HOST_ID] == socket.gethostname()
    assert coll[F.PROMISC] is False and coll[F.SNAPLEN] > 0 and "icmp" not in coll[F.FILTER]


def cdns_rows(directory):
    return records(read_cdns(directory)[0])[0]
