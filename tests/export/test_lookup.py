"""The cached lookups of enrichment and client privacy (export/lookup.py): the C cache (export/_lookup.c) against its
Python twin on columns with repeats, nulls, slices, chunks and several results, with caches small enough to be
dropped and rebuilt; its errors; texts crafted to collide in its table; client privacy through both."""

import random
import socket
import sys

import pyarrow as pa
import pytest

from export.lookup import LookupCache, text_array, text_buffers
from probe.native import load

_lookup = load("export._lookup")
pytestmark = pytest.mark.skipif(_lookup is None, reason="export._lookup not built")


def results(text, width):
    """A deterministic function of the text with `width` results, some of them empty or non-ASCII."""
    out = (text[::-1], f"{len(text)}", "é" * (len(text) % 3), text.upper(), "")[:width]
    return out[0] if width == 1 else out


def column(rng, n, distinct, nulls=0.1):
    """n rows drawn from `distinct` texts (client-like addresses, the empty text, non-ASCII names), some null."""
    values = ["", "é.example", "a" * 70] + [socket.inet_ntop(socket.AF_INET6 if k % 5 == 0 else socket.AF_INET,
                                                            rng.randbytes(16 if k % 5 == 0 else 4))
                                            for k in range(distinct)]
    return [None if rng.random() < nulls else rng.choice(values) for _ in range(n)]


def both(function, width, size, columns, null):
    """(C results, Python results, calls of the function by each) over the same columns, one cache each."""
    calls = {"c": 0, "py": 0}

    def counted(who):
        def f(text):
            calls[who] += 1
            return function(text)
        return f

    c = LookupCache(counted("c"), size, width)
    py = LookupCache(counted("py"), size, width, python=True)
    assert c.native is not None and py.native is None
    got = [c.columns(col, null) for col in columns]
    want = [py.columns(col, null) for col in columns]
    return got, want, calls


@pytest.mark.parametrize("width", [1, 2, 5])
@pytest.mark.parametrize("null", [None, "", "?"])
@pytest.mark.parametrize("size", [3, 50, 100_000])
def test_c_cache_equals_the_python_twin(width, null, size):
    rng = random.Random(width * 100 + size)
    texts = column(rng, 3000, 200)
    full = pa.array(texts, pa.string())
    columns = [full, full.slice(7, 2000), full.slice(2999), pa.chunked_array([full.slice(0, 10), full.slice(10)]),
               pa.array([], pa.string()), pa.nulls(5, pa.string()), full]
    got, want, calls = both(lambda t: results(t, width), width, size, columns, null)
    for g, w, col in zip(got, want, columns):
        assert len(g) == len(w) == width
        for a, b in zip(g, w):
            assert a.type == pa.string() and a.equals(b), (width, null, size)
            assert len(a) == len(col) and a.null_count == (col.null_count if null is None else 0)
    if size == 100_000:  # everything kept: each text computed once by each
        assert calls["c"] == calls["py"] == len({t for t in texts if t is not None})


def test_runs_of_one_value_and_the_row_before():
    """A column of one repeated text and alternating texts (the row before's record is reused, then not)."""
    col = pa.array(["", "", "", "1.2.3.4", "1.2.3.4", "", "1.2.3.5", None, "1.2.3.5"] * 50, pa.string())
    got, want, calls = both(lambda t: t + "!", 1, 2, [col], "")
    assert got[0][0].equals(want[0][0])
    assert got[0][0].to_pylist()[:9] == ["!", "!", "!", "1.2.3.4!", "1.2.3.4!", "!", "1.2.3.5!", "", "1.2.3.5!"]


def _text_hash(data, seed):
    """include/strcolumn.h text_hash, to find texts that land in one slot of the C table."""
    m = (1 << 64) - 1
    k1, k2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9
    n = len(data)
    h = seed ^ ((n * 0x94D049BB133111EB + 1) & m)

    def step(h, w):
        h = ((h ^ w) * k1) & m
        return h ^ (h >> 31)

    if n >= 8:
        k = 0
        while k + 8 <= n:
            h = step(h, int.from_bytes(data[k : k + 8], "little"))
            k += 8
        if k < n:
            h = step(h, int.from_bytes(data[n - 8 :], "little"))
    elif n >= 4:
        h = step(h, int.from_bytes(data[:4], "little") << 32 | int.from_bytes(data[n - 4 :], "little"))
    elif n:
        h = step(h, data[0] << 16 | data[n >> 1] << 8 | data[n - 1])
    h = (h * k2) & m
    return h ^ (h >> 29)


def test_texts_that_collide_are_looked_up_uncached():
    """Texts crafted to share one slot (as spoofed clients could): beyond the probe limit they are not kept, and are
    still answered right, each time by the function."""
    seed = 12345
    texts = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(200_000)]
    same = [t for t in texts if _text_hash(t.encode(), seed) & 1023 == 7][:60]
    assert len(same) == 60
    calls = []

    def f(text):
        calls.append(text)
        return text[::-1]

    cache = _lookup.TextCache(f, 1, 100_000, seed)
    col = pa.array(same + same, pa.string())
    (out,) = [text_array(len(col), r) for r in cache.columns(*text_buffers(col), None)]
    assert out.to_pylist() == [t[::-1] for t in same + same]
    kept = len(cache)
    assert 0 < kept < len(same)  # (the table holds 1,024 slots until 512 texts: the probe limit is reached first)
    assert len(calls) == len(same) + (len(same) - kept)  # the ones not kept were asked again


def test_errors():
    col = pa.array(["a", "b", None, "a"], pa.string())

    def boom(text):
        if text == "b":
            raise KeyError(text)
        return text

    for python in (False, True):
        cache = LookupCache(boom, 10, python=python)
        with pytest.raises(KeyError):
            cache.columns(col)
        assert cache.columns(col.slice(0, 1))[0].to_pylist() == ["a"]  # still usable
        for bad, width in ((lambda t: 1, 1), (lambda t: ("x",), 1), (lambda t: "x", 2), (lambda t: ("x", 1), 2),
                           (lambda t: ["x", "y"], 2)):
            with pytest.raises(TypeError, match="must return"):
                LookupCache(bad, 10, width, python=python).columns(col)
    with pytest.raises(TypeError, match="string column"):
        LookupCache(str, 10).columns(pa.array([1, 2]))
    cache = _lookup.TextCache(str, 1, 10)
    with pytest.raises(ValueError, match="shorter"):
        cache.columns(5, 0, [None, b"\0" * 8, b"abc"], None)
    with pytest.raises(ValueError, match="out of bounds"):
        cache.columns(1, 0, [None, (b"\0" * 3 + b"\x09" + b"\0" * 4), b"abc"], None)
    with pytest.raises(ValueError):
        _lookup.TextCache(str, 0)
    with pytest.raises(ValueError):
        _lookup.TextCache(str, 1, 0)

    def reenter(text):
        return reentrant.native.columns(*text_buffers(col), None)

    reentrant = LookupCache(reenter, 10)
    with pytest.raises(RuntimeError, match="its own lookup function"):
        reentrant.columns(col)


# Found by review (issue 32): misuse of the C object that wrote or read out of bounds.


def test_reset_by_its_own_function_is_refused():
    """The function calling the cache's __init__ with another width: columns() went on with 16 result columns of
    which it had made 1 (writes through uninitialised pointers) and an arena the reset freed."""
    col = pa.array(["a", "b", "a"], pa.string())
    cache = _lookup.TextCache(str)

    def widen(text):
        cache.__init__(lambda t: (t,) * 16, 16)
        return (text,) * 16

    cache.__init__(widen)
    with pytest.raises(RuntimeError, match="its own lookup function"):
        cache.columns(*text_buffers(col), None)
    assert cache.width == 1 and len(cache) == 0
    cache.__init__(str.upper)
    assert text_array(3, cache.columns(*text_buffers(col), None)[0]).to_pylist() == ["A", "B", "A"]


def test_a_cache_never_initialised_is_refused():
    """TextCache.__new__ alone: no function (columns() called NULL)."""
    blank = _lookup.TextCache.__new__(_lookup.TextCache)
    with pytest.raises(RuntimeError, match="not initialised"):
        blank.columns(*text_buffers(pa.array(["a"], pa.string())), None)
    blank.clear()
    assert len(blank) == 0


@pytest.mark.parametrize("length, offset", [(1, sys.maxsize), (sys.maxsize, 0),
                                            (sys.maxsize // 2 + 1, sys.maxsize // 2), (sys.maxsize // 4, 0)])
def test_lengths_and_offsets_past_any_buffer(length, offset):
    """include/strcolumn.h: offset + length overflowed (undefined; wrapped, it passed the bounds check and the rows
    were read from far outside the buffers)."""
    cache = _lookup.TextCache(str)
    with pytest.raises(ValueError, match="too large"):
        cache.columns(length, offset, [None, b"\0" * 8, b""], None)


def test_client_privacy_through_both():
    """TablePrivacy (Crypto-PAn and prefixes) gives the same columns through the C cache and through the twin."""
    from export.anonymise import ClientPrivacy, CryptoPAn, new_key
    from export.parquet.privacy import TablePrivacy

    client = ClientPrivacy(CryptoPAn(new_key()), prefix4=24, prefix6=48)
    rng = random.Random(3)
    addresses = [socket.inet_ntop(socket.AF_INET6, rng.randbytes(16)) if k % 4 == 0 else
                 socket.inet_ntop(socket.AF_INET, rng.randbytes(4)) for k in range(60)]
    src = pa.array([rng.choice(addresses) for _ in range(500)] + [None], pa.string())
    ecs = pa.array([rng.choice(["", "192.0.2.0/24", "2001:db8:1::/48", "198.51.100.7/32", None])
                    for _ in range(len(src))], pa.string())
    table = pa.table({"src": src, "edns_client_subnet": ecs})
    fast = TablePrivacy(client)
    slow = TablePrivacy(client)
    for name in ("_clients", "_subnets"):
        cache = getattr(slow, name)
        setattr(slow, name, LookupCache(cache.function, cache.size, python=True))
    assert fast(table).equals(slow(table))
    assert fast(table).column("src").null_count == 1
