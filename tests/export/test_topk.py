"""The Space-Saving summary: export/_topk.c against its Python reference (export/topk.py) on random and adversarial
streams, and the summary's guarantees against exact counts."""

import random
from collections import Counter

import pytest

from export.topk import SpaceSaving, merged, ranked
from probe.native import load

_topk = load("export._topk")
needs_c = pytest.mark.skipif(_topk is None, reason="export._topk not built")


def both(k):
    return SpaceSaving(k), _topk.SpaceSaving(k)


def check_same(reference, c):
    assert ranked(c.entries()) == reference.entries()
    assert len(c) == len(reference)


def zipf_stream(rng, n, names):
    return [f"n{min(int(rng.paretovariate(1.1)), names)}.example" for _ in range(n)]


@needs_c
@pytest.mark.parametrize("k", [1, 2, 7, 100])
@pytest.mark.parametrize("seed", range(6))
def test_random_streams_same_as_reference(k, seed):
    rng = random.Random(seed)
    reference, c = both(k)
    for _ in range(20):
        items = zipf_stream(rng, rng.randrange(0, 300), 500)
        if rng.random() < 0.5:
            weights = [rng.randrange(1, 50) for _ in items]
        else:
            weights = None
        if items and rng.random() < 0.3:
            items[rng.randrange(len(items))] = None
        reference.add(items, weights)
        c.add(items, weights)
        check_same(reference, c)


@needs_c
@pytest.mark.parametrize("k", [1, 3, 16])
def test_adversarial_streams_same_as_reference(k):
    """Every count equal (ties decided by the last update), distinct items only (every update evicts), a cycle of
    k + 1 items (the classic worst case), str beside bytes of the same letters."""
    streams = [
        [f"d{i}" for i in range(5 * k + 3)],
        [f"c{i % (k + 1)}" for i in range(10 * k + 7)],
        [x for i in range(3 * k) for x in (f"s{i % 5}", f"s{i % 5}".encode())],
        ["hot"] * 50 + [f"cold{i}" for i in range(4 * k)] + ["hot"],
    ]
    for stream in streams:
        reference, c = both(k)
        for start in range(0, len(stream), 7):
            reference.add(stream[start:start + 7])
            c.add(stream[start:start + 7])
            check_same(reference, c)


@pytest.mark.parametrize("make", [SpaceSaving, *([] if _topk is None else [_topk.SpaceSaving])])
@pytest.mark.parametrize("batch", [20000, 300, 1])
def test_guarantees(make, batch):
    """Each count over-estimates its item's true count by at most its error; the counts sum to at most the stream's
    length; an item above n / k is kept. In one batch, in batches of a second's size, one item at a time."""
    rng = random.Random(7)
    stream = zipf_stream(rng, 20000, 5000)
    k = 50
    summary = make(k)
    for start in range(0, len(stream), batch):
        summary.add(stream[start:start + batch])
    exact = Counter(stream)
    entries = ranked(summary.entries())
    assert sum(count for _, count, _ in entries) <= len(stream)
    for item, count, error in entries:
        assert count - error <= exact[item] <= count
    kept = {item for item, _, _ in entries}
    assert {item for item, n in exact.items() if n > len(stream) / k} <= kept
    # the top ten are exact here (a skewed stream)
    assert [(i, c) for i, c, _ in entries[:10]] == exact.most_common(10)


@pytest.mark.parametrize("make", [SpaceSaving, *([] if _topk is None else [_topk.SpaceSaving])])
def test_batch_keeps_the_largest(make):
    """A batch is summed by item, its new items counted from the floor (the smallest count kept when items were
    last given up), then the k largest kept, the later update first among equal counts."""
    summary = make(2)
    summary.add(["a", "a", "b"])
    summary.add(["c", "d", "c"])  # c: 2, d: 1, both from floor 0; a (2) and c (2) kept, c updated last
    assert ranked(summary.entries()) == [("a", 2, 0), ("c", 2, 0)]
    summary.add(["e"])  # from floor 2: 3, error 2; c updated after a
    assert ranked(summary.entries()) == [("e", 3, 2), ("c", 2, 0)]


def test_merged_sums_counts_and_keeps_k():
    a, b = SpaceSaving(3), SpaceSaving(3)
    a.add(["x", "y", "y", "z"])
    b.add(["y", "w", "w", "w"])
    assert merged([a.entries(), b.entries()], k=2) == [("w", 3, 0), ("y", 3, 0)]


@pytest.mark.parametrize("make", [SpaceSaving, *([] if _topk is None else [_topk.SpaceSaving])])
def test_refuses_bad_input(make):
    with pytest.raises(ValueError):
        make(0)
    summary = make(2)
    with pytest.raises((ValueError, TypeError)):
        summary.add(["a"], [0])
    if make is not SpaceSaving:
        with pytest.raises(TypeError):
            summary.add([1])
        with pytest.raises(ValueError):
            summary.add(["a", "b"], [1])
