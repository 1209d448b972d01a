"""Streams of weighted items through the C Space-Saving summary (export._topk) and its Python reference
(export.topk.SpaceSaving): equal counters (item, count, error) after every batch.

Input: the first byte gives k (1 to 16: small, so that evictions and ties abound); then items of 2 bytes each: the
first picks the item among 64 (str, or bytes for odd ones) and whether it ends a batch, the second its weight
(0: None, an item skipped; else 1 to 255)."""

from harness import check, run

from export.topk import SpaceSaving, ranked
from probe.native import load

_topk = load("export._topk")
assert _topk is not None, "export._topk is not built"


def one_input(data):
    if not data:
        return
    k = 1 + data[0] % 16
    c, reference = _topk.SpaceSaving(k), SpaceSaving(k)
    items, weights = [], []
    for pos in range(1, len(data) - 1, 2):
        pick, weight = data[pos], data[pos + 1]
        name = f"i{pick & 63}.example"
        items.append(None if weight == 0 else (name.encode() if pick & 1 else name))
        weights.append(max(weight, 1))
        if pick & 0x80 or pos + 3 >= len(data):
            c.add(items, weights)
            reference.add(items, weights)
            got, want = ranked(c.entries()), reference.entries()
            check(got == want, "counters", data, got, want)
            items, weights = [], []


if __name__ == "__main__":
    run(one_input)
