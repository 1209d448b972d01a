"""DPDK's mbuf-to-frame code (probe.capture._dpdk add_frames, what Poller.read runs on every burst) through its
test hook frames_from_mbufs, without the EAL or a device: the fuzz bytes are mbuf chains as a device could give
them, a frame cut into 1 to 16 segments (empty ones too), a pkt_len equal to what the segments hold, above it or
below it (a device that says more than its segments hold: the frame must be what they hold, and nothing past them
read), its VLAN tag taken off or not, an indirect mbuf or not; in two bursts into one Frames. The segments are
let go of before the frames are read, so that ASan sees a frame that points into memory its Frames does not hold.
Compared with what the frame is: the bytes of the segments up to pkt_len, the tag put back after the MAC
addresses (as AF_PACKET's frames are read), the wire length pkt_len.

Input: a byte (the burst split), then per frame a header of 5 bytes (flags: bit 0 tag taken off, bit 1 indirect,
bits 2-3 how pkt_len is made, bits 4-7 segments - 1; two bytes of a length change or a VLAN TCI; two of the
frame's length), a byte per cut between segments (where, in 256ths of the frame), and the frame's bytes."""

import struct

from harness import check, run

from probe import _records
from probe.capture import _dpdk


def parse(data):
    """The fuzz bytes as mbuf items (segments, pkt_len, ts_ns, vlan_tci or -1, indirect)."""
    items, pos = [], 1
    while pos + 5 <= len(data):
        flags, change, length = data[pos], *struct.unpack_from("!HH", data, pos + 1)
        nseg = (flags >> 4) + 1
        cuts = sorted(b * length // 256 for b in data[pos + 5 : pos + 4 + nseg])
        pos += 4 + nseg
        frame = data[pos : pos + length]
        pos += length
        bounds = [0, *cuts, len(frame)]
        segments = tuple(frame[a:b] for a, b in zip(bounds, bounds[1:], strict=False))
        held = sum(map(len, segments))
        pkt_len = (held, held + change, max(0, held - change), change)[flags >> 2 & 3]
        vlan = change & 0xFFFF if flags & 1 else -1
        items.append((segments, pkt_len, 1_700_000_000 * 10**9 + len(items), vlan, bool(flags & 2)))
    return items


def expected(items):
    """What each frame is: (ts_ns, wirelen, data), a tag taken off put back after the MAC addresses."""
    ts, wirelen, frames = [], [], []
    for segments, pkt_len, t, vlan, _ in items:
        frame = b"".join(segments)[:pkt_len]
        tagged = vlan >= 0 and len(frame) >= 12
        if tagged:
            frame = frame[:12] + struct.pack("!HH", 0x8100, vlan) + frame[12:]
        ts.append(t)
        wirelen.append(pkt_len + 4 if tagged else pkt_len)
        frames.append(frame)
    return ts, wirelen, frames


def one_input(data):
    if not data:
        return
    items = parse(data)
    want = expected(items)
    split = data[0] % (len(items) + 1)
    frames = _records.Frames()
    # Copies of the segments, so that only the frames hold them once the hook returned.
    first = [(tuple(bytes(bytearray(s)) for s in it[0]), *it[1:]) for it in items[:split]]
    second = [(tuple(bytes(bytearray(s)) for s in it[0]), *it[1:]) for it in items[split:]]
    n = _dpdk.frames_from_mbufs(first, frames) + _dpdk.frames_from_mbufs(second, frames)
    del first, second
    check(n == len(items) == len(frames), "frame count", data, (n, len(frames)), len(items))
    got = frames.lists()
    check(got == want, "frames", data, got, want)


if __name__ == "__main__":
    run(one_input)
