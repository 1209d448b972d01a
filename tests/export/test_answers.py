"""The answers column (export/parquet/answers.py): every record of a response in presentation format, compared with
dnspython's own text of the same records; RFC 3597 form for types without a layout and for RDATA that does not fit
one; damaged messages keep the records before the damage; through `dnsprobe read`, one entry per RR but OPT."""

import base64

import pyarrow as pa
import pytest
from support.data import ROOT
from support.dnsprobe import dnsprobe_read

from export.parquet.answers import (
    RDATA_LAYOUTS,
    answers_column,
    answers_column_python,
    generic,
    message_records,
)
from probe.native import load

_answers = load("export.parquet._answers")

pytest.importorskip("dns", reason="pip install dnspython (in the test extras)")
import dns.message  # noqa: E402
import dns.rdata  # noqa: E402
import dns.rdatatype  # noqa: E402
import dns.renderer  # noqa: E402
import dns.rrset  # noqa: E402

B64 = base64.b64encode(bytes(range(1, 70))).decode()
# (owner, type, RDATA text) of every type with a layout, in dnspython's text form, some twice with edge cases.
RECORDS = [
    ("example.com.", "A", "192.0.2.1"),
    ("example.com.", "NS", "ns1.example.com."),
    ("www.example.com.", "CNAME", "example.com."),
    ("example.com.", "SOA", "ns1.example.com. host\\.master.example.com. 2026120301 7200 3600 1209600 300"),
    ("1.2.0.192.in-addr.arpa.", "PTR", "host.example.com."),
    ("example.com.", "HINFO", '"PC" "Linux 6"'),
    ("example.com.", "MX", "10 mail.example.com."),
    ("example.com.", "TXT", '"v=spf1 -all" "a \\"quoted\\" \\\\ string" "\\200\\255;()"'),
    ("example.com.", "TXT", '""'),
    ("example.com.", "RP", "admin.example.com. txt.example.com."),
    ("example.com.", "AFSDB", "1 afs.example.com."),
    ("example.com.", "AAAA", "2001:db8::1"),
    ("example.com.", "AAAA", "::ffff:192.0.2.1"),
    ("_sip._udp.example.com.", "SRV", "10 60 5060 sip.example.com."),
    ("example.com.", "NAPTR", '100 10 "U" "E2U+sip" "!^.*$!sip:info@example.com!" .'),
    ("example.com.", "KX", "10 kx.example.com."),
    ("example.com.", "DNAME", "example.net."),
    ("example.com.", "DS", "12345 13 2 " + bytes(range(32)).hex()),
    ("example.com.", "SSHFP", "4 2 " + bytes(range(32)).hex()),
    ("example.com.", "RRSIG", f"A 13 2 300 20261231235959 20261201000000 12345 example.com. {B64}"),
    ("example.com.", "NSEC", "a.example.com. A NS SOA MX TXT AAAA RRSIG NSEC DNSKEY TYPE1234 CAA"),
    ("example.com.", "DNSKEY", f"257 3 13 {B64}"),
    ("example.com.", "NSEC3", "1 1 10 aabbccdd 2vptu5timamqttgl4luu9kg21e0aor3s A RRSIG"),
    ("example.com.", "NSEC3", "1 0 0 - 2vptu5timamqttgl4luu9kg21e0aor3s"),
    ("example.com.", "NSEC3PARAM", "1 0 10 aabb"),
    ("_443._tcp.example.com.", "TLSA", "3 1 1 " + bytes(range(32)).hex()),
    ("example.com.", "SMIMEA", "3 0 1 " + bytes(range(32)).hex()),
    ("example.com.", "CDS", "0 0 0 00"),
    ("example.com.", "CDNSKEY", f"256 3 8 {B64}"),
    ("example.com.", "SPF", '"v=spf1 ~all"'),
    ("example.com.", "CAA", '0 issue "letsencrypt.org"'),
    ("example.com.", "CAA", '128 iodef "mailto:a\\"b@example.com"'),
    ("weird\\.label\\000\\255.example.com.", "A", "192.0.2.2"),
    # types without a layout here: RFC 3597's form
    ("example.com.", "TYPE65280", "\\# 4 0a000001"),
    ("example.com.", "TYPE65281", "\\# 0"),
    ("example.com.", "HTTPS", "1 . alpn=h2,h3"),
    ("example.com.", "LOC", "52 22 23.000 N 4 53 32.000 E -2.00m 0.00m 10000m 10m"),
]


def make_response(records, ttl=3600):
    msg = dns.message.make_query("example.com.", "A", want_dnssec=True)
    resp = dns.message.make_response(msg)
    sections = (resp.answer, resp.authority, resp.additional)
    for i, (owner, rtype, text) in enumerate(records):
        rd = dns.rdata.from_text("IN", rtype, text)
        rrset = dns.rrset.from_rdata(owner, ttl + i, rd)
        sections[i % 3].append(rrset)
    return resp


def dnspython_records(resp):
    out = []
    for section, rrsets in zip(("answer", "authority", "additional"), (resp.answer, resp.authority, resp.additional)):
        for rrset in rrsets:
            for rd in rrset:
                data = rd.to_text(chunksize=0)
                if rd.rdtype not in RDATA_LAYOUTS:
                    data = generic(rd.to_wire())
                out.append((section, rrset.name.to_text(), int(rd.rdtype), int(rd.rdclass), rrset.ttl, data))
    return out


def ours(wire):
    """The records of a message by the twin (message_records), checked equal to the C walker's column."""
    columns = [[] for _ in range(6)]
    n = message_records(wire, columns)
    assert all(len(c) == n for c in columns)
    records = list(zip(*columns))
    if _answers is not None:
        (entry,) = answers_column(pa.array([wire], pa.binary())).to_pylist()
        assert [tuple(r.values()) for r in entry] == records
    return records


def both_columns(messages):
    """The answers column of the messages by the C walker, checked equal to the twin's."""
    column = pa.array(messages, pa.binary())
    got, want = answers_column(column), answers_column_python(column)
    assert got.type == want.type and got.equals(want)
    return got


@pytest.mark.parametrize("compress", [True, False])
def test_every_layout_equals_dnspythons_text(compress):
    resp = make_response(RECORDS)
    wire = resp.to_wire(max_size=65535)
    if not compress:  # dnspython compresses by default; an uncompressed form through its renderer's own option
        r = dns.renderer.Renderer(resp.id, resp.flags, 65535)
        r.compress = None
        for section, rrsets in ((dns.renderer.ANSWER, resp.answer), (dns.renderer.AUTHORITY, resp.authority),
                                (dns.renderer.ADDITIONAL, resp.additional)):
            for rrset in rrsets:
                r.add_rrset(section, rrset)
        r.add_edns(0, 0x8000, 1232)
        r.write_header()
        wire = r.get_wire()
    got = ours(wire)
    want = dnspython_records(resp)
    assert len(got) == len(RECORDS) == len(want)  # the OPT record is left out
    for g, w in zip(got, want):
        assert g == w
    covered = {dns.rdatatype.from_text(t) for _, t, _ in RECORDS}
    assert set(RDATA_LAYOUTS) - covered <= {32769}  # every layout is checked (DLV: as DS)


def test_rdata_not_fitting_its_layout_is_written_generically():
    good = make_response([("example.com.", "A", "192.0.2.1"), ("example.com.", "MX", "10 mx.example.com.")])
    wire = bytearray(good.to_wire(max_size=65535))
    # Make the A record's RDATA 5 bytes long (its RDLENGTH and one more byte before the next record).
    at = wire.index(bytes([192, 0, 2, 1]))
    wire[at - 2 : at] = (5).to_bytes(2, "big")
    wire[at + 4 : at + 4] = b"\x07"
    got = ours(bytes(wire))
    assert got[0][5] == "\\# 5 c000020107"


def test_damaged_message_keeps_the_records_before_the_damage():
    wire = make_response([("example.com.", "A", "192.0.2.1"), ("example.com.", "AAAA", "2001:db8::1"),
                          ("example.com.", "A", "192.0.2.3")]).to_wire(max_size=65535)
    full = ours(wire)
    assert len(full) == 3
    for cut in range(12, len(wire)):
        got = ours(wire[:cut])
        assert got == full[: len(got)]  # a prefix of the records, never a wrong one
    assert ours(b"\x00" * 5) == []


def test_names_of_255_bytes_at_most():
    """A name's labels and their length bytes add up to 255 at most (dnswire.MAX_NAME), counted across a pointer
    too: the second record's owner, x. before the first's, is read at 255 and ends the walk at 256."""
    def message(last, pointer):
        name = b"".join(bytes([len(x)]) + x for x in [b"a" * 63] * 3 + [b"b" * last])
        header = bytes(6) + (2).to_bytes(2, "big") + bytes(4)
        rr = b"\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\xc0\x00\x02\x01"
        second = b"\x01x" + (b"\xc0\x0c" if pointer else name + b"\x00")
        return header + name + b"\x00" + rr + second + rr

    for pointer in (False, True):
        assert len(ours(message(60, pointer))) == 2  # 2 + 3 * 64 + 61
        assert len(ours(message(61, pointer))) == 1  # 2 + 3 * 64 + 62


def test_txt_string_running_past_its_rdata_is_written_generically():
    """A TXT record whose last string claims bytes beyond its RDATA (there are more in the message after it)."""
    good = make_response([("example.com.", "TXT", '"abc"'), ("example.com.", "A", "192.0.2.1")])
    wire = bytearray(good.to_wire(max_size=65535))
    at = wire.index(b"\x03abc")
    wire[at] = 9  # the string says 9 bytes, the RDATA holds 3 of them
    assert ours(bytes(wire))[0][5] == "\\# 4 09616263"


@pytest.mark.skipif(_answers is None, reason="export.parquet._answers not built")
def test_c_walker_equals_the_twin_on_the_captures():
    """Every DNS message of the shared captures, the sample and the benchmark mix, whole and damaged (bytes
    changed, cut), through the C walker and through the twin: equal columns."""
    import random

    from support.captures import bench_mix
    from support.data import SHARED_CAPTURES
    from support.stages import dns_messages

    rng = random.Random(21)
    messages = []
    for path in SHARED_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz", bench_mix()]:
        if path.exists():
            messages += dns_messages(path)
    damaged = []
    for wire in rng.sample(messages, min(3000, len(messages))):
        w = bytearray(wire)
        for _ in range(rng.randint(1, 4)):
            w[rng.randrange(len(w))] = rng.randrange(256)
        damaged += [bytes(w), wire[: rng.randrange(len(wire) + 1)]]
    column = both_columns(messages + damaged + [None, b""])
    assert sum(len(v) for v in column.to_pylist() if v) > 10_000
    both_columns([])


def test_answers_column_nulls_for_missing_responses():
    wire = make_response([("example.com.", "A", "192.0.2.1")]).to_wire(max_size=65535)
    column = both_columns([wire, None, b"\x00" * 12])
    assert column.to_pylist() == [
        [{"section": "answer", "name": "example.com.", "type": 1, "class": 1, "ttl": 3600, "data": "192.0.2.1"}],
        None,
        [],
    ]


def test_read_writes_one_answer_per_record(out_dir):
    rows = dnsprobe_read(ROOT / "samples" / "sample-mix.pcap.xz", out_dir, "--set", "export.answers=true")
    checked = 0
    for row in rows:
        if not row["response_present"]:
            assert row["answers"] is None
            continue
        if row["malformed"] or row["response_messages"] != 1:
            continue
        sections = [a["section"] for a in row["answers"]]
        assert sections.count("answer") == row["ancount"] and sections.count("authority") == row["nscount"]
        assert sections.count("additional") == row["arcount"] - (row["res_edns_udp"] > 0)  # OPT left out
        checked += 1
    assert checked > 1000
