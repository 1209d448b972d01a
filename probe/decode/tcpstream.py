"""DNS over TCP: per-direction stream reassembly and RFC 1035 length-prefix framing.

Handles several messages in one segment, one message over several segments, retransmitted and
reordered segments, and connections first seen mid-stream. Memory is bounded: at most max_flows
directions, and per direction at most one message (65,537 bytes) plus max_ooo_segments segments of at
most max_ooo_bytes in all held ahead of a gap; and at most max_bytes over all directions (the per-direction
bounds alone allow max_flows times a third of a megabyte). A direction dropped for a bound is counted in
tcp_evicted (its bytes in tcp_dropped_bytes). Idle directions are dropped after idle_timeout_ns of
capture time. Held segments are released in stream order from a heap, so filling a gap costs
O(log n) per held segment whatever their sizes and overlaps (a rescan per released segment made
overlapping small segments quadratic).

This is the reference twin of the C step in _tcpstream.c (probe.decode._tcpstream.TcpReassembler, what
PacketDecoder uses with the C parser): the same rules, outputs and counters, which
tests/decode/test_tcpstream_c.py and fuzz/fuzz_tcpstream.py check call by call. A change here is made there too.
"""

import heapq

from probe.model import cap_int32

SEQ_MOD = 1 << 32
SEQ_HALF = 1 << 31

FIN = 0x01
SYN = 0x02
RST = 0x04
ACK = 0x10


class _Flow:
    __slots__ = (
        "next_seq",
        "buf",
        "msg_ts",
        "msg_wirelen",
        "msg_ttl",
        "pos",
        "ooo",
        "ooo_heap",
        "ooo_bytes",
        "last_ts",
        "rtt_ms",
        "syn_ts",
        "synack_seen",
        "midstream",
    )

    def __init__(self, ts):
        self.next_seq = None
        self.buf = b""
        self.msg_ts = ts
        self.msg_wirelen = 0
        self.msg_ttl = 0
        self.pos = 0  # stream offset of next_seq, counted without wrapping (orders held segments)
        self.ooo = {}  # stream offset -> (payload, ts, wirelen, ttl)
        self.ooo_heap = []  # the offsets of ooo, smallest first
        self.ooo_bytes = 0
        self.last_ts = ts
        self.rtt_ms = None
        self.syn_ts = None
        self.synack_seen = False
        self.midstream = False


def _restart(flow, next_seq):
    """Move the stream to next_seq; pos moves by the same signed distance, so that the stream offsets of
    the segments held stay those of their sequence numbers."""
    if flow.next_seq is not None:
        jump = (next_seq - flow.next_seq) % SEQ_MOD
        flow.pos += jump - SEQ_MOD if jump >= SEQ_HALF else jump
    flow.next_seq = next_seq


class TcpReassembler:
    """Turns TCP segments into whole DNS messages.

    segment() returns a list of (message bytes, first ts, summed frame lengths, ttl, rtt_ms).
    """

    def __init__(self, idle_timeout_ns, max_flows, max_ooo_bytes, max_ooo_segments, stats, max_bytes=None):
        self.idle_timeout_ns = idle_timeout_ns
        self.max_bytes = max_bytes  # None: no bound over all directions
        self.held = 0  # bytes held over all directions: messages in progress and segments ahead of a gap
        self.max_flows = max_flows
        self.max_ooo_bytes = max_ooo_bytes
        self.max_ooo_segments = max_ooo_segments
        self.stats = stats
        self.flows = {}  # (src, sport, dst, dport) -> _Flow

    def _new_flow(self, key, ts):
        if len(self.flows) >= self.max_flows:
            self._drop(next(iter(self.flows)))
            self.stats.tcp_evicted += 1
        flow = self.flows[key] = _Flow(ts)
        self.stats.tcp_streams += 1
        return flow

    def _drop(self, key):
        flow = self.flows.pop(key)
        lost = len(flow.buf) + flow.ooo_bytes
        self.held -= lost
        self.stats.tcp_dropped_bytes += lost

    def segment(self, key, ts, wirelen, ttl, seq, flags, payload):
        out = self._segment(key, ts, wirelen, ttl, seq, flags, payload)
        if self.max_bytes is not None and self.held > self.max_bytes:
            # Over the bound of all directions: the oldest go first (the one just added to last).
            while self.held > self.max_bytes and self.flows:
                self._drop(next(iter(self.flows)))
                self.stats.tcp_evicted += 1
        return out

    def _segment(self, key, ts, wirelen, ttl, seq, flags, payload):
        stats = self.stats
        stats.tcp_segments += 1
        flow = self.flows.get(key)
        if flags & RST:
            out = []
            if flow is not None and payload:
                out = self._data(flow, ts, wirelen, ttl, seq, payload)
            for k in (key, (key[2], key[3], key[0], key[1])):
                if k in self.flows:
                    self._drop(k)
            return out
        if flags & SYN:
            if flow is None or flow.next_seq is not None and flow.buf:
                if flow is not None:
                    self._drop(key)
                flow = self._new_flow(key, ts)
            if not payload or flow.next_seq is None:
                # (A retransmitted SYN carrying data keeps its place, so the data is seen as a duplicate.)
                _restart(flow, (seq + 1) % SEQ_MOD)
            flow.last_ts = ts
            if flags & ACK:
                # SYN/ACK from the server: the client's handshake clock keeps running.
                peer = self.flows.get((key[2], key[3], key[0], key[1]))
                if peer is not None:
                    peer.synack_seen = True
            else:
                flow.syn_ts = ts
            if payload:
                # TCP Fast Open (RFC 7413): data on the SYN, its first byte at ISN + 1.
                return self._data(flow, ts, wirelen, ttl, (seq + 1) % SEQ_MOD, payload)
            return []
        if flow is None:
            if not payload:
                return []
            flow = self._new_flow(key, ts)
            flow.midstream = True
        if flow.syn_ts is not None and flow.synack_seen and flow.rtt_ms is None and flags & ACK:
            # Client's ACK completing the handshake: RTT = SYN → this ACK, in milliseconds.
            flow.rtt_ms = (ts - flow.syn_ts) / 1e6
            peer = self.flows.get((key[2], key[3], key[0], key[1]))
            if peer is not None:
                peer.rtt_ms = flow.rtt_ms
        out = self._data(flow, ts, wirelen, ttl, seq, payload) if payload else []
        if flags & FIN and key in self.flows:
            self._drop(key)
        return out

    def _data(self, flow, ts, wirelen, ttl, seq, payload):
        flow.last_ts = ts
        if flow.next_seq is None:
            flow.next_seq = seq
        delta = (seq - flow.next_seq) % SEQ_MOD
        if delta >= SEQ_HALF:
            # Starts before what we have: a retransmission, possibly carrying new bytes at its end.
            behind = SEQ_MOD - delta
            if behind >= len(payload):
                self.stats.tcp_retransmitted += 1
                return []
            payload = payload[behind:]
        elif delta:
            # Ahead of a gap: hold it (bounded) until the gap is filled.
            offset = flow.pos + delta
            if offset in flow.ooo:
                self.stats.tcp_retransmitted += 1
            elif (flow.ooo_bytes + len(payload) > self.max_ooo_bytes
                  or len(flow.ooo) >= self.max_ooo_segments):
                self.stats.tcp_ooo_dropped += 1
                self.stats.tcp_dropped_bytes += len(payload)
            else:
                flow.ooo[offset] = (payload, ts, wirelen, ttl)
                heapq.heappush(flow.ooo_heap, offset)
                flow.ooo_bytes += len(payload)
                self.held += len(payload)
                self.stats.tcp_out_of_order += 1
            return []
        out = []
        self._append(flow, ts, wirelen, ttl, payload, out)
        # Release held segments the stream has reached, in stream order; a segment the stream has
        # overtaken gives only its bytes beyond what is there (the first arrival wins).
        heap = flow.ooo_heap
        while heap and heap[0] <= flow.pos:
            offset = heapq.heappop(heap)
            data, s_ts, s_wl, s_ttl = flow.ooo.pop(offset)
            flow.ooo_bytes -= len(data)
            self.held -= len(data)
            behind = flow.pos - offset
            if behind < len(data):
                self._append(flow, s_ts, s_wl, s_ttl, data[behind:] if behind else data, out)
            else:
                self.stats.tcp_retransmitted += 1
        return out

    def _append(self, flow, ts, wirelen, ttl, payload, out):
        flow.next_seq = (flow.next_seq + len(payload)) % SEQ_MOD
        flow.pos += len(payload)
        buf = flow.buf
        self.held -= len(buf)
        if buf:
            flow.msg_wirelen += wirelen  # this segment carries more of the message in progress
            buf += payload
        else:
            flow.msg_ts, flow.msg_wirelen, flow.msg_ttl = ts, wirelen, ttl
            buf = payload
        while len(buf) >= 2:
            mlen = (buf[0] << 8) | buf[1]
            if flow.midstream and mlen < 12:
                # First seen mid-stream and this is not a message boundary: skip to the next segment.
                self.stats.tcp_resync += 1
                self.stats.tcp_dropped_bytes += len(buf)
                buf = b""
                break
            if len(buf) < mlen + 2:
                break
            summed = cap_int32(flow.msg_wirelen, self.stats)
            out.append((buf[2 : mlen + 2], flow.msg_ts, summed, flow.msg_ttl, flow.rtt_ms))
            flow.midstream = False
            buf = buf[mlen + 2 :]
            # The rest of this segment starts the next message: its frames so far are this segment's only.
            flow.msg_ts, flow.msg_wirelen, flow.msg_ttl = ts, wirelen, ttl
        flow.buf = buf
        self.held += len(buf)

    def expire(self, now_ns):
        cutoff = now_ns - self.idle_timeout_ns
        for key in [k for k, f in self.flows.items() if f.last_ts < cutoff]:
            self._drop(key)

    def flush(self):
        for key in list(self.flows):
            self._drop(key)

    @property
    def flow_count(self):
        return len(self.flows)

    def flows_state(self):
        """Each direction's state, oldest first, as the C twin gives it (what the differential tests compare)."""
        return [
            (key, f.next_seq, f.pos, len(f.buf), f.ooo_bytes, sorted(f.ooo), f.midstream, f.rtt_ms, f.syn_ts,
             f.synack_seen, f.last_ts, f.msg_ts, f.msg_wirelen, f.msg_ttl)
            for key, f in self.flows.items()
        ]
