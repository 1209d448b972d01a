"""The column pass of the reference pipeline (columns.extract_python, on transaction tuples) and the columns both
pipelines make alike, by rule rather than by comparison with each other:

- extract_python's rules (nulls, nested paths, fills, pairs of paths, every kind), by their expected values;
- the address columns equal socket.inet_ntop and the domain_name column DNS Probe's regex, in the reference
  (extract_python, columns.domain_name) and in the production column pass on message records
  (export/parquet/_parquetrec.c, which writes the address and name texts by hand), on every address pattern
  and on the QNAMEs of the real captures and edge cases.
(The two pipelines' whole tables are compared in tests/export/test_parquetrec.py.)
"""

import functools
import random
import socket
import struct

import pyarrow as pa
import pyarrow.compute as pc
from support.data import COMPACTOR_DATA, DNSPROBE_DATA, ROOT
from support.stages import transactions

from export.parquet import columns
from export.parquet.rows import columns_from_records
from probe import _records
from probe.model import M

CAPTURES = sorted((DNSPROBE_DATA / "test_pcaps").glob("*.pcap")) + [
    COMPACTOR_DATA / "knot-live.raw.pcap.xz",
    COMPACTOR_DATA / "gold.pcap.xz",
    ROOT / "samples" / "sample-mix.pcap.xz",
]


def test_captures_found():
    assert all(p.exists() for p in CAPTURES) and len(CAPTURES) >= 7, CAPTURES


@functools.cache
def a_query(ipv):
    """A query of the sample over IP version ipv, as a message tuple."""
    return next(q for q, _, _ in transactions(ROOT / "samples" / "sample-mix.pcap.xz")
                if q is not None and not q[M.MALFORMED] and q[M.IPV] == ipv)


def record_column(queries, name):
    """The column `name` of query-only transactions of the queries, made by the C column pass on message records."""
    batch = _records.TxBatch()
    for q in queries:
        batch.append((q, None, 1))
    return columns_from_records(batch, [name]).column(0).to_pylist()


def with_field(m, index, value):
    return m[:index] + (value,) + m[index + 1 :]


def assert_addresses_format_as_inet_ntop(packed):
    """The client (src) column of both pipelines (records, tuples) for queries from these addresses: inet_ntop's."""
    queries = [with_field(a_query(6 if len(p) == 16 else 4), M.SRC, p) for p in packed]
    want = [socket.inet_ntop(socket.AF_INET6 if len(p) == 16 else socket.AF_INET, p) for p in packed]
    assert record_column(queries, "src") == want
    assert columns.extract_python([(p,) for p in packed], [((0,), "a")])[0].to_pylist() == want


ADDRESSES = [
    "0.0.0.0", "255.255.255.255", "192.0.2.1", "::", "::1", "::ffff:192.0.2.1", "2001:db8::",
    "2001:db8:0:0:1:0:0:1", "fe80::1:2:3:4", "1:2:3:4:5:6:7:8", "2001:0:0:1::1", "::192.0.2.1",
]


def test_addresses_format_as_inet_ntop():
    assert_addresses_format_as_inet_ntop([socket.inet_pton(socket.AF_INET6 if ":" in a else socket.AF_INET, a)
                                          for a in ADDRESSES])
    assert columns.extract_python([(None,)], [((0,), "a")])[0].to_pylist() == [None]


def test_every_ipv4_byte_value_formats_as_inet_ntop():
    """IPv4 text is written by hand in C (faster than glibc's inet_ntop): every byte value, every position."""
    assert_addresses_format_as_inet_ntop([bytes((b, (b * 7) % 256, 255 - b, (b * 13 + 5) % 256)) for b in range(256)])


def test_every_ipv6_zero_pattern_formats_as_inet_ntop():
    """IPv6 text is written by hand in C too: every pattern of zero and non-zero groups (zero runs of
    every length and position, ties, IPv4-compatible and IPv4-mapped forms), with group values of one to
    four hex digits, and random addresses."""
    rng = random.Random(6)
    packed = []
    for mask in range(256):  # bit i set: group i is zero
        for fill in (0x1, 0xA, 0xFF, 0xABC, 0xFFFF, None):
            groups = [0 if mask >> i & 1 else (fill if fill is not None else rng.randrange(1, 65536)) for i in range(8)]
            packed.append(struct.pack("!8H", *groups))
    quads = [bytes(q) for q in ((1, 2, 3, 4), (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 1), (0, 1, 0, 0))]
    packed += [bytes(10) + b"\xff\xff" + q for q in quads] + [bytes(12) + q for q in quads]
    packed += [bytes(10) + b"\xff\xfe" + bytes(4), rng.randbytes(16)] + [rng.randbytes(16) for _ in range(2000)]
    assert_addresses_format_as_inet_ntop(packed)


def test_repeated_and_alternating_addresses_format_as_inet_ntop():
    """The C pass remembers the text of the addresses it has written (a few servers alternate from row to row): an
    address again, addresses that alternate, IPv4 and IPv6 addresses whose first bytes are the same, and addresses
    that share a memo entry, over more rows than a chunk (256) holds, each with its own text."""
    rng = random.Random(7)
    v4 = [bytes((192, 0, 2, b)) for b in range(40)]
    v6 = [a + bytes(12) for a in v4[:8]] + [bytes(12) + a for a in v4[:8]] + [rng.randbytes(16) for _ in range(24)]
    packed = [rng.choice(v4 if rng.random() < 0.6 else v6) for _ in range(1500)]
    packed += [v4[0], v4[0], v6[0], v6[0], v4[0], v6[8], v4[0]]
    assert_addresses_format_as_inet_ntop(packed)


def test_nulls_nested_paths_and_every_kind():
    rows = [
        (1, (2, "x", b"\x00\xff", (7, 8)), True, 1.5, 2**40),
        (None, None, False, None, -(2**40)),
        (3, (None, "", b"", ()), None, 0.0, None),
        (4, (5, "é\\xff", b"ab", None), True, -2.25, 0),
    ]
    specs = [
        ((0,), "i"), ((1, 0), "i"), ((1, 1), "s"), ((1, 2), "y"), ((1, 3), "L"),
        ((2,), "b"), ((3,), "d"), ((4,), "q"),
    ]
    got = columns.extract_python(rows, specs)
    assert [a.to_pylist() for a in got] == [
        [1, None, 3, 4], [2, None, None, 5], ["x", None, "", "é\\xff"], [b"\x00\xff", None, b"", b"ab"],
        [[7, 8], None, [], None], [True, False, None, True], [1.5, None, 0.0, -2.25], [2**40, -(2**40), None, 0],
    ]
    assert all(a.type == columns.KIND_TYPES[spec[1]] for a, spec in zip(got, specs))
    empty = columns.extract_python([], specs)
    assert [len(a) for a in empty] == [0] * len(specs)
    assert all(a.type == columns.KIND_TYPES[spec[1]] for a, spec in zip(empty, specs))


def test_fill_applies_only_below_a_present_first_tuple():
    """(path, kind, fill): a None inside a present side (a query without OPT) is `fill`; a missing side
    (row[path[0]] None) stays null, and so does a None on a one-step path."""
    rows = [((1, None),), ((2, (3,)),), (None,), ((None, (5,)),)]
    specs = [((0, 1, 0), "i", 0), ((0, 1, 0), "i"), ((0, 1), "L", ()), ((0, 0), "i", 9)]
    assert [a.to_pylist() for a in columns.extract_python(rows, specs)] == [
        [0, 3, None, 5],
        [None, 3, None, 5],
        [[], [3], None, [5]],
        [1, 2, None, 9],
    ]
    assert columns.extract_python([(None,), (3,)], [((0,), "i", 7)])[0].to_pylist() == [None, 3]


def test_pair_of_paths_reads_the_second_where_the_first_is_none():
    """((p1), (p2)): Arrow's coalesce of the two paths, as the builder uses for query-else-response."""
    rows = [((1, 2), (3, 4)), (None, (5, 6)), ((None, 7), (8, None)), (None, None), ((9, 1), None)]
    specs = [(((0, 0), (1, 0)), "i"), (((0, 1), (1, 1)), "i")]
    assert [a.to_pylist() for a in columns.extract_python(rows, specs)] == [[1, 5, 8, None, 9], [2, 6, 7, None, 1]]


def test_large_batch_is_exact():
    """More rows than fit a chunk: values land in their own rows."""
    n = 100_003
    rows = [(i, None if i % 7 == 0 else f"name{i}", (i % 3 == 0, (i, i + 1))) for i in range(n)]
    got = columns.extract_python(rows, [((0,), "q"), ((1,), "s"), ((2, 0), "b"), ((2, 1), "L")])
    assert got[0].to_pylist() == list(range(n))
    assert got[1].is_null().to_pylist() == [i % 7 == 0 for i in range(n)]  # each null in its own row
    assert got[1][n - 2].as_py() == f"name{n - 2}" and got[1][n - 1].as_py() is None  # (n - 1) % 7 == 0
    assert got[3].flatten().to_pylist()[-2:] == [n - 1, n]


def test_a_missing_extension_is_said_once(caplog):
    """The fallback to a Python twin is never silent, and said once per extension (probe.native)."""
    from probe.native import load, say_not_built

    assert load("probe._no_such_extension") is None
    with caplog.at_level("WARNING", logger="dnsprobe"):
        for _ in range(3):
            say_not_built("probe._no_such_extension", "testing")
    said = [r.getMessage() for r in caplog.records if "_no_such_extension" in r.getMessage()]
    assert said == ["the C extension probe._no_such_extension was not built (no compiler?): testing in Python, slower"]


DOMAIN_EDGES = [
    "", ".", "..", "a", "a.b", "a.b.c", "WWW.Example.COM", ".a.b", "a..b", "a.b.", "x\ny.a.b", "a\n.b.c",
    "a.b\nc.d", "a.\nb.c", "ÄÖ.Bär.DE", "ǅ.a.b", "ß.EXAMPLE.org", "\\046.A.b", "a b.c d.e f", "x" * 300 + ".Y.z",
]


def test_domain_name_rule_equals_dns_probe_regex():
    """The domainname column of the records (C) and columns.domain_name (Python) equal the regex replace that
    defines the column, ASCII-lowercased, on every QNAME of the real captures and on edge cases (newlines,
    non-ASCII case)."""
    names = list(DOMAIN_EDGES)
    for path in CAPTURES:
        for q, r, _ in transactions(path):
            name = (q or r)[M.QNAME]
            if name is not None:
                names.append(name)
    regex = pc.replace_substring_regex(
        pc.ascii_lower(pa.array(names, pa.string())), pattern=r"^.*\.([^.]*\.[^.]*)$", replacement=r"\1"
    ).to_pylist()
    rows = [(n,) for n in names]
    assert [columns.domain_name(n) for n in names] == regex
    assert columns.extract_python(rows, [((0,), "D")])[0].to_pylist() == regex
    query = a_query(4)
    assert record_column([with_field(query, M.QNAME, n) for n in names], "domainname") == regex
    assert len(set(regex)) > 100  # real names, not only the edge cases
