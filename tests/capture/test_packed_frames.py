"""Packed frames (FrameBatch.packed, a probe._records.Frames: no object per frame) against the frame lists.

- read_capture yields packed batches whose lists are those of a reader without them.
- With a read worker's share, split_packed keeps the frames _decoderec.select_share keeps of the whole split, and
  says how many records it took and the last one's time; read_capture's shared batches end where the whole
  batches end and hold, in order, what select_share keeps of them.
- A frame whose VLAN tag the kernel took off (tag given beside it) reads back with the tag at offset 12 and 4
  bytes more on the wire, as the Python ring reader rebuilds it.
"""

import struct

import pytest
from support.pcap_records import CAPTURES, load

from probe import _records
from probe.capture import _pcaprecords, pcapfile
from probe.decode import _decoderec
from probe.model import FrameBatch


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_read_capture_packed_equals_lists(path, monkeypatch):
    packed = list(pcapfile.read_capture(path, 7))
    assert packed and all(b.packed is not None for b in packed)
    monkeypatch.setattr(pcapfile, "_records", None)
    lists = list(pcapfile.read_capture(path, 7))
    assert all(b.packed is None for b in lists)
    assert [(b.linktype, b.ts_ns, b.wirelen, b.data) for b in packed] == [
        (b.linktype, b.ts_ns, b.wirelen, b.data) for b in lists
    ]
    assert [len(b) for b in packed] == [len(b) for b in lists]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_a_share_keeps_what_select_share_keeps(path):
    raw = load(path)
    ts_mult = 1000 if raw[:4] == b"\xd4\xc3\xb2\xa1" else 1
    linktype = struct.unpack_from("<I", raw, 20)[0] & 0x0FFFFFFF
    body = raw[24:]
    for limit in (1, 3, 10**9):
        whole = _records.Frames()
        pos, status = _pcaprecords.split_packed(body, 0, False, ts_mult, limit, whole)
        taken = len(whole)
        last_ts = whole.last_ts() if taken else 0
        for n in (1, 2, 3):
            for k in range(n):
                mine = _records.Frames()
                got = _pcaprecords.split_packed(body, 0, False, ts_mult, limit, mine, linktype, k, n)
                assert got == (pos, status, taken, last_ts)
                assert mine.lists() == _decoderec.select_share(whole, linktype, k, n).lists()
    with pytest.raises(ValueError):
        _pcaprecords.split_packed(body, 0, False, ts_mult, 10, _records.Frames(), linktype, 2, 2)


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_read_capture_with_a_share_keeps_its_frames_of_each_batch(path):
    whole = list(pcapfile.read_capture(path, 7))
    for n in (2, 3):
        kept = 0
        for k in range(n):
            batches = list(pcapfile.read_capture(path, 7, share=(k, n)))
            assert [b.frames_read() for b in batches] == [len(b) for b in whole]
            assert [b.last_ts() for b in batches] == [b.last_ts() for b in whole]
            for mine, all_ in zip(batches, whole, strict=True):
                assert mine.share == (k, n)
                assert mine.packed.lists() == _decoderec.select_share(all_.packed, all_.linktype, k, n).lists()
                kept += len(mine)
        assert kept == sum(len(b) for b in whole)


def test_taken_off_tag_is_put_back():
    frame = bytes(range(12)) + b"\x08\x00" + b"payload"
    frames = _records.Frames()
    frames.add(frame, 5, 100, 0x8100_2064)  # TPID 0x8100, PCP 1, VID 100
    frames.add(frame, 6, 100)
    frames.add(b"short", 7, 5, 0x8100_0001)  # under 12 bytes: left as it is
    ts, wl, data = frames.lists()
    assert ts == [5, 6, 7] and wl == [104, 100, 5]
    assert data == [frame[:12] + b"\x81\x00\x20\x64" + frame[12:], frame, b"short"]
    batch = FrameBatch(1, packed=frames)
    assert len(batch) == 3 and batch.last_ts() == 7 and batch.data == data
