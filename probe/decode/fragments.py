"""IPv4 and IPv6 fragment reassembly with bounded memory and a capture-time timeout.

Each datagram in progress is one buffer of at most 65,535 bytes and the sorted list of the byte ranges it
holds: a fragment copies in only the bytes no earlier fragment gave (the first arrival wins), so
overlapping fragments cannot make a datagram hold more than the IP maximum, and completeness is one look
at the first range instead of a sort of all pieces per fragment.
"""

from bisect import bisect_left, bisect_right

from probe.model import cap_int32


class _Datagram:
    __slots__ = ("first_ts", "last_ts", "wirelen", "buf", "spans", "count", "total", "ttl", "vlan")

    def __init__(self, ts, ttl, vlan):
        self.first_ts = ts
        self.last_ts = ts
        self.wirelen = 0
        self.buf = bytearray()  # the payload so far; bytes outside spans are not yet known
        self.spans = []  # byte ranges held, flat and sorted: [start0, end0, start1, end1, ...], touching ones merged
        self.count = 0  # fragments that gave bytes
        self.total = None  # payload length, known once the last fragment arrived
        self.ttl = ttl
        self.vlan = vlan


def _cover(spans, start, end):
    """Mark [start, end) as held in spans; returns the parts of it that were not held before."""
    lo = bisect_left(spans, start)
    lo -= lo & 1  # inside (or touching the end of) a held range: from that range's start
    hi = bisect_right(spans, end)
    hi += hi & 1  # inside (or touching the start of) a held range: to that range's end
    held = spans[lo:hi]
    new, pos = [], start
    for i in range(0, len(held), 2):
        if held[i] > pos:
            new.append((pos, min(held[i], end)))
        pos = max(pos, held[i + 1])
    if pos < end:
        new.append((pos, end))
    spans[lo:hi] = [min(start, held[0]), max(end, held[-1])] if held else [start, end]
    return new


class FragmentReassembler:
    """Collects fragments keyed by (family, src, dst, protocol, id) until a datagram is whole.

    max_datagrams bounds the number of datagrams in progress and max_bytes the bytes they hold (the oldest
    is dropped first); timeout_ns drops a datagram whose last fragment is older than that, in capture time.
    """

    MAX_PAYLOAD = 65535

    def __init__(self, timeout_ns, max_datagrams, max_bytes, stats):
        self.timeout_ns = timeout_ns
        self.max_datagrams = max_datagrams
        self.max_bytes = max_bytes
        self.stats = stats
        self.pending = {}  # insertion order = age order
        self.held_bytes = 0  # summed buffer sizes of the datagrams in progress

    def add(self, key, ts, wirelen, offset, more, data, ttl, vlan):
        """Add one fragment. Returns (payload, first_ts, wirelen_sum, ttl, vlan) when complete."""
        stats = self.stats
        stats.fragments += 1
        dg = self.pending.get(key)
        if dg is None:
            if len(self.pending) >= self.max_datagrams:
                self._drop(next(iter(self.pending)))
            dg = self.pending[key] = _Datagram(ts, ttl, vlan)
        end = offset + len(data)
        if end > self.MAX_PAYLOAD or (dg.total is not None and end > dg.total):
            self._drop(key)
            stats.fragments_dropped += 1
            return None
        if offset == 0:
            dg.ttl = ttl
        dg.last_ts = ts
        if not more:
            dg.total = end
        new = _cover(dg.spans, offset, end) if end > offset else None
        if new:
            grow = end - len(dg.buf)
            if grow > 0:
                if not self._make_room(grow, key):
                    return None
                dg.buf += bytes(grow)
                self.held_bytes += grow
            for a, b in new:
                dg.buf[a:b] = data[a - offset : b - offset]
        elif new is not None:
            stats.fragments_dropped += 1  # every byte already held: a duplicate
            return None
        dg.count += 1
        dg.wirelen += wirelen  # a duplicate adds nothing to the datagram's frame lengths
        spans = dg.spans
        if dg.total is None or (spans[1] if spans and spans[0] == 0 else 0) < dg.total:
            return None
        del self.pending[key]
        self.held_bytes -= len(dg.buf)
        stats.fragments_reassembled += 1
        return bytes(dg.buf[: dg.total]), dg.first_ts, cap_int32(dg.wirelen, stats), dg.ttl, dg.vlan

    def _make_room(self, grow, key):
        """Drop the oldest other datagrams until grow more bytes fit in max_bytes; False when even this
        datagram alone would not fit (it is dropped)."""
        while self.held_bytes + grow > self.max_bytes:
            oldest = next(iter(self.pending))
            if oldest == key:
                self._drop(key)
                self.stats.fragments_dropped += 1  # this fragment
                return False
            self._drop(oldest)
        return True

    def _drop(self, key):
        dg = self.pending.pop(key)
        self.held_bytes -= len(dg.buf)
        self.stats.fragments_dropped += dg.count

    def expire(self, now_ns):
        """Drop datagrams not completed within the timeout (capture time)."""
        cutoff = now_ns - self.timeout_ns
        stale = [k for k, dg in self.pending.items() if dg.last_ts < cutoff]
        for key in stale:
            self._drop(key)

    def flush(self):
        """End of input: every datagram still incomplete is dropped and counted."""
        for key in list(self.pending):
            self._drop(key)
