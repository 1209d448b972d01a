"""dnstap files through the real `dnsprobe read`: recognised by content (plain, gzip, xz, zstd, pipes), mixed with
pcaps, and bad files named with their problem, keeping what came before it."""

import gzip
import lzma
import subprocess
import sys

import pytest
import zstandard
from support.data import DNSPROBE_DATA, ROOT
from support.dnsprobe import probe_run, read_output, rows_of, run_dnsprobe
from support.dnstap import dnstap_frame, fstrm_file
from support.frames import NS, T0
from support.messages import q_dns, r_dns

PCAP = DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap"  # 92 transactions


def exchanges(n, first=0, identity=b"srv"):
    out = []
    for i in range(first, first + n):
        out.append(dnstap_frame("CLIENT_QUERY", dns=q_dns(i), qport=30000 + i, ts=T0 + i * NS, identity=identity))
        out.append(dnstap_frame("CLIENT_RESPONSE", dns=r_dns(i), qport=30000 + i, ts=T0 + i * NS + 1000,
                                identity=identity))
    return out


@pytest.mark.parametrize("compress", [None, gzip.compress, lzma.compress, zstandard.compress],
                         ids=["plain", "gzip", "xz", "zstd"])
def test_dnstap_files_plain_or_compressed(tmp_path, compress):
    data = fstrm_file(exchanges(50))
    path = tmp_path / "input.bin"  # the name says nothing
    path.write_bytes(compress(data) if compress else data)
    rows, c = probe_run(path, tmp_path / "out")
    assert len(rows) == 50 == c["matched"] and c["dnstap_frames"] == 100 and c["dnstap_bytes"] == len(data)
    assert sorted(r["id"] for r in rows) == list(range(50))
    assert all(r["response_delay_us"] == 1 and r["dnstap_type"] == "client" for r in rows)


def test_a_pipe(tmp_path):
    data = fstrm_file(exchanges(10))
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "probe", "read", "/dev/stdin", "-o", str(out), "-q"],
                          input=gzip.compress(data), capture_output=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert len(list(out.glob("*.parquet"))) == 1


def test_joined_files_and_a_file_still_being_written(tmp_path):
    joined = tmp_path / "joined.fstrm"
    joined.write_bytes(fstrm_file(exchanges(5)) + fstrm_file(exchanges(5, 5)))
    unfinished = tmp_path / "unfinished.fstrm"
    unfinished.write_bytes(fstrm_file(exchanges(5, 10), stop=False))  # no STOP: read to its last whole frame
    rows, c = probe_run([joined, unfinished], tmp_path / "out")
    assert len(rows) == 15 == c["matched"]


def test_pcap_and_dnstap_in_one_run(tmp_path):
    """They go through the same matching into the same files, and never pair with each other."""
    dnstap = tmp_path / "tap.fstrm"
    dnstap.write_bytes(fstrm_file(exchanges(20)))
    only_pcap, _ = probe_run(PCAP, tmp_path / "p")
    rows, c = probe_run([PCAP, dnstap], tmp_path / "out")
    assert len(rows) == len(only_pcap) + 20
    assert sum(r["dnstap_type"] is None for r in rows) == len(only_pcap)
    assert c["packets"] > 0 and c["dnstap_frames"] == 40


def _fails(tmp_path, path, *needles):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    proc = run_dnsprobe("read", path, "-o", out, "-q", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    for needle in (str(path),) + needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return out


def test_another_content_type_is_an_error_naming_it(tmp_path):
    path = tmp_path / "other.fstrm"
    path.write_bytes(fstrm_file([b"hello"], content_type=b"text:plain"))
    _fails(tmp_path, path, "not a dnstap file: START has content type b'text:plain'")


def test_a_file_cut_inside_a_frame_keeps_what_came_before(tmp_path):
    data = fstrm_file(exchanges(30), stop=False)
    path = tmp_path / "cut.fstrm"
    path.write_bytes(data[:-10])
    out = _fails(tmp_path, path, "truncated: ended inside a frame")
    rows = rows_of(out)
    assert len(rows) == 30 and sum(r["response_present"] for r in rows) == 29  # the last response was cut


def test_a_frame_that_is_not_dnstap_in_a_file(tmp_path):
    path = tmp_path / "garbage.fstrm"
    path.write_bytes(fstrm_file(exchanges(3) + [b"\xff\xff\xff\xff"] + exchanges(3, 3)))
    out = _fails(tmp_path, path, "a data frame of 4 bytes is not a protobuf dnstap message")
    assert len(read_output(out)) == 3


def test_frame_streams_errors_in_a_file(tmp_path):
    path = tmp_path / "bad.fstrm"
    path.write_bytes(fstrm_file(exchanges(2), stop=False) + b"\0\0\0\0\0\0\x10\0")
    _fails(tmp_path, path, "a control frame of 4096 bytes (at most 512)")
