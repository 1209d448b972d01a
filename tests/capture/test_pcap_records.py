"""The C pcap record splitter (probe.capture._pcaprecords.split_packed) against the Python reference
(probe.capture.pcapfile.split_records): same frames, timestamps, lengths, positions and errors."""

import random
import struct

import pytest
from support.dnsprobe import run_dnsprobe
from support.pcap_records import CAPTURES, list_split, load, packed_split, to_big_endian

from probe.capture import _pcaprecords, pcapfile
from probe.errors import CaptureFileError


def both(buf, pos, big, ts_mult, limit):
    return [packed_split(buf, pos, big, ts_mult, limit), list_split(buf, pos, big, ts_mult, limit)]


def test_captures_found():
    assert len(CAPTURES) >= 5, CAPTURES


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_c_equals_python_on_captures(path):
    raw = load(path)
    ts_mult = 1000 if raw[:4] == b"\xd4\xc3\xb2\xa1" else 1
    body = raw[24:]
    for buf, big in ((body, False), (to_big_endian(body), True)):
        (c_res, c_lists), (py_res, py_lists) = both(buf, 0, big, ts_mult, 10**9)
        assert c_res == py_res == (len(buf), 0)
        assert c_lists == py_lists and len(c_lists[2]) >= 2
        # Small limits and cuts in the middle of records stop at the same place.
        rng = random.Random(7)
        for _ in range(200):
            cut = rng.randrange(len(buf) + 1)
            pos = min(cut, rng.choice([0, 0, 16 + len(c_lists[2][0])]))
            (c_res, c_lists2), (py_res, py_lists2) = both(buf[:cut], pos, big, ts_mult, rng.randrange(1, 50))
            assert c_res == py_res and c_lists2 == py_lists2


@pytest.mark.parametrize(
    "caplen, wirelen",
    [(0x40001, 0x40001), (0x40000 + 61, 60), (0xFFFFFFFF, 10), (4, 0x80000000), (4, 0xFFFFFF51)],
)
def test_impossible_lengths_are_reported_at_their_record(caplen, wirelen):
    good = struct.pack("<IIII", 1, 2, 4, 4) + b"abcd"
    bad = struct.pack("<IIII", 1, 2, caplen, wirelen) + b"x" * 64
    buf = good * 3 + bad
    (c_res, c_lists), (py_res, py_lists) = both(buf, 0, False, 1000, 100)
    assert c_res == py_res == (3 * len(good), 1)
    assert c_lists == py_lists == ([1_000_002_000] * 3, [4] * 3, [b"abcd"] * 3)


def test_largest_original_length_is_kept():
    # 2^31 - 1 still fits the int32 length columns; one more is refused (test above).
    rec = struct.pack("<IIII", 1, 2, 4, 0x7FFFFFFF) + b"abcd"
    (c_res, c_lists), (py_res, py_lists) = both(rec * 2, 0, False, 1000, 100)
    assert c_res == py_res == (2 * len(rec), 0)
    assert c_lists == py_lists and c_lists[1] == [0x7FFFFFFF] * 2


def test_bad_arguments():
    for split in (packed_split, list_split):
        with pytest.raises(ValueError):
            split(b"", 5, False, 1, 10)
    with pytest.raises(TypeError):
        _pcaprecords.split_packed(b"", 0, False, 1, 10, [])


@pytest.mark.parametrize("splitter", ["c", "python"])
def test_a_pcap_of_only_its_header_has_no_frames(tmp_path, splitter, monkeypatch):
    # What tcpdump leaves when it captured nothing. Found by fuzzing (fuzz/fuzz_pcap.py): the reader ended in
    # an UnboundLocalError, and `dnsprobe read` with a traceback.
    path = tmp_path / "empty.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    if splitter == "python":
        monkeypatch.setattr(pcapfile, "_pcaprecords", None)  # the reader's own choice when the C one is missing
    assert list(pcapfile.read_capture(path)) == []
    out = tmp_path / "out"
    out.mkdir()
    proc = run_dnsprobe("read", path, "-o", out, "-q", "--no-progress")
    assert "Traceback" not in proc.stderr


# Found by fuzzing (fuzz/fuzz_pcap.py): an interface description block whose if_tsresol option (length 1) runs
# past the end of the block ended the reader in an IndexError, and `dnsprobe read` with a traceback.
IDB_OPTION_PAST_END = bytes.fromhex(
    "0a0d0d0a640000004d3c2b1a01000000ffffffffffffffff01002b0053616e6974697a65642062792054726163655772"
    "616e676c65722076302e362e30206275696c64203737380004000d004564697463617020322e302e3200000000000000"
    "640000000100000020000000000000000000000401000000ffff00000900010034020000000000006d0000000000"
)


def test_an_interface_option_running_past_its_block_is_a_clear_error(tmp_path):
    path = tmp_path / "idb.pcapng"
    path.write_bytes(IDB_OPTION_PAST_END)
    with pytest.raises(CaptureFileError, match="corrupt interface description block at byte 100: an option"):
        list(pcapfile.read_capture(path))
    out = tmp_path / "out"
    out.mkdir()
    proc = run_dnsprobe("read", path, "-o", out, "-q", "--no-progress", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("an option runs past its end"), proc.stderr
