"""TCP segment sequences through the stream step (probe.decode.tcpstream; Python only, no C twin). Each
6-byte step: flags, direction, a 16-bit sequence offset, a payload length and a payload byte. Findings: an
exception, or a bound broken (segments and bytes held ahead of a gap, streams held, bytes held in all)."""

from harness import run

from probe.decode.tcpstream import TcpReassembler
from probe.stats import Stats

KEYS = (("192.0.2.1", 40000, "198.51.100.53", 53), ("198.51.100.53", 53, "192.0.2.1", 40000))
MAX_SEGMENTS, MAX_BYTES, MAX_FLOWS, MAX_TOTAL = 8, 64, 2, 100


def one_input(data):
    stats = Stats()
    tcp = TcpReassembler(10**9, MAX_FLOWS, MAX_BYTES, MAX_SEGMENTS, stats, max_bytes=MAX_TOTAL)
    for i in range(0, len(data) - 5, 6):
        flags, direction, off_hi, off_lo, length, fill = data[i : i + 6]
        seq = (0xFFFFFF00 + (off_hi << 8 | off_lo)) % (1 << 32)  # near the wrap
        payload = bytes((fill + k) % 256 for k in range(length % 48))
        for msg, *_ in tcp.segment(KEYS[direction & 1], i, 60 + len(payload), 64, seq, flags & 0x17, payload):
            assert len(msg) <= 65535
        assert len(tcp.flows) <= MAX_FLOWS
        assert tcp.held == sum(len(f.buf) + f.ooo_bytes for f in tcp.flows.values()) <= MAX_TOTAL
        for flow in tcp.flows.values():
            assert len(flow.ooo) <= MAX_SEGMENTS and flow.ooo_bytes <= MAX_BYTES
            assert flow.ooo_bytes == sum(len(v[0]) for v in flow.ooo.values())
            assert sorted(flow.ooo_heap) == sorted(flow.ooo)
    tcp.flush()


if __name__ == "__main__":
    run(one_input)
