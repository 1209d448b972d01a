"""String columns through a per-value function, computed once per value and kept in a per-worker cache.

The enrichment steps (export.enrich) and client privacy (export.parquet.privacy) look values up that repeat
heavily within a batch and across batches: client addresses and subnets. The C extension export._lookup reads a
column's buffers once, probes its hash table with each row's text and calls the function only for a text it has
not seen. Its Python twin, used when the extension was not built and compared with it by
tests/export/test_lookup.py: Arrow finds a batch's distinct values (dictionary encoding), a dict holds the
results, Arrow spreads them back over the rows (take).

text_buffers and text_array carry string columns to and from the C passes over them (include/strcolumn.h).
"""

import pyarrow as pa
import pyarrow.compute as pc

from probe.native import load, say_not_built

_lookup = load("export._lookup")

_MISSING = object()
STRING = pa.string()


def text_buffers(column):
    """(length, offset, buffers) of a string Array or ChunkedArray, as the C passes take them."""
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if column.type != STRING:
        raise TypeError(f"a string column is expected, not {column.type}")
    return len(column), column.offset, column.buffers()


def text_array(length, result):
    """The string Array of a C pass's (null_count, validity or None, offsets, data)."""
    nulls, validity, offsets, data = result
    buffers = [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(STRING, length, buffers, nulls)


def _results(r, width):
    """The results of one call as a tuple of `width` str (what the C cache accepts: a str, or a tuple)."""
    if width == 1 and isinstance(r, str):
        return (r,)
    if width > 1 and isinstance(r, tuple) and len(r) == width and all(isinstance(x, str) for x in r):
        return r
    raise TypeError(f"the lookup function must return {'a str' if width == 1 else 'a tuple of str'}, not {r!r}")


class LookupCache:
    """text → `width` str results (function(text): a str, or a tuple of `width` str), kept for up to `size`
    texts (then all dropped: a worker's memory stays bounded). python: the twin even where the C cache is built
    (the tests' reference)."""

    def __init__(self, function, size, width=1, python=False):
        self.function = function
        self.size = size
        self.width = width
        self.entries = {}  # the twin's
        self.native = None
        if _lookup is not None and not python:
            self.native = _lookup.TextCache(function, width, size)
        elif not python:
            say_not_built("export._lookup")

    def clear(self):
        if self.native is not None:
            self.native.clear()
        else:
            self.entries.clear()

    def columns(self, column, null=None):
        """The function's results over a string column (Array or ChunkedArray): `width` string Arrays; a null row
        gives `null` in each (None: a null)."""
        if self.native is None:
            return self.columns_python(column, null)
        length, offset, buffers = text_buffers(column)
        return [text_array(length, r) for r in self.native.columns(length, offset, buffers, null)]

    def columns_python(self, column, null=None):
        """The twin of the C pass."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        encoded = pc.dictionary_encode(column)
        values = encoded.dictionary.to_pylist()
        entries = self.entries
        if len(entries) + len(values) > self.size:
            entries.clear()
        function, width = self.function, self.width
        results = []
        for v in values:
            r = entries.get(v, _MISSING)
            if r is _MISSING:
                r = entries[v] = _results(function(v), width)
            results.append(r)
        indices = encoded.indices
        out = []
        for k in range(width):
            spread = pc.take(pa.array([r[k] for r in results], STRING), indices)
            out.append(spread.fill_null(null) if null is not None and spread.null_count else spread)
        return out
