"""The C ring reader (probe.capture._ring, AfPacketSource.read) against the Python reference (read_python):
the same frames (times, wire lengths, bytes, VLAN tags the kernel took off put back), the same blocks handed
back to the kernel and the same ring position and sequence number, on rings laid out as the kernel lays out
TPACKET_V3 blocks (struct tpacket_block_desc, tpacket3_hdr), with blocks ready and not, partly read rings,
frame limits, and a block length the header gets wrong."""

import random
import struct

import pytest

from probe.capture import afpacket

BLOCK = 4096
TP_STATUS_USER, VLAN_VALID, TPID_VALID = 1, 1 << 4, 1 << 6


def frame_bytes(rng):
    return bytes(rng.randrange(256) for _ in range(rng.randrange(14, 300)))


def make_ring(rng, blocks, ready):
    """A ring of `blocks` blocks; those in `ready` handed to user space, filled with random frames."""
    ring = bytearray(BLOCK * blocks)
    for b in range(blocks):
        off = b * BLOCK
        pos, num = 48, 0
        while True:
            data = frame_bytes(rng)
            mac = 66  # (tp_mac: after the header and sockaddr_ll, as the kernel places it)
            size = (mac + len(data) + 15) & ~15
            if pos + size > BLOCK:
                break
            status = rng.choice((0, VLAN_VALID, VLAN_VALID | TPID_VALID))
            tpid = rng.choice((0, 0x88A8, 0x8100))
            struct.pack_into("<IIIIIIHHIIH", ring, off + pos, size, rng.randrange(1 << 32), rng.randrange(10**9),
                             len(data), len(data) + rng.randrange(3), status, mac, mac, 0, rng.randrange(1 << 16),
                             tpid)
            ring[off + pos + mac : off + pos + mac + len(data)] = data
            pos += size
            num += 1
        blen = pos if rng.random() < 0.9 else BLOCK + 5  # a wrong length: the reader reads the whole block
        struct.pack_into("<IIIIQ", ring, off + 8, TP_STATUS_USER if b in ready else 0, num, 48, blen, 100 + b)
    return ring


def source(ring, blocks, next_block):
    src = object.__new__(afpacket.AfPacketSource)
    src.ring, src.block_size, src.block_count = ring, BLOCK, blocks
    src.next_block, src.last_seq, src.frames = next_block, 0, 0
    return src


def test_extension_is_built():
    assert afpacket._ring is not None


@pytest.mark.parametrize("seed", range(12))
def test_c_equals_python(seed):
    rng = random.Random(seed)
    blocks = rng.randrange(1, 9)
    ready = {b for b in range(blocks) if rng.random() < 0.7}
    ring = make_ring(rng, blocks, ready)
    start = rng.randrange(blocks)
    limit = rng.choice((1, 30, 4096))
    c, py = source(bytearray(ring), blocks, start), source(bytearray(ring), blocks, start)
    for _ in range(3):  # several reads: the second and third find blocks given back, or none
        got, want = c.read(limit), py.read_python(limit)
        assert got.packed is not None and want.packed is None
        assert (got.ts_ns, got.wirelen, got.data) == (want.ts_ns, want.wirelen, want.data)
        assert (c.next_block, c.last_seq, c.frames) == (py.next_block, py.last_seq, py.frames)
        assert c.ring == py.ring  # the same blocks handed back
    assert c.frames > 0 or not ready or start not in ready
