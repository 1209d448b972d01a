"""Heavy hitters: the Space-Saving summary (Metwally, Agrawal, El Abbadi 2005) of a stream of weighted items, in
k counters. The reference of export/_topk.c (which the live top lists use, probe.run.top): the same algorithm and
the same tie-breaking, so that both hold the same counters after the same updates (tests/export/test_topk.py).

An update (item, weight) adds the weight to the item's counter; an item without a counter takes a free one, or,
when all k are taken, the counter of the smallest count, whose item it replaces: count = that count + weight,
error = that count (the new item's count is over-estimated by at most its error). Among equal smallest counts the
one updated longest ago is taken: each counter remembers the update number of its last update.

Summaries of parts of a stream (workers, seconds) are merged by summing the counts and errors of each item and
keeping the k largest (merged())."""

TOP_K = 1000  # counters per summary of the live top lists


class SpaceSaving:
    """k counters: add(items, weights) updates them in order; entries() → [(item, count, error)]."""

    def __init__(self, k):
        if k < 1:
            raise ValueError("k must be at least 1")
        self.k = k
        self.counters = {}  # item → [count, error, number of its last update]
        self.updates = 0

    def add(self, items, weights=None):
        """Update with each item of the list `items` (str or bytes; None is skipped), by the weight at its index in
        `weights` (positive ints; None: 1 each)."""
        counters = self.counters
        for i, item in enumerate(items):
            if item is None:
                continue
            weight = 1 if weights is None else weights[i]
            if weight < 1:
                raise ValueError("weights must be positive")
            self.updates += 1
            counter = counters.get(item)
            if counter is not None:
                counter[0] += weight
                counter[2] = self.updates
            elif len(counters) < self.k:
                counters[item] = [weight, 0, self.updates]
            else:
                smallest = min(counters, key=lambda name: (counters[name][0], counters[name][2]))
                count = counters.pop(smallest)[0]
                counters[item] = [count + weight, count, self.updates]

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
