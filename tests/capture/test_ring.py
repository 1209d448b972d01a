"""The C ring reader (probe.capture._ring, AfPacketSource.read) against the Python reference (read_python):
the same frames (times, wire lengths, bytes, VLAN tags the kernel took off put back), the same blocks handed
back to the kernel and the same ring position and sequence number, on rings laid out as the kernel lays out
TPACKET_V3 blocks (struct tpacket_block_desc, tpacket3_hdr), with blocks ready and not, partly read rings,
frame limits, and a block length the header gets wrong."""

import random
import struct
import sys

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
    src.overlap = src.join_overlap = 0
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


@pytest.mark.parametrize("twin", ["c", "python"])
def test_the_frames_before_the_fanout_join_are_set_aside_and_counted(twin, monkeypatch):
    """written() counts the frames of the handed-over blocks and of the one the kernel fills (the first not
    handed over); read() then leaves out that many of the ring's first frames, across reads and blocks, and
    counts them in join_overlap instead of frames."""
    if twin == "python":
        monkeypatch.setattr(afpacket, "_ring", None)
    rng = random.Random(7)
    ring = make_ring(rng, 4, {0, 1})
    nums = [struct.unpack_from("<I", ring, b * BLOCK + 12)[0] for b in range(4)]
    whole = source(bytearray(ring), 4, 0).read_python(4096)
    src = source(ring, 4, 0)
    assert src.written() == nums[0] + nums[1] + nums[2]
    src.overlap = nums[0] + 3  # into the second block
    first = src.read(1)  # one block
    assert first.data == [] and (src.overlap, src.join_overlap, src.frames) == (3, nums[0], 0)
    rest = src.read(4096)
    assert rest.data == whole.data[nums[0] + 3 :] and rest.ts_ns == whole.ts_ns[nums[0] + 3 :]
    assert (src.overlap, src.join_overlap, src.frames) == (0, nums[0] + 3, nums[1] - 3)


def one_block(frames, num=None, blen=None):
    """A ring of one ready block holding `frames`, (header fields as a dict, frame bytes), every 176 bytes from
    byte 48 on, whatever their next offset says; num and blen as the block header gives them (default: as laid
    out)."""
    ring = bytearray(BLOCK)
    pos = 48
    for fields, data in frames:
        f = {"next": 0, "sec": 1, "nsec": 2, "snaplen": len(data), "len": len(data), "status": 0, "mac": 66,
             "tci": 0, "tpid": 0, **fields}
        struct.pack_into("<IIIIIIHHIIH", ring, pos, f["next"], f["sec"], f["nsec"], f["snaplen"], f["len"],
                         f["status"], f["mac"], f["mac"], 0, f["tci"], f["tpid"])
        ring[pos + f["mac"] : pos + f["mac"] + len(data)] = data
        pos += 176
    struct.pack_into("<IIIIQ", ring, 8, TP_STATUS_USER, len(frames) if num is None else num, 48,
                     BLOCK if blen is None else blen, 7)
    return ring


def read_both(ring):
    """The frames the C reader and the Python reference take from the ring: equal, and the state after."""
    c, py = source(bytearray(ring), 1, 0), source(bytearray(ring), 1, 0)
    got, want = c.read(4096), py.read_python(4096)
    assert (got.ts_ns, got.wirelen, got.data) == (want.ts_ns, want.wirelen, want.data)
    assert (c.next_block, c.last_seq, c.frames) == (py.next_block, py.last_seq, py.frames)
    assert c.ring == py.ring
    return want


# Found by fuzz/fuzz_ring.py: blocks the kernel never writes, each read the same way by both, and within bounds.


def test_a_count_past_its_frames_does_not_repeat_a_frame():
    """A block header claiming 2^32-1 frames, the frame's next offset 0: before, the C walker added the same frame
    until memory ran out and the Python one looped 2^32 times; a next offset shorter than a frame header ends the
    walk."""
    frame = bytes(range(60))
    batch = read_both(one_block([({"next": 0}, frame)], num=0xFFFFFFFF))
    assert batch.data == [frame]
    batch = read_both(one_block([({"next": 20}, frame), ({}, frame)], num=2))
    assert batch.data == [frame]


def test_frames_past_the_block_end_the_walk():
    """A frame header or bytes beyond the block's length: the Python reference raised struct.error or gave the
    cut bytes; both now stop at that frame."""
    frame = bytes(range(100))
    two = [({"next": 176}, frame), ({}, frame)]
    assert read_both(one_block(two)).data == [frame, frame]
    assert read_both(one_block(two, blen=48 + 176 + 30)).data == [frame]
    assert read_both(one_block(two, blen=48 + 176 + 66 + 50)).data == [frame]
    assert read_both(one_block([({"snaplen": BLOCK}, frame)])).data == []


def test_vlan_tag_fields_as_the_kernel_gives_them():
    """tp_vlan_tci is 32 bits wide (the Python reference packed it into 16 and raised); a tag is put back only
    into a frame of at least 12 bytes (the Python reference put it into shorter ones, C did not); a wire length
    near 2^32 with a tag put back is 4 more, not wrapped (probe._records.Frames.lists did)."""
    vlan = {"status": 1 << 4}
    frame = bytes(range(40))
    batch = read_both(one_block([({**vlan, "next": 176, "tci": 0xABCD0064}, frame), ({**vlan, "next": 176}, b"short"),
                                 ({**vlan, "len": 0xFFFFFFFE}, frame)]))
    assert batch.data == [frame[:12] + b"\x81\x00\x00\x64" + frame[12:], b"short",
                          frame[:12] + b"\x81\x00\x00\x00" + frame[12:]]
    assert batch.wirelen == [44, 5, 0xFFFFFFFE + 4]


# Found by review (issue 32): sizes the kernel never gives, refused instead of read with undefined behaviour.


@pytest.mark.parametrize("block_size, block_count", [(1 << 62, 4), (sys.maxsize, 2), (BLOCK + 2, 2), (34, 2)])
def test_ring_sizes_that_overflow_or_misalign_are_refused(block_size, block_count):
    """block_size * block_count overflowed (wrapped to 0 it passed the bounds check; the next block was read
    2^62 bytes away); a block size not a multiple of 4 put the next block's status word, read atomically, off
    its alignment (the kernel's blocks are whole pages)."""
    from probe import _records

    ring = one_block([({}, bytes(60))]) + bytearray(BLOCK + 8)  # the first block ready: the reader goes on
    with pytest.raises(ValueError):
        afpacket._ring.read_blocks(ring, 0, block_size, block_count, 4096, _records.Frames())
    with pytest.raises(ValueError, match="multiples of 4"):
        afpacket._ring.read_blocks(memoryview(bytearray(BLOCK + 1))[1:], 0, BLOCK, 1, 4096, _records.Frames())
