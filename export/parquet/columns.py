"""Rows of nested tuples → Arrow arrays, one array per (path, kind) spec: the Python reference's column pass.

The record builder of the reference pipeline (RecordBuilder.build, on transaction tuples) reads ~60 columns out
of each batch of transactions with `extract_python` (pa.array over Python lists). The production pipeline's
column pass, export/parquet/_parquetrec.c on message records, must give the same table
(tests/export/test_parquetrec.py).

A path is a tuple of indexes followed from the row through nested tuples; a None anywhere on it is a
null, except that a spec (path, kind, fill) gives `fill` for a None met after the first tuple on the path
(row[path[0]] present: e.g. a query without an OPT record gets DNS Probe's 0/"" EDNS values). A pair
of paths (p1, p2) reads p2 where p1 gives None, like Arrow's coalesce (query side, else response side).
Kinds: 'q' int64, 'i' int32, 'd' float64, 'b' bool, 's' string, 'y' binary, 'a' packed address bytes
→ text, 'L' tuple of ints → list<int32>, 'D' a QNAME str → DNS Probe's domain_name (`domain_name`).
"""

import socket

import pyarrow as pa

KIND_TYPES = {
    "q": pa.int64(),
    "i": pa.int32(),
    "d": pa.float64(),
    "b": pa.bool_(),
    "s": pa.string(),
    "y": pa.binary(),
    "a": pa.string(),
    "L": pa.list_(pa.int32()),
    "D": pa.string(),
}
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def domain_name(qname):
    """DNS Probe's domain_name: the QNAME ASCII-lowercased, cut to its last two labels when it has two
    dots or more. Defined as the regex replace ^.*\\.([^.]*\\.[^.]*)$ → \\1 (whose '.' does not match a
    newline, so a newline before the second-to-last dot keeps the whole name); the regex cost 1.7 µs a
    row in pyarrow, this rule a few ns (in C: the domain_name column of _parquetrec.c). tests/export/test_columns.py
    checks that both agree with the regex."""
    low = qname.translate(_ASCII_LOWER)
    last = low.rfind(".")
    second = low.rfind(".", 0, last) if last > 0 else -1
    if second < 0 or "\n" in low[:second]:
        return low
    return low[second + 1 :]


def _follow(row, path):
    if isinstance(path[0], tuple):  # a pair of paths: the second where the first gives None
        first = _follow(row, path[0])
        return _follow(row, path[1]) if first is None else first
    for k in path:
        if row is None:
            return None
        row = row[k]
    return row


def _address(packed):
    return socket.inet_ntop(socket.AF_INET if len(packed) == 4 else socket.AF_INET6, packed)


def extract_python(rows, specs):
    """One Arrow array per (path, kind) spec, read from `rows` (a list of tuples), built with pa.array."""
    out = []
    for path, kind, *fill in specs:
        values = [_follow(row, path) for row in rows]
        if fill and fill[0] is not None and len(path) > 1:
            values = [
                fill[0] if v is None and row[path[0]] is not None else v for v, row in zip(values, rows)
            ]
        if kind == "a":
            values = [None if v is None else _address(v) for v in values]
        elif kind == "D":
            values = [None if v is None else domain_name(v) for v in values]
        out.append(pa.array(values, KIND_TYPES[kind]))
    return out
