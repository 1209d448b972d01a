"""Client texts through the C lookup cache (export._lookup.TextCache) and its Python twin (export.lookup), with
the public resolvers' C prefix table (export.enrich._resolvers) as the cache's function in one and its twin
(resolvers.PrefixTable.name) in the other: equal columns. The caches are small, so that they fill and start
again within an input.

Input: the first byte picks the cache size (1-16) and whether nulls come out as nulls or as ""; the rest, split
at newlines, are the texts (UTF-8, other bytes as \\xNN escapes; a line of one NUL byte is a null)."""

import pyarrow as pa
from harness import check, run

from export.enrich.resolvers import PrefixTable, load_lists
from export.lookup import LookupCache

TABLE = PrefixTable(load_lists(None))
FAST = TABLE.function()
assert type(FAST).__module__ == "export.enrich._resolvers", "export.enrich._resolvers is not built"


def one_input(data):
    if not data:
        return
    size = 1 + (data[0] & 15)
    null = "" if data[0] & 16 else None
    texts = [None if line == b"\x00" else line.decode("utf-8", "backslashreplace") for line in data[1:].split(b"\n")]
    column = pa.array(texts * 2, pa.string())  # twice: the second time from the cache, or after it started again
    c = LookupCache(FAST, size)
    assert c.native is not None, "export._lookup is not built"
    got = c.columns(column, null)[0]
    want = LookupCache(TABLE.name, size, python=True).columns(column, null)[0]
    check(got.equals(want), "resolver names", data, got.to_pylist(), want.to_pylist())


if __name__ == "__main__":
    run(one_input)
