"""DPDK capture (`dnsprobe capture --dpdk`), for real, with DPDK's virtual devices instead of a NIC.

- net_pcap (--no-huge --no-pci --vdev=net_pcap0,rx_pcap=FILE): the records equal, transaction for transaction,
  what `dnsprobe read FILE` writes (all columns but the timestamps, which DPDK takes from the TSC at capture);
- net_af_packet on the veth pair of test_live_capture's testbed: traffic replayed at a modest rate from the
  namespace is captured completely;
- EAL and device errors exit 2 with one line; a dnsprobe without the extension says it was not built.

Where libdpdk is missing (no `pkg-config --exists libdpdk`), the tests that need the extension are skipped with
that reason. Where libdpdk is present the extension must have been built: a failed import is a failure.
"""

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from support.captures import build_traffic, keys
from support.data import ROOT
from support.dnsprobe import as_rows, copy_env, read_output, rows_of, run_dnsprobe, run_python
from support.frames import udp_frame, write_pcap
from support.live import (
    EAL_SCRIPT,
    LIBDPDK,
    NO_HUGE,
    WORKER_RSS_BOUND_MIB,
    DpdkProbe,
    VethBed,
    needs_dpdk,
    needs_root,
)
from support.messages import q_dns

# Columns that hold capture timestamps (or are computed from them): DPDK's are the TSC's, a file's its own.
TIME_COLUMNS = {"unixtime", "time", "time_micro", "timestamp", "query_time", "response_time", "response_delay_us",
                "tcp_hs_rtt"}
WAIT_S = 60.0


def pcap_frames(path):
    """Frames in a classic pcap file."""
    import struct

    data = Path(path).read_bytes()
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    n, pos = 0, 24
    while pos + 16 <= len(data):
        pos += 16 + struct.unpack_from(endian + "I", data, pos + 8)[0]
        n += 1
    return n


def without_time(rows):
    return Counter(repr(tuple((k, v) for k, v in r.items() if k not in TIME_COLUMNS)) for r in rows)


def dpdk_capture(out_dir, dpdk_args, coremask="0x1", mbuf_size=2048):
    probe = DpdkProbe(out_dir, dpdk_args, coremask, mbuf_size)
    probe.wait_ready()
    return probe


def test_extension_built_where_libdpdk_is():
    if not LIBDPDK:
        pytest.skip("libdpdk is not installed (pkg-config --exists libdpdk fails): the extension is not built")
    from probe.capture import _dpdk  # built by `pip install -e .` when libdpdk is found: must import

    assert _dpdk.RTE_VERSION.startswith("DPDK ")
    for name in ("eal_init", "port_setup", "rx_burst", "port_stats", "port_stop", "port_close", "eal_cleanup"):
        assert callable(getattr(_dpdk, name))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Two captures to replay and what `dnsprobe read` makes of them: the bundled sample (20,000 frames of
    resolver traffic, as pcap) and test_live_capture's traffic (VLAN tags, TCP, IPv4 fragments, non-DNS)."""
    d = tmp_path_factory.mktemp("dpdk-ref")
    sample = d / "sample.pcap"
    with open(sample, "wb") as fh:
        subprocess.run(["xz", "-dc", str(ROOT / "samples" / "sample-mix.pcap.xz")], stdout=fh, check=True)
    mixed = d / "mixed.pcap"
    build_traffic(mixed, 0, 300)
    refs = {}
    for pcap in (sample, mixed):
        out = d / f"ref-{pcap.stem}"
        out.mkdir()
        run_dnsprobe("read", pcap, "-o", out, "-q", "--no-progress")
        refs[pcap.stem] = (pcap, pcap_frames(pcap), as_rows(read_output(out)))
    return refs


@needs_dpdk
@needs_root
@pytest.mark.parametrize("name", ["sample", "mixed"])
def test_pcap_vdev_equals_dnsprobe_read(reference, name, out_dir):
    pcap, frames, expected = reference[name]
    probe = dpdk_capture(out_dir, f"{NO_HUGE} --vdev=net_pcap0,rx_pcap={pcap}")
    try:
        probe.wait_counter("packets", frames)
    finally:
        assert probe.stop() == 0, probe.stderr
    rows = as_rows(read_output(out_dir))
    assert without_time(rows) == without_time(expected)  # transaction for transaction
    doc = probe.stats()
    c = doc["counters"]
    assert c["dpdk_ipackets"] == c["packets"] == frames
    assert c["dpdk_imissed"] == c["dpdk_ierrors"] == c["dpdk_rx_nombuf"] == 0
    assert c["records"] == len(rows) and doc["running"] is False
    port = doc["workers"]["0"]["interfaces"]["net_pcap0"]
    assert port["driver"] == "net_pcap" and port["queues"]["net_pcap0/q0"]["frames"] == frames
    # Timestamps: this run's wall clock in nanoseconds (TSC at the bursts), not the file's.
    now = time.time_ns()
    assert all(abs(r["query_time"] - now) < 600 * 10**9 for r in rows if r["query_time"] is not None)
    assert not list(out_dir.glob("*.part"))


# ---------------------------------------------------------------------------------------------
# Live: net_af_packet on a veth pair whose far end is in a namespace


@pytest.fixture(scope="module")
def testbed():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2")
    bed = VethBed()
    bed.up()
    yield bed
    bed.down()


@needs_dpdk
@pytest.mark.parametrize("queues", [1, 2])
def test_af_packet_vdev_on_veth_captures_everything(testbed, reference, queues, out_dir):
    if queues > len(os.sched_getaffinity(0)):
        pytest.skip(f"needs {queues} cores")
    pcap, _, expected = reference["mixed"]
    coremask = hex((1 << queues) - 1)
    # framesz: the PMD's ring frames, big enough for a reassembled fragmented response (the kernel's fanout
    # reassembles IPv4 fragments), and mbufs that hold such a frame.
    vdev = f"net_af_packet0,iface={testbed.iface},qpairs={queues},framesz=4096"
    probe = dpdk_capture(out_dir, f"{NO_HUGE} --vdev={vdev}", coremask, mbuf_size=4096)
    try:
        testbed.send(pcap, pps=2000)
        probe.wait_counter("matched", len(expected))
        peaks = probe.workers_peak_rss_mib()
    finally:
        assert probe.stop() == 0, probe.stderr
    rows = rows_of(out_dir)
    got, want = keys(rows), keys(expected)
    assert got == want, f"missing {want - got}, extra {got - want}"  # every transaction once, nothing lost
    assert all(r["query_present"] and r["response_present"] for r in rows)
    if queues > 1:  # both directions of each flow reached the same queue, and both queues had work
        assert {p.name.split(".w")[1] for p in out_dir.glob("*.parquet")} == {"0.parquet", "1.parquet"}
    doc = probe.stats()
    c = doc["counters"]
    assert c["dpdk_ipackets"] == c["packets"] and c["dpdk_imissed"] == 0 and c["dpdk_rx_nombuf"] == 0
    assert c["records"] == len(rows) == c["matched"]
    queue_frames = doc["workers"]["0"]["interfaces"]["net_af_packet0"]["queues"]
    assert sum(q["frames"] for q in queue_frames.values()) == c["packets"]
    times = sorted(r["query_time"] for r in rows)
    assert abs(times[0] - time.time_ns()) < 600 * 10**9  # the wall clock of the capture, not the file's
    # Memory: the pool (here mbufs of 4 KiB), the EAL's, DPDK's libraries and the device's ring beside the
    # pipeline; the queue threads of one process without hugepages share it (issue 33: no worker above 256 MiB).
    assert all(mib < WORKER_RSS_BOUND_MIB for mib in peaks.values()), peaks


@needs_dpdk
def test_af_packet_vdev_counts_the_frames_its_ring_dropped(testbed, reference, out_dir):
    """The net_af_packet device's ring (64 frames here) overflows when frames come faster than its process reads
    them: the kernel drops what does not fit. The PMD counts none of those drops (DPDK 22.11); the capture reads
    them from its sockets, so every frame that reached the interface is either read or counted as missed."""
    pcap, frames, _ = reference["sample"]
    vdev = f"net_af_packet0,iface={testbed.iface},blocksz=4096,framesz=2048,framecnt=64"
    probe = dpdk_capture(out_dir, f"{NO_HUGE} --vdev={vdev}")
    try:
        before = testbed.rx()["rx_packets"]
        testbed.send(pcap)  # as fast as it goes: far faster than 64 frames are read and handed on
        arrived = testbed.rx()["rx_packets"] - before
        probe.wait_for(lambda d: d["counters"]["dpdk_ipackets"] + d["counters"]["dpdk_imissed"] >= arrived,
                       f"{arrived} frames read or missed")
    finally:
        assert probe.stop() == 0, probe.stderr
    c = probe.stats()["counters"]
    assert arrived == frames and c["dpdk_imissed"] > 0, c
    assert c["packets"] == c["dpdk_ipackets"] and c["packets"] + c["dpdk_imissed"] == arrived, c


# ---------------------------------------------------------------------------------------------
# Errors


def capture_error(out_dir, *args):
    proc = run_dnsprobe("capture", "--dpdk", "-o", out_dir, "--no-progress", "-q", *args, check=False)
    lines = proc.stderr.strip().splitlines()
    return proc.returncode, lines


@needs_dpdk
@needs_root
@pytest.mark.parametrize("dpdk_args, message", [
    (f"{NO_HUGE} --bogus-option", "unrecognized option '--bogus-option'"),
    (f"{NO_HUGE} --vdev=net_nosuch0", "net_nosuch0"),
    (f"{NO_HUGE} --vdev=net_pcap0,rx_pcap=/nonexistent.pcap", "/nonexistent.pcap"),
    (f"{NO_HUGE} --vdev=net_af_packet0,iface=nosuchif0", "does not exist"),
    (NO_HUGE, "DPDK port 0 does not exist: EAL found no port"),
    (f"{NO_HUGE} -l 0", "give the cores with capture.coremask"),
    (f"{NO_HUGE} 'unbalanced", "config key 'dpdk.args'"),
])
def test_eal_and_device_errors_exit_2(out_dir, dpdk_args, message):
    rc, lines = capture_error(out_dir, f"--dpdk-args={dpdk_args}")
    assert rc == 2, lines
    assert message in lines[-1], lines
    assert lines[-1].startswith("dnsprobe: ") and "Traceback" not in "\n".join(lines)


@needs_dpdk
@needs_root
def test_no_hugepages_is_a_clear_error(out_dir):
    meminfo = Path("/proc/meminfo").read_text()
    if "HugePages_Total:       0" not in meminfo:
        pytest.skip("this machine has hugepages reserved")
    rc, lines = capture_error(out_dir, "--dpdk-args=--no-pci --vdev=net_null0")
    assert rc == 2, lines
    assert "hugepage" in lines[-1] and "--no-huge" in lines[-1], lines


@needs_dpdk
def test_interfaces_with_dpdk_exit_2(out_dir):
    rc, lines = capture_error(out_dir, "-i", "lo")
    assert rc == 2 and "cannot be used with DPDK" in lines[-1], lines


def test_without_the_extension_says_it_was_not_built(tmp_path):
    """A copy of the package without the compiled module: what an install without libdpdk is."""
    for part in ("probe", "export", "config"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("_dpdk*.so", "__pycache__"))
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "probe", "capture", "--dpdk", "-o", out, "-q"], cwd=tmp_path,
                          capture_output=True, text=True, env=copy_env())
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "DPDK support was not built" in line and "libdpdk-dev" in line, line
    # And the rest works: the configuration shows the dpdk section.
    doc = subprocess.run([sys.executable, "-m", "probe", "config"], cwd=tmp_path, capture_output=True, text=True)
    assert doc.returncode == 0 and yaml.safe_load(doc.stdout)["dpdk"]["enabled"] is False, doc.stderr


def test_dpdk_section_in_config_file(tmp_path):
    conf = tmp_path / "c.yml"
    conf.write_text("dpdk:\n  enabled: true\n  args: '--no-huge'\n  port: 1\n  ring_size: 512\n")
    proc = run_dnsprobe("config", "-c", conf)
    assert "args: --no-huge" in proc.stdout and "ring_size: 512" in proc.stdout
    conf.write_text("dpdk:\n  ring_size: 8\n")
    proc = run_dnsprobe("config", "-c", conf, check=False)
    assert proc.returncode == 2 and "dpdk.ring_size" in proc.stderr


CHECKS = EAL_SCRIPT + """
frame = bytes.fromhex(sys.argv[2])
attempt(_dpdk.port_info, 65536)  # 0 once cut to 16 bits
attempt(_dpdk.port_close, 65536)
attempt(_dpdk.port_setup, 0, 1, 65536, 1023, 2048, False)
attempt(_dpdk.port_setup, 0, 1, 512, 1023, 65500, False)
attempt(_dpdk.rx_burst, 0, 0, 8, 0)  # no queue set up yet
attempt(_dpdk.port_setup, 0, 1, 512, 1023, 2048, False)
attempt(_dpdk.rx_burst, 0, 1, 8, 0)
data, ts, wirelen = _dpdk.rx_burst(0, 0, 8, 2_000_000)
print(data == [frame], wirelen == [len(frame)])
_dpdk.port_stop(0)
attempt(_dpdk.rx_burst, 0, 0, 8, 0)
_dpdk.port_close(0)
_dpdk.eal_cleanup()
dpdk.remove_runtime_dir()
"""


@needs_dpdk
@needs_root
def test_port_and_queue_numbers_and_16_bit_sizes_are_checked(tmp_path):
    # A port number was cut to 16 bits (65536 became port 0, and port_close wrote past the pool table), a
    # queue that was not set up went to DPDK unchecked (a NULL queue for the driver), and a ring or mbuf
    # size over 16 bits was cut instead of refused. In a fresh interpreter: a crash fails this test only.
    frame = udp_frame(q_dns(0x1601))
    pcap = write_pcap(tmp_path / "one.pcap", [(1_700_000_000 * 10**9, frame)])
    proc = run_python(CHECKS, pcap, frame.hex())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "DPDK port 65536 does not exist (1 port(s) found)",
        "DPDK port 65536 does not exist (1 port(s) found)",
        "dpdk.ring_size 65536: between 1 and 65535 RX descriptors",
        "dpdk.mbuf_size 65500: between 1 and 65407 bytes (128 of the 16-bit mbuf data room go to its headroom)",
        "RX queue 0 of port 0 is not set up (0 queue(s) are)",
        "done",
        "RX queue 1 of port 0 is not set up (1 queue(s) are)",
        "True True",
        "RX queue 0 of port 0 is not set up (0 queue(s) are)",
    ], proc.stdout + proc.stderr


POOL = """
import sys
from probe.capture import dpdk
from probe.config import load_config
pcap, size, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = load_config(None, {"dpdk.args": f"--no-huge --no-pci -m 512 --vdev=net_pcap0,rx_pcap={pcap}",
                         "dpdk.mempool_size": size})
port = dpdk.DpdkPort(cfg.dpdk, dpdk.eal_args(cfg.dpdk, "0x1"), workers=workers)
assert port.lib.RX_CHUNK == dpdk.RX_CHUNK, "probe.capture.dpdk.RX_CHUNK is not _dpdk.c's"
print(dpdk.mbufs_needed(cfg.dpdk, port.queues, workers, port.mode, 4096, port.info["driver"]), port.lib.pool_size(0),
      port.lib.pool_bytes(0))
port.close()
dpdk.remove_runtime_dir()
"""


@needs_dpdk
@needs_root
@pytest.mark.parametrize("size, workers", [(0, 1), (0, 2), (2047, 1)])
def test_mempool_size_default_is_what_the_queues_and_batches_hold(tmp_path, size, workers):
    """dpdk.mempool_size 0 (the default) makes the smallest pool of 2^n - 1 mbufs that holds what the queues,
    the workers' batches and a distributing primary's rings can hold at once: 8,191 for one worker reading
    net_pcap. (It was 16,383 whatever the shape; a pool cycles through all its mbufs, so the extra ones only
    added to the RSS.) A size set is made as set, and one below that need is reported. Without hugepages, the
    mbufs of a software device are packed across the 4 KiB pages: one that could not span a page took a page of
    its own (4,096 bytes for an mbuf of about 2,300)."""
    frame = udp_frame(q_dns(0x1602))
    pcap = write_pcap(tmp_path / "one.pcap", [(1_700_000_000 * 10**9, frame)])
    proc = run_python(POOL, pcap, size, workers)
    assert proc.returncode == 0, proc.stderr
    need, made, memory = map(int, proc.stdout.split())
    assert made * 2300 < memory < made * 2600, proc.stdout
    if size:
        assert made == size, proc.stdout
    else:
        assert made >= need > made // 2 and made & (made + 1) == 0, proc.stdout
        assert workers > 1 or made == 8191, proc.stdout
    assert ("is below the" in proc.stderr) == (made < need), proc.stderr


def test_a_nic_queue_holds_an_mbuf_per_descriptor():
    """A NIC's driver keeps an mbuf on every RX descriptor; net_af_packet and net_pcap take one per frame they
    read, a chunk at a time. The default pool follows: 16,383 for one worker on a NIC (4,096 descriptors and a
    batch of 4,096), 8,191 on those drivers."""
    from probe.capture import dpdk
    from probe.config import load_config

    cfg = load_config(None, {}).dpdk
    assert cfg.ring_size == 4096 and cfg.mempool_size == 0
    nic = dpdk.mbufs_needed(cfg, 1, 1, "single", 4096, "net_ixgbe")
    assert nic == 4096 + 4096 + dpdk.MEMPOOL_CACHE and dpdk.pool_size(nic) == 16383
    for driver in ("net_af_packet", "net_pcap"):
        need = dpdk.mbufs_needed(cfg, 1, 1, "single", 4096, driver)
        assert need == dpdk.RX_CHUNK + 4096 + dpdk.MEMPOOL_CACHE and dpdk.pool_size(need) == 8191
    assert [dpdk.pool_size(n) for n in (1, 2, 4, 8191, 8192)] == [1, 3, 7, 8191, 16383]
