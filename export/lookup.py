"""A column through a per-value function, computed once per distinct value of a batch and kept in a cache.

The enrichment steps (export.enrich) and client privacy (export.parquet.privacy) look values up that repeat
heavily within a batch and across batches: client addresses, subnets, names. Arrow finds a batch's distinct values
(dictionary encoding, in C); the function runs in Python only for values the cache has not seen; Arrow then
spreads the results back over the rows (take, in C).
"""

import pyarrow as pa
import pyarrow.compute as pc

_MISSING = object()
STRING = pa.string()


class LookupCache:
    """value → result, cleared when it reaches `size` entries (a worker's memory stays bounded)."""

    def __init__(self, function, size):
        self.function = function
        self.size = size
        self.entries = {}

    def clear(self):
        self.entries.clear()

    def results(self, column):
        """(row indexes into the distinct values, the function's results for the distinct values) of a column
        (an Array or ChunkedArray); a null row has a null index."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        encoded = pc.dictionary_encode(column)
        values = encoded.dictionary.to_pylist()
        entries = self.entries
        if len(entries) + len(values) > self.size:
            entries.clear()
        function = self.function
        out = []
        for v in values:
            r = entries.get(v, _MISSING)
            if r is _MISSING:
                r = entries[v] = function(v)
            out.append(r)
        return encoded.indices, out


def spread(indices, results, typ=STRING, null=None):
    """One value per row from the distinct values' results (a null index: `null`)."""
    column = pc.take(pa.array(results, typ), indices)
    return column if null is None or not column.null_count else column.fill_null(null)
