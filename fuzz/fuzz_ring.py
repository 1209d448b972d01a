"""AF_PACKET ring blocks through the C block walker (probe.capture._ring, AfPacketSource.read) and its Python
twin (AfPacketSource.read_python), on a bytes buffer laid out as a TPACKET_V3 ring: no kernel, the fuzz bytes
are the blocks (headers, frame headers, frames). The first bytes pick the block count, the block to start at and
the frame limit; each block's status word is set from a bit of them (ready or not) so that most inputs walk.
Equal frames (times, wire lengths, bytes, VLAN tags put back), equal ring afterwards (the blocks given back),
equal position, sequence number and frame count, and the same first frames set aside (join_overlap, a count from
the first bytes too)."""

from harness import check, run

from probe.capture import afpacket

assert afpacket._ring is not None, "probe.capture._ring is not built"

BLOCK = 512  # small blocks: the fuzz bytes fill them


def source(ring, blocks, next_block, overlap):
    src = object.__new__(afpacket.AfPacketSource)
    src.ring, src.block_size, src.block_count = ring, BLOCK, blocks
    src.next_block, src.last_seq, src.frames = next_block, 0, 0
    src.overlap, src.join_overlap = overlap, 0  # the first frames to set aside (received before a fanout join)
    return src


def one_input(data):
    if len(data) < 3:
        return
    blocks, ready, limit, overlap = data[0] % 4 + 1, data[1], (1, 2, 5, 4096)[data[2] % 4], data[2] >> 5
    start = (data[0] >> 2) % blocks
    ring = bytearray(data[3 : 3 + BLOCK * blocks].ljust(BLOCK * blocks, b"\0"))
    for b in range(blocks):  # the status word: the kernel's own values, a bit of data[1] each
        ring[b * BLOCK + 8 : b * BLOCK + 12] = (1 if ready >> b & 1 else 0).to_bytes(4, "little")
    c, py = source(bytearray(ring), blocks, start, overlap), source(bytearray(ring), blocks, start, overlap)
    for _ in range(2):
        got = c.read(limit)
        want = py.read_python(limit)
        want = py.set_overlap_aside(want) if py.overlap else want
        a, b = (got.ts_ns, got.wirelen, got.data), (want.ts_ns, want.wirelen, want.data)
        check(a == b, "frames", data, a, b)
        a = (c.next_block, c.last_seq, c.frames, c.overlap, c.join_overlap)
        b = (py.next_block, py.last_seq, py.frames, py.overlap, py.join_overlap)
        check(a == b, "ring position", data, a, b)
        check(c.ring == py.ring, "ring given back", data, c.ring, py.ring)


if __name__ == "__main__":
    run(one_input)
