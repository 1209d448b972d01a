"""`producer | dnsprobe read - -o out`: a pipe is decoded as it arrives and loses nothing.

A real pipe from a writer process that writes part of a capture (cut inside a record) and then pauses without
closing it, as `tcpdump -U -w -` does between packets. While it pauses, the frames that came are decoded and the
files their rotation closes appear; SIGINT or SIGTERM sent then writes every frame that came: the output is the
output of reading the same bytes as a file (Table.equals, file by file), for pcap and pcapng, plain and gzip,
with one worker and with two."""

import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib

import pyarrow.parquet as pq
import pytest
from support.captures import bench_mix
from support.data import ROOT
from support.frames import write_pcapng_ns

from probe.capture.pcapfile import PIPE_BATCH_WAIT_S

PACKETS = 3000  # written before the pause: fewer than a batch (run.batch_size 4096) and than a 1 MiB read
ROTATE = ("--set", "export.rotate_records=300")  # so that the part written closes files before the pause ends
WRITER = """
import sys, time
data = open(sys.argv[1], "rb").read()
sys.stdout.buffer.write(data)
sys.stdout.buffer.flush()
print("written", file=sys.stderr, flush=True)
time.sleep(300)  # the pause: the pipe stays open
"""


def records(pcap):
    """(offset, ts_ns, frame) of every record of a classic pcap file's bytes."""
    magic = pcap[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    frac = 1 if magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d") else 1000
    pos, out = 24, []
    while pos + 16 <= len(pcap):
        sec, sub, caplen, _ = struct.unpack_from(endian + "IIII", pcap, pos)
        out.append((pos, sec * 1_000_000_000 + sub * frac, pcap[pos + 16 : pos + 16 + caplen]))
        pos += 16 + caplen
    return out


def written_part(kind, tmp_path):
    """(the bytes the writer writes, the file holding what a reader of them can decode): PACKETS records and part of
    the next; gzip: part of the compressed whole, its decompressible prefix as the file."""
    mix = bench_mix().read_bytes()
    recs = records(mix)
    if kind.startswith("pcapng"):
        whole = write_pcapng_ns(tmp_path / "whole.pcapng", [(ts, frame) for _, ts, frame in recs]).read_bytes()
        cut = whole.index(recs[PACKETS][2]) + 10  # (the frame's bytes, inside its block)
    else:
        whole, cut = mix, recs[PACKETS][0] + 30
    if kind.endswith(".gz"):
        compressed = gzip.compress(whole, mtime=0)
        part = compressed[: len(compressed) * PACKETS // len(recs)]
        plain = zlib.decompressobj(wbits=31).decompress(part)
    else:
        part = plain = whole[:cut]
    (tmp_path / "same-bytes").write_bytes(plain)
    return part, tmp_path / "same-bytes"


def cpu_ticks(pid):
    """CPU time of a process and its children (the read workers), in clock ticks."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total


def wait_until_idle(pid, timeout=60):
    """Until the process (and its workers) used no CPU for a while: it waits for input."""
    deadline = time.monotonic() + timeout
    last, still = cpu_ticks(pid), 0
    while still < 4 and time.monotonic() < deadline:
        time.sleep(max(0.3, PIPE_BATCH_WAIT_S))
        now = cpu_ticks(pid)
        still = still + 1 if now == last else 0
        last = now
    assert still >= 4, "still busy"


def tables(out):
    return {f.name: pq.read_table(f) for f in sorted(out.glob("*.parquet"))}


def counters(out):
    doc = json.loads(next(out.glob("*.stats.json")).read_text())
    return {k: v for k, v in doc["counters"].items() if k not in ("files",)}


@pytest.mark.parametrize("kind, signum, workers", [
    pytest.param(kind, signum, workers, id=f"{kind}-{signum.name}-{workers}w")
    for kind, signum, workers in (
        ("pcap", signal.SIGINT, 1),
        ("pcap", signal.SIGTERM, 1),
        ("pcapng", signal.SIGINT, 1),
        ("pcap.gz", signal.SIGTERM, 1),
        ("pcapng.gz", signal.SIGINT, 1),
        ("pcap", signal.SIGINT, 2),
        ("pcapng.gz", signal.SIGTERM, 2),
    )
])
def test_a_paused_pipe_is_decoded_and_a_signal_writes_all_it_gave(tmp_path, kind, signum, workers):
    part, same_bytes = written_part(kind, tmp_path)
    (tmp_path / "part").write_bytes(part)
    extra = ("-q", "--no-progress", "--workers", str(workers), *ROTATE)
    piped, ref = tmp_path / "piped", tmp_path / "ref"
    piped.mkdir()
    ref.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "part")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        reader = subprocess.Popen([sys.executable, "-m", "probe", "read", "-", "-o", str(piped), *extra], cwd=ROOT,
                                  stdin=writer.stdout, stderr=subprocess.PIPE, text=True)
        writer.stdout.close()
        assert writer.stderr.readline() == b"written\n"
        # Paused: what came is decoded, and the files the rotation closed appear (before any signal).
        deadline = time.monotonic() + 60
        while len(list(piped.glob("*.parquet"))) < workers and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(piped.glob("*.parquet"))) >= workers, sorted(p.name for p in piped.iterdir())
        wait_until_idle(reader.pid)
        assert reader.poll() is None
        reader.send_signal(signum)
        stderr = reader.stderr.read()
        assert reader.wait(timeout=60) == 130, stderr
        assert stderr.splitlines() == ["dnsprobe: error: interrupted; writing what was decoded"]
    finally:
        writer.kill()
        writer.wait()
    proc = subprocess.run([sys.executable, "-m", "probe", "read", str(same_bytes), "-o", str(ref), *extra], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr  # (1: the record the cut left truncated)
    assert not list(piped.glob("*.part"))
    got, want = tables(piped), tables(ref)
    assert list(got) == list(want) and len(want) > workers
    for name, table in want.items():
        assert got[name].equals(table), name
    assert counters(piped) == counters(ref)
    assert counters(ref)["packets"] >= PACKETS


def test_a_trickle_is_handed_on_in_time():
    """A pipe that never pauses long but fills a batch slowly (a record every 20 ms): a batch is handed on at most
    about PIPE_BATCH_WAIT_S after the last one, not when run.batch_size frames have come; every frame once, in
    order."""
    import threading

    from probe.capture.pcapfile import read_capture

    mix = bench_mix().read_bytes()
    recs = records(mix)[:80]
    r, w = os.pipe()
    done = []

    def trickle():
        with os.fdopen(w, "wb", buffering=0) as out:
            out.write(mix[:24])
            for offset, _, frame in recs:
                out.write(mix[offset : offset + 16 + len(frame)])
                time.sleep(0.02)
        done.append(time.monotonic())

    writer = threading.Thread(target=trickle)
    writer.start()
    try:
        arrivals = [(time.monotonic(), list(batch.ts_ns)) for batch in read_capture(f"/dev/fd/{r}", 4096)]
    finally:
        writer.join()
        os.close(r)
    assert [ts for _, batch in arrivals for ts in batch] == [ts for _, ts, _ in recs]
    before_end = [t for t, _ in arrivals if t < done[0]]
    assert len(before_end) >= 1.6 / (PIPE_BATCH_WAIT_S + 0.2) - 1, len(before_end)
