"""TCP segment sequences through the stream step's C twin (probe.decode._tcpstream) and its Python reference
(probe.decode.tcpstream), side by side. Each 6-byte step: flags, direction, a 16-bit sequence offset, a payload
length and a payload byte; flags bit 0x80 makes the step an expiry instead, bit 0x40 a frame length over 2^30 (the
sum's cap). Findings: an exception, a difference between the twins after any call (messages, counters, bytes held,
the state of each direction), or a bound broken (segments and bytes held ahead of a gap, directions held, bytes
held in all)."""

from harness import check, run, typed

from probe.decode.tcpstream import TcpReassembler
from probe.native import import_error, load
from probe.stats import Stats

_tcpstream = load("probe.decode._tcpstream")
assert _tcpstream is not None, f"probe.decode._tcpstream is not built: {import_error('probe.decode._tcpstream')}"

C, S, C2 = b"\xc0\x00\x02\x01", b"\xc6\x33\x64\x35", b"\x20\x01\x0d\xb8" + bytes(11) + b"\x01"
# two connections (the second over IPv6 addresses), both directions of each
KEYS = ((C, 40000, S, 53), (S, 53, C, 40000), (C2, 40001, S, 53), (S, 53, C2, 40001))
MAX_SEGMENTS, MAX_BYTES, MAX_FLOWS, MAX_TOTAL, IDLE = 8, 64, 2, 100, 50


def same(data, what, py, c, py_stats, c_stats, got, want):
    check(typed(got) == typed(want), what + ": output", data, got, want)
    check(c_stats.as_dict() == py_stats.as_dict(), what + ": counters", data, c_stats.as_dict(), py_stats.as_dict())
    check(c.held == py.held, what + ": bytes held", data, c.held, py.held)
    c_state, py_state = c.flows_state(), py.flows_state()
    check(typed(c_state) == typed(py_state), what + ": directions", data, c_state, py_state)
    return c_state


def one_input(data):
    py_stats, c_stats = Stats(), Stats()
    py = TcpReassembler(IDLE, MAX_FLOWS, MAX_BYTES, MAX_SEGMENTS, py_stats, max_bytes=MAX_TOTAL)
    c = _tcpstream.TcpReassembler(IDLE, MAX_FLOWS, MAX_BYTES, MAX_SEGMENTS, c_stats, max_bytes=MAX_TOTAL)
    for i in range(0, len(data) - 5, 6):
        flags, direction, off_hi, off_lo, length, fill = data[i : i + 6]
        if flags & 0x80:
            state = same(data, f"expire at {i}", py, c, py_stats, c_stats, c.expire(i), py.expire(i))
        else:
            seq = (0xFFFFFF00 + (off_hi << 8 | off_lo)) % (1 << 32)  # near the wrap
            payload = bytes((fill + k) % 256 for k in range(length % 48))
            wirelen = (1 << 30) + len(payload) if flags & 0x40 else 60 + len(payload)
            args = (KEYS[direction & 3], i, wirelen, 64, seq, flags & 0x17, payload)
            got = c.segment(*args)
            state = same(data, f"segment at {i}", py, c, py_stats, c_stats, got, py.segment(*args))
            for msg, *_ in got:
                assert len(msg) <= 65535
        assert len(state) <= MAX_FLOWS
        assert c.held == sum(s[3] + s[4] for s in state) <= MAX_TOTAL
        for s in state:
            assert len(s[5]) <= MAX_SEGMENTS and s[4] <= MAX_BYTES and s[3] <= 65537
        for flow in py.flows.values():  # the reference's own bookkeeping
            assert flow.ooo_bytes == sum(len(v[0]) for v in flow.ooo.values())
            assert sorted(flow.ooo_heap) == sorted(flow.ooo)
    same(data, "flush", py, c, py_stats, c_stats, c.flush(), py.flush())


if __name__ == "__main__":
    run(one_input)
