"""Bad input: each case gives a clear message naming the file and the problem, the documented exit
status and no traceback; whatever was decoded before the problem is still written."""

import json
import lzma
import os
import shutil
import struct
import subprocess

import pytest
from support.data import DNSPROBE_DATA, needs_shared
from support.dnsprobe import read_output, run_dnsprobe

PCAP = DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap"  # pcapng, 184 packets, 92 transactions
TCP_PCAP = DNSPROBE_DATA / "test_pcaps" / "tcp_simple.pcap"  # classic pcap


def _fails(out_dir, path, status, *needles):
    proc = run_dnsprobe("read", path, "-o", out_dir, "-q", check=False)
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in (str(path),) + needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return proc


def test_empty_file(tmp_path, out_dir):
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    _fails(out_dir, empty, 1, "empty file")


def test_garbage_file(tmp_path, out_dir):
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(os.urandom(64).replace(b"\n", b"x") + b"this is not a capture")
    junk.write_bytes(b"GARBAGE!" + junk.read_bytes())
    _fails(out_dir, junk, 1, "not a pcap, pcapng or dnstap file")


@needs_shared
def test_truncated_pcap_keeps_what_was_decoded(tmp_path, out_dir):
    data = TCP_PCAP.read_bytes()
    pos = 24
    for _ in range(15):  # skip frames 1-15; frame 16 is the aol.com response
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[: pos + 60])  # frame 16 loses its end
    _fails(out_dir, cut, 1, "truncated record")
    # Everything before the cut is decoded; the second connection's response is in the lost bytes,
    # so its query is exported as query-only.
    rows = read_output(out_dir).to_pylist()
    assert [r["qname"] for r in rows] == ["google.com", "aol.com"]
    assert rows[0]["response_present"] and not rows[1]["response_present"]
    stats = json.loads(next(out_dir.glob("*.stats.json")).read_text())
    assert stats["errors"] and "truncated record" in stats["errors"][0]


@needs_shared
def test_truncated_pcapng_block(tmp_path, out_dir):
    data = PCAP.read_bytes()
    cut = tmp_path / "cut.pcapng"
    cut.write_bytes(data[: len(data) // 2 + 3])
    _fails(out_dir, cut, 1, "truncated pcapng block")
    assert read_output(out_dir).num_rows > 10


@needs_shared
def test_impossible_original_length_in_pcap(tmp_path, out_dir):
    data = bytearray(TCP_PCAP.read_bytes())
    pos = 24
    for _ in range(15):  # frame 16, the aol.com response, claims 4 GiB on the wire
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
    struct.pack_into("<I", data, pos + 12, 0xFFFFFF51)
    bad = tmp_path / "wirelen.pcap"
    bad.write_bytes(bytes(data))
    _fails(out_dir, bad, 1, f"corrupt record at byte {pos}: original length 4294967121")
    rows = read_output(out_dir).to_pylist()
    assert [r["qname"] for r in rows] == ["google.com", "aol.com"]
    assert rows[0]["response_present"] and not rows[1]["response_present"]


def _epb_offsets(data):
    """Where a little-endian pcapng file's enhanced packet blocks start."""
    pos, found = 0, []
    while pos < len(data):
        btype, blen = struct.unpack_from("<II", data, pos)
        if btype == 6:
            found.append(pos)
        pos += blen
    return found


@needs_shared
@pytest.mark.parametrize(
    "field, value, message",
    [  # EPB: type, length, interface, ts high, ts low, caplen, len
        (24, 0x80000000, "corrupt packet block at byte {at}: original length 2147483648 (over 2147483647)"),
        (12, 0xFFFFFFFF, "corrupt packet block at byte {at}: timestamp 18446744073709551615 ticks is outside"
                         " the years 1677-2262"),  # high word all ones: year 584,000 in microseconds
        (8, 5, "packet names interface 5, which was never described"),
    ],
)
def test_impossible_pcapng_packet_block(tmp_path, out_dir, field, value, message):
    data = bytearray(PCAP.read_bytes())
    at = _epb_offsets(data)[100]
    if field == 12:
        struct.pack_into("<I", data, at + 16, 0xFFFFFFFF)
    struct.pack_into("<I", data, at + field, value)
    bad = tmp_path / "bad.pcapng"
    bad.write_bytes(bytes(data))
    _fails(out_dir, bad, 1, message.format(at=at))
    # The 100 packets before it (about 50 transactions, in the reader's batch in progress) are written.
    assert 45 <= read_output(out_dir).num_rows < 92


@needs_shared
def test_unknown_link_type(tmp_path, out_dir):
    data = bytearray(TCP_PCAP.read_bytes())
    struct.pack_into("<I", data, 20, 147)  # LINKTYPE_USER0
    odd = tmp_path / "user0.pcap"
    odd.write_bytes(bytes(data))
    _fails(out_dir, odd, 1, "unsupported link type 147")


@needs_shared
def test_corrupt_compressed_file(tmp_path, out_dir):
    packed = bytearray(lzma.compress(PCAP.read_bytes()))
    packed[len(packed) // 2 : len(packed) // 2 + 16] = b"\0" * 16
    bad = tmp_path / "bad.pcap.xz"
    bad.write_bytes(bytes(packed))
    _fails(out_dir, bad, 1, "decompression failed")


def test_missing_input_is_usage_error(tmp_path, out_dir):
    _fails(out_dir, tmp_path / "absent.pcap", 2, "no such file")


@needs_shared
def test_one_bad_file_does_not_stop_the_others(tmp_path, out_dir):
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"\x00" * 100)
    proc = run_dnsprobe("read", junk, TCP_PCAP, "-o", out_dir, "-q", check=False)
    assert proc.returncode == 1 and "junk.pcap" in proc.stderr
    assert read_output(out_dir).num_rows == 2


@needs_shared
def test_output_directory_missing_or_a_file(tmp_path):
    proc = run_dnsprobe("read", PCAP, "-o", tmp_path / "nowhere", check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    f = tmp_path / "file"
    f.write_text("x")
    proc = run_dnsprobe("read", PCAP, "-o", f, check=False)
    assert proc.returncode == 2 and "not a directory" in proc.stderr


def _mount_tmpfs(path, options):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)


@needs_shared
def test_read_only_output_directory(tmp_path):
    ro = tmp_path / "ro"
    _mount_tmpfs(ro, "ro,size=1m")
    try:
        proc = run_dnsprobe("read", PCAP, "-o", ro, check=False)
        assert proc.returncode == 2 and "not writable" in proc.stderr
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@needs_shared
def test_disk_full_keeps_completed_files(tmp_path):
    from support.data import COMPACTOR_DATA

    small = tmp_path / "small"
    _mount_tmpfs(small, "size=256k")
    try:
        proc = run_dnsprobe(
            "read", COMPACTOR_DATA / "knot-live.raw.pcap.xz", "-o", small, "-q", "--compression", "none",
            "--rotate-records", "1000", "--row-group-size", "250", check=False,
        )
        assert proc.returncode == 1, proc.stderr
        assert "disk full" in proc.stderr and "Traceback" not in proc.stderr
        done = sorted(small.glob("*.parquet"))
        assert done, "files completed before the disk filled are kept"
        import pyarrow.parquet as pq

        for f in done:
            assert pq.read_metadata(f).num_rows == 1000
    finally:
        subprocess.run(["umount", str(small)], check=True)
