"""IPv4 and IPv6 fragment reassembly with bounded memory and a capture-time timeout.

Fragments are rare in DNS traffic (large UDP responses), so clarity wins over speed here.
"""

from probe.model import cap_int32


class _Datagram:
    __slots__ = ("first_ts", "last_ts", "wirelen", "pieces", "total", "size", "ttl", "vlan")

    def __init__(self, ts, ttl, vlan):
        self.first_ts = ts
        self.last_ts = ts
        self.wirelen = 0
        self.pieces = {}  # offset -> bytes
        self.total = None  # payload length, known once the last fragment arrived
        self.size = 0
        self.ttl = ttl
        self.vlan = vlan


class FragmentReassembler:
    """Collects fragments keyed by (family, src, dst, protocol, id) until a datagram is whole.

    max_datagrams bounds the number of datagrams in progress (the oldest is dropped first);
    timeout_ns drops a datagram whose last fragment is older than that, in capture time.
    """

    MAX_PAYLOAD = 65535

    def __init__(self, timeout_ns, max_datagrams, stats):
        self.timeout_ns = timeout_ns
        self.max_datagrams = max_datagrams
        self.stats = stats
        self.pending = {}  # insertion order = age order

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
        if offset not in dg.pieces:
            dg.pieces[offset] = data
            dg.size += len(data)
            dg.wirelen += wirelen  # a dropped duplicate adds nothing to the datagram's frame lengths
        else:
            stats.fragments_dropped += 1  # duplicate fragment
        if dg.total is None or dg.size < dg.total:
            return None
        payload = self._assemble(dg)
        if payload is None:
            return None
        del self.pending[key]
        stats.fragments_reassembled += 1
        return payload, dg.first_ts, cap_int32(dg.wirelen, stats), dg.ttl, dg.vlan

    @staticmethod
    def _assemble(dg):
        out = bytearray()
        for offset in sorted(dg.pieces):
            piece = dg.pieces[offset]
            if offset > len(out):
                return None  # gap: wait for more fragments
            # Overlap: keep the bytes already placed (first arrival wins), append the rest.
            out += piece[len(out) - offset :]
        if len(out) < dg.total:
            return None
        return bytes(out[: dg.total])

    def _drop(self, key):
        dg = self.pending.pop(key)
        self.stats.fragments_dropped += len(dg.pieces)

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
