"""The C column extractor (export.parquet._columns) against its pure-Python reference (columns.extract_python).

The record builder reads every column of every Parquet file through `extract`, so the two must give
equal Arrow arrays on real transactions (all captures the project has) and on the edge cases below.
"""

import random
import socket
import struct

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.data import COMPACTOR_DATA, DNSPROBE_DATA, ROOT
from support.dnsprobe import run_python
from support.stages import transactions

from export.parquet import columns
from export.parquet.records import _CLIENT, _FIELDS, _RESPONSE_RAW
from probe.model import M

CAPTURES = sorted((DNSPROBE_DATA / "test_pcaps").glob("*.pcap")) + [
    COMPACTOR_DATA / "knot-live.raw.pcap.xz",
    COMPACTOR_DATA / "gold.pcap.xz",
    ROOT / "samples" / "sample-mix.pcap.xz",
]
# Packed addresses as binary ('y', as the C-DNS path reads them) besides the record builder's own columns.
SPECS = list(_FIELDS.values()) + list(_CLIENT.values()) + list(_RESPONSE_RAW.values()) + [
    ((0, M.SRC), "y"), ((1, M.DST), "y"),
]


def test_captures_found():
    assert all(p.exists() for p in CAPTURES) and len(CAPTURES) >= 7, CAPTURES


def test_extension_is_built():
    """A build without the extension still works (slower, with a warning); CI must not ship one."""
    assert columns.BACKEND == "c", "export.parquet._columns was not built: check the compiler and Python headers"


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_c_equals_python_on_real_transactions(path):
    txs = transactions(path)
    assert txs  # (the DNS Probe captures hold 1 to 92 transactions)
    fast = columns.extract(txs, SPECS)
    slow = columns.extract_python(txs, SPECS)
    for spec, a, b in zip(SPECS, fast, slow):
        a.validate(full=True)
        assert a.type == b.type and a.equals(b), f"column {spec} differs"
    # Non-trivial data: both sides, nulls and EDNS values occur.
    by_name = dict(zip(_FIELDS, fast))
    assert by_name["q_ts"].null_count < len(txs) and by_name["r_ts"].null_count < len(txs)


ADDRESSES = [
    "0.0.0.0", "255.255.255.255", "192.0.2.1", "::", "::1", "::ffff:192.0.2.1", "2001:db8::",
    "2001:db8:0:0:1:0:0:1", "fe80::1:2:3:4", "1:2:3:4:5:6:7:8", "2001:0:0:1::1", "::192.0.2.1",
]


def test_addresses_format_as_inet_ntop():
    packed = [socket.inet_pton(socket.AF_INET6 if ":" in a else socket.AF_INET, a) for a in ADDRESSES]
    rows = [(p,) for p in packed] + [(None,)]
    got = columns.extract(rows, [((0,), "a")])[0].to_pylist()
    want = [socket.inet_ntop(socket.AF_INET6 if len(p) == 16 else socket.AF_INET, p) for p in packed]
    assert got == want + [None]


def test_every_ipv4_byte_value_formats_as_inet_ntop():
    """IPv4 text is written by hand in C (faster than glibc's inet_ntop): every byte value, every position."""
    packed = [bytes((b, (b * 7) % 256, 255 - b, (b * 13 + 5) % 256)) for b in range(256)]
    rows = [(p,) for p in packed]
    assert columns.extract(rows, [((0,), "a")])[0].to_pylist() == [socket.inet_ntop(socket.AF_INET, p) for p in packed]


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
    rows = [(p,) for p in packed]
    want = [socket.inet_ntop(socket.AF_INET6, p) for p in packed]
    assert columns.extract(rows, [((0,), "a")])[0].to_pylist() == want


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
    fast = columns.extract(rows, specs)
    slow = columns.extract_python(rows, specs)
    for a, b in zip(fast, slow):
        a.validate(full=True)
        assert a.equals(b), (a, b)
    assert fast[1].to_pylist() == [2, None, None, 5]
    assert fast[4].to_pylist() == [[7, 8], None, [], None]
    assert fast[5].to_pylist() == [True, False, None, True]
    empty = columns.extract([], specs)
    assert [len(a) for a in empty] == [0] * len(specs)
    assert all(a.type == columns.KIND_TYPES[spec[1]] for a, spec in zip(empty, specs))


def test_fill_applies_only_below_a_present_first_tuple():
    """(path, kind, fill): a None inside a present side (a query without OPT) is `fill`; a missing side
    (row[path[0]] None) stays null, and so does a None on a one-step path."""
    rows = [((1, None),), ((2, (3,)),), (None,), ((None, (5,)),)]
    specs = [((0, 1, 0), "i", 0), ((0, 1, 0), "i"), ((0, 1), "L", ()), ((0, 0), "i", 9)]
    fast = columns.extract(rows, specs)
    assert [a.to_pylist() for a in fast] == [
        [0, 3, None, 5],
        [None, 3, None, 5],
        [[], [3], None, [5]],
        [1, 2, None, 9],
    ]
    for a, b in zip(fast, columns.extract_python(rows, specs)):
        assert a.equals(b), (a, b)
    one_step = [((0,), "i", 7)]
    assert columns.extract([(None,), (3,)], one_step)[0].to_pylist() == [None, 3]
    assert columns.extract_python([(None,), (3,)], one_step)[0].to_pylist() == [None, 3]


def test_pair_of_paths_reads_the_second_where_the_first_is_none():
    """((p1), (p2)): Arrow's coalesce of the two paths, as the builder uses for query-else-response."""
    rows = [((1, 2), (3, 4)), (None, (5, 6)), ((None, 7), (8, None)), (None, None), ((9, 1), None)]
    specs = [(((0, 0), (1, 0)), "i"), (((0, 1), (1, 1)), "i")]
    fast = columns.extract(rows, specs)
    assert [a.to_pylist() for a in fast] == [[1, 5, 8, None, 9], [2, 6, 7, None, 1]]
    assert all(a.equals(b) for a, b in zip(fast, columns.extract_python(rows, specs)))
    with pytest.raises(ValueError):
        columns.extract(rows, [(((0, 0), (1, 0)), "i", 0)])  # a fill needs a single path


def test_empty_first_values_of_every_variable_width_kind():
    # An empty first value was copied to the data buffer before it had any memory: memcpy(NULL, src, 0),
    # undefined behaviour that make test-asan's UndefinedBehaviorSanitizer stops at.
    rows = [("", b"", (), "", b"\x7f\x00\x00\x01"), ("a.b.example", b"x", (1,), "A.Example.COM", b"\x0a\x00\x00\x01")]
    specs = [((0,), "s"), ((1,), "y"), ((2,), "L"), ((3,), "D"), ((4,), "a")]
    fast = columns.extract(rows, specs)
    assert [a.to_pylist() for a in fast] == [
        ["", "a.b.example"], [b"", b"x"], [[], [1]], ["", "example.com"], ["127.0.0.1", "10.0.0.1"],
    ]
    assert all(a.equals(b) for a, b in zip(fast, columns.extract_python(rows, specs)))


@pytest.mark.parametrize(
    "rows, spec, error",
    [
        ([(2**31,)], ((0,), "i"), OverflowError),
        ([((1,),)], ((0, 3), "i"), IndexError),
        ([(5,)], ((0, 0), "i"), TypeError),
        ([(b"\x01\x02\x03",)], ((0,), "a"), ValueError),
        ([("text",)], ((0,), "y"), TypeError),
        ([("1",)], ((0,), "i"), TypeError),
        ([(1,)], ((0,), "b"), TypeError),
        ([(1,)], ((0,), "?"), ValueError),
    ],
)
def test_bad_rows_raise(rows, spec, error):
    """A bug upstream (a value of the wrong type) is an exception, never a wrong or corrupt column."""
    with pytest.raises(error):
        columns.extract(rows, [spec])


def test_large_batch_is_exact():
    """More rows than the prefetch distances and several buffer growths: values land in their own rows."""
    n = 100_003
    rows = [(i, None if i % 7 == 0 else f"name{i}", (i % 3 == 0, (i, i + 1))) for i in range(n)]
    specs = [((0,), "q"), ((1,), "s"), ((2, 0), "b"), ((2, 1), "L")]
    fast = columns.extract(rows, specs)
    assert fast[0].to_pylist() == list(range(n))
    assert fast[1].null_count == len(range(0, n, 7))
    assert fast[1][n - 2].as_py() == f"name{n - 2}" and fast[1][n - 1].as_py() is None  # (n - 1) % 7 == 0
    assert fast[3].flatten().to_pylist()[-2:] == [n - 1, n]
    assert all(a.equals(b) for a, b in zip(fast, columns.extract_python(rows, specs)))
    assert fast[1].is_null().to_pylist() == [i % 7 == 0 for i in range(n)]  # each null in its own row


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
    """The 'D' kind (C) and columns.domain_name (Python) equal the regex replace that defines the column,
    ASCII-lowercased, on every QNAME of the real captures and on edge cases (newlines, non-ASCII case)."""
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
    assert columns.extract(rows, [((0,), "D")])[0].to_pylist() == regex
    assert columns.extract_python(rows, [((0,), "D")])[0].to_pylist() == regex
    assert len(set(regex)) > 100  # real names, not only the edge cases


# --- callers that run Python code in the middle of the pass (not reachable from packets) ---------------------------


def test_rows_emptied_by_a_value_are_an_error_not_a_read_of_freed_memory():
    # A value's __index__ empties the rows list (which held the only reference to its row): the pass read the
    # row's other values and the next row from freed memory. Run in a fresh interpreter: a crash fails this
    # test only.
    code = """
from export.parquet import _columns
class Value:
    def __index__(self):
        rows.clear()
        return 5
rows = [(Value(), 1), (2, 3)]
try:
    _columns.extract(rows, [((0,), "q"), ((1,), "q")])
except RuntimeError as e:
    print("RuntimeError", e)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "RuntimeError extract: rows changed size", proc.stdout


def test_a_list_value_emptied_by_its_own_item_is_read_as_it_was():
    code = """
from export.parquet import _columns
class Item:
    def __index__(self):
        value.clear()
        return 1
value = [Item(), 5, 6]
print(_columns.extract([(value,)], [((0,), "L")])[0][-1:])
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(b'\\x01\\x00\\x00\\x00\\x05\\x00\\x00\\x00\\x06\\x00\\x00\\x00',)", proc.stdout
