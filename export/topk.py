"""Heavy hitters: the Space-Saving summary (Metwally, Agrawal, El Abbadi 2005) of a stream of weighted items, in
k counters, updated by batches. The reference of export/_topk.c (which the live top lists use, probe.run.top): the
same algorithm and the same tie-breaking, so that both hold the same counters after the same batches
(tests/export/test_topk.py).

A batch (a list of items and weights; the live top lists: the exact counts of a second of a table written) is summed
by item first, in the order first seen. Each of its items then adds its sum to its counter; an item without a
counter is a candidate of count floor + its sum and error floor, floor being the smallest count kept by the last
batch that gave items up (0 before any did: no count is smaller, and no item given up was counted more):
Space-Saving's eviction of the smallest counter, over-estimating the new item by at most what that counter held. At
the batch's end the k largest counts keep or take the counters; among equal counts the one updated last wins (each
update has a number, in order). Hence, as with Space-Saving one item at a time: count - error <= the item's true
count <= count; the counts sum to at most the stream's total weight, so the smallest is at most total / k and an
item counted more than that is always kept. Why batches: one at a time, a stream of new names (the standard mix, a
random-name flood) evicts at every update; by batch at most k counters change hands.

Summaries of parts of a stream (workers, seconds) are merged by summing the counts and errors of each item and
keeping the k largest (merged())."""

TOP_K = 1000  # counters per summary of the live top lists


class SpaceSaving:
    """k counters: add(items, weights) updates them by one batch; entries() → [(item, count, error)]."""

    def __init__(self, k):
        if k < 1:
            raise ValueError("k must be at least 1")
        self.k = k
        self.counters = {}  # item → [count, error, number of its last update]
        self.updates = 0
        self.floor = 0  # the smallest count kept by the last batch that gave items up

    def add(self, items, weights=None):
        """One batch: each item of the list `items` (str or bytes; None is skipped) by the weight at its index in
        `weights` (positive ints; None: 1 each)."""
        batch = {}  # item → summed weight, in the order first seen
        for i, item in enumerate(items):
            if item is None:
                continue
            weight = 1 if weights is None else weights[i]
            if weight < 1:
                raise ValueError("weights must be positive")
            batch[item] = batch.get(item, 0) + weight
        counters = self.counters
        for item, weight in batch.items():
            self.updates += 1
            counter = counters.get(item)
            if counter is not None:
                counter[0] += weight
                counter[2] = self.updates
            else:
                counters[item] = [self.floor + weight, self.floor, self.updates]
        if len(counters) > self.k:
            kept = sorted(counters.items(), key=lambda ic: (ic[1][0], ic[1][2]), reverse=True)[:self.k]
            self.counters = dict(kept)
            self.floor = kept[-1][1][0]

    def entries(self):
        """(item, count, error) of every counter, the largest counts first, equal counts by item."""
        return ranked([(item, c[0], c[1]) for item, c in self.counters.items()])

    def __len__(self):
        return len(self.counters)


def ranked(entries):
    """(item, count, error) entries, the largest counts first, equal counts by item (str before bytes)."""
    return sorted(entries, key=lambda e: (-e[1], isinstance(e[0], bytes), e[0]))


def merged(summaries, k=TOP_K):
    """The k largest of the (item, count, error) entries of several summaries, the counts and errors of an item
    summed (the parallel Space-Saving merge), ranked."""
    total = {}
    for entries in summaries:
        for item, count, error in entries:
            have = total.get(item)
            total[item] = (count, error) if have is None else (have[0] + count, have[1] + error)
    return ranked([(item, c, e) for item, (c, e) in total.items()])[:k]
