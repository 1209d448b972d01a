"""The answers column (export/parquet/answers.py): every record of a response in presentation format, compared with
dnspython's own text of the same records; RFC 3597 form for types without a layout and for RDATA that does not fit
one; damaged messages keep the records before the damage; through `dnsprobe read`, one entry per RR but OPT."""

import base64

import pyarrow as pa
import pytest
from support.data import ROOT
from support.dnsprobe import dnsprobe_read

from export.parquet.answers import (
    CAPS,
    MESSAGE_TEXT_BASE,
    MESSAGE_TEXT_PER_BYTE,
    RDATA_LAYOUTS,
    RECORD_TEXT_BASE,
    RECORD_TEXT_PER_BYTE,
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
    n, _ = message_records(wire, columns)
    assert all(len(c) == n for c in columns)
    records = list(zip(*columns))
    if _answers is not None:
        (entry,) = answers_column(pa.array([wire], pa.binary()))[0].to_pylist()
        assert [tuple(r.values()) for r in entry] == records
    return records


def both_columns(messages, text_max=None):
    """The answers column of the messages by the C walker, checked equal to the twin's, and records capped."""
    column = pa.array(messages, pa.binary())
    more = {} if text_max is None else {"text_max": text_max}
    (got, got_capped), (want, want_capped) = answers_column(column, **more), answers_column_python(column, **more)
    assert got.type == want.type and got.equals(want) and got_capped == want_capped
    return got, got_capped


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
    """Every DNS message of the oracle captures, the sample and the benchmark mix, whole and damaged (bytes
    changed, cut), through the C walker and through the twin: equal columns."""
    import random

    from support.captures import bench_mix
    from support.data import DATA_CAPTURES
    from support.stages import dns_messages

    rng = random.Random(21)
    messages = []
    for path in DATA_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz", bench_mix()]:
        if path.exists():
            messages += dns_messages(path)
    damaged = []
    for wire in rng.sample(messages, min(3000, len(messages))):
        w = bytearray(wire)
        for _ in range(rng.randint(1, 4)):
            w[rng.randrange(len(w))] = rng.randrange(256)
        damaged += [bytes(w), wire[: rng.randrange(len(wire) + 1)]]
    column, _ = both_columns(messages + damaged + [None, b""])
    assert sum(len(v) for v in column.to_pylist() if v) > 10_000
    both_columns([])


def test_answers_column_nulls_for_missing_responses():
    wire = make_response([("example.com.", "A", "192.0.2.1")]).to_wire(max_size=65535)
    column, _ = both_columns([wire, None, b"\x00" * 12])
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


@pytest.mark.skipif(_answers is None, reason="export.parquet._answers not built")
def test_walker_rejects_an_unknown_item_of_a_layout_made_on_the_fly():
    """A layout that is not a tuple or list is copied into a list by the walker; the item it refuses lives only in
    that copy. The error names it (under make test-asan: it is not read after the copy is freed)."""
    class Item:
        def __repr__(self):
            return "<the refused item>"

    with pytest.raises(ValueError, match="unknown RDATA layout item <the refused item>"):
        _answers.Walker({1: iter([Item()])}, {}, ("answer", "authority", "additional"), CAPS)


@pytest.mark.skipif(_answers is None, reason="export.parquet._answers not built")
def test_walker_reads_tables_that_a_layout_changes_while_read():
    """A layout whose iteration adds types to the tables being read (make test-asan: no write past the tables the
    walker sized): the walker keeps the tables as they were given."""
    layouts, names = {}, {1: "A"}

    class Growing:
        def __iter__(self):
            for t in range(1000, 1200):
                layouts[t] = ("B",)
                names[t] = f"T{t}"
            return iter(("B",))

    layouts[1] = Growing()
    walker = _answers.Walker(layouts, names, ("answer", "authority", "additional"), CAPS)
    wire = bytes(6) + (2).to_bytes(2, "big") + bytes(4) + b"\x00\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x01\x07"
    wire += b"\x00\x03\xe8\x00\x01\x00\x00\x00\x3c\x00\x01\x07"  # type 1000, added while the walker was made
    column = pa.array([wire], pa.binary())
    *_, data, records, capped = walker.column(1, 0, column.buffers())
    assert records == 2 and data == b"7\\# 1 07"


def pointer_flood(size):
    """A response of `size` bytes or a little less that makes about 140 times its size of text uncapped: its
    question name is 255 bytes of zero bytes (each written \\000), and every answer is a CNAME whose owner and
    target are 2-byte pointers to it."""
    qname = b"".join(bytes([n]) + bytes(n) for n in (63, 63, 63, 61)) + b"\x00"
    rr = b"\xc0\x0c\x00\x05\x00\x01\x00\x00\x00\x3c\x00\x02\xc0\x0c"
    count = (size - 12 - len(qname) - 4) // len(rr)
    header = b"\x12\x34\x81\x80" + (1).to_bytes(2, "big") + count.to_bytes(2, "big") + bytes(4)
    return header + qname + b"\x00\x05\x00\x01" + rr * count


def text_bytes(entry):
    return sum(len(r["name"]) + len(r["data"]) for r in entry)


def test_message_text_is_capped_and_counted():
    """The pointer flood: records written whole while the message's text lasts, then with an empty owner and
    data, counted; the C walker and the twin agree."""
    wire = pointer_flood(65535)
    name = "\\000" * 63 + "." + "\\000" * 63 + "." + "\\000" * 63 + "." + "\\000" * 61 + "."
    assert len(name) == 1004  # a record: 2008 bytes of text for 14 on the wire
    count = int.from_bytes(wire[6:8], "big")
    column, capped = both_columns([wire, wire])
    cap = MESSAGE_TEXT_BASE + MESSAGE_TEXT_PER_BYTE * len(wire)
    whole = cap // 2008
    for entry in column.to_pylist():
        assert len(entry) == count  # every record is there, its type, class and TTL too
        assert text_bytes(entry) == whole * 2008 <= cap
        assert all(r["name"] == name and r["data"] == name for r in entry[:whole])
        assert all(r["name"] == r["data"] == "" and r["type"] == 5 and r["ttl"] == 60 for r in entry[whole:])
    assert capped == 2 * (count - whole)
    assert text_bytes(column.to_pylist()[0]) <= 9 * len(wire)  # uncapped: 140 times


def test_rdata_text_over_the_record_cap_is_written_generically():
    """An NSEC whose type bitmap names every type of 4 windows (10 bytes of text a bit): RFC 3597's form, counted;
    the same record with a short bitmap keeps its text."""
    def message(bitmap):
        rdata = b"\x00" + bitmap
        rr = b"\x00\x00\x2f\x00\x01\x00\x00\x00\x3c" + len(rdata).to_bytes(2, "big") + rdata
        return bytes(6) + (1).to_bytes(2, "big") + bytes(4) + rr, rdata

    wire, rdata = message(b"".join(bytes([w, 32]) + b"\xff" * 32 for w in (1, 2, 3, 4)))
    column, capped = both_columns([wire])
    (entry,) = column.to_pylist()
    assert entry[0]["data"] == generic(rdata) and capped == 1
    assert len(entry[0]["data"]) <= RECORD_TEXT_BASE + RECORD_TEXT_PER_BYTE * len(rdata)
    wire, rdata = message(b"\x00\x01\x60")
    column, capped = both_columns([wire])
    assert column.to_pylist()[0][0]["data"] == ". A NS" and capped == 0


def test_a_batch_over_a_string_columns_offsets_is_made_in_slices(tmp_path):
    """A batch whose messages' caps could pass a string column's 2 GiB is made in slices (here a small limit for
    the same arithmetic): a chunked column, nothing lost, each chunk's text within the limit; Parquet takes it."""
    import pyarrow.parquet as pq

    messages = [pointer_flood(4000 + 500 * k) for k in range(10)] + [None]
    whole, capped = both_columns(messages)
    assert isinstance(whole, pa.Array) and capped > 0
    limit = 3 * (MESSAGE_TEXT_BASE + MESSAGE_TEXT_PER_BYTE * 8500)
    sliced, sliced_capped = both_columns(messages, text_max=limit)
    assert isinstance(sliced, pa.ChunkedArray) and sliced.num_chunks >= 3
    assert sliced.to_pylist() == whole.to_pylist() and sliced_capped == capped
    for chunk in sliced.chunks:
        assert sum(text_bytes(e) for e in chunk.to_pylist() if e) <= limit
    pq.write_table(pa.table({"answers": sliced}), tmp_path / "a.parquet")
    assert pq.read_table(tmp_path / "a.parquet").column("answers").to_pylist() == whole.to_pylist()


def test_read_counts_the_capped_records(tmp_path):
    """Through `dnsprobe read`: a query and its flooding response over UDP; the row's answers within the message
    cap, the capped records in the answers_capped counter."""
    from support.dnsprobe import probe_run
    from support.frames import T0, udp_frame, write_pcap

    response = pointer_flood(4000)
    query = response[:2] + b"\x01\x00\x00\x01" + bytes(6) + response[12:12 + 255 + 4]
    frames = [(T0, udp_frame(query)), (T0 + 1000, udp_frame(response, to_server=False))]
    pcap = write_pcap(tmp_path / "flood.pcap", frames)
    rows, counters = probe_run(pcap, tmp_path / "out", "--set", "export.answers=true")
    (row,) = rows
    _, capped = message_records(response, [[] for _ in range(6)])
    assert capped > 100 and counters["answers_capped"] == capped
    assert text_bytes(row["answers"]) <= MESSAGE_TEXT_BASE + MESSAGE_TEXT_PER_BYTE * len(response)
