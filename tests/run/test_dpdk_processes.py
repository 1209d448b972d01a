"""DPDK capture in several processes (DPDK multi-process, on the veth testbed's net_af_packet device and hugepages
of the test's own): a dead secondary is restarted alone and attaches to the running primary; a dead primary takes
the secondary with it and the group starts again with a fresh EAL, whose predecessor's runtime and hugepage files
are removed. Every transaction completed before each death is in a file. (Equality with `dnsprobe read` for one
and two processes: test_flow_split.py.) Both shapes of two workers, processes and threads, obey the supervisor's
"rotate"."""

import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from support.captures import build_traffic, keys
from support.dnsprobe import rows_of, run_dnsprobe

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2,
                                reason="needs root and 2 cores")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("dpdk-parts")
    out = {}
    for name, first in (("A", 0), ("B", 1000), ("C", 2000)):
        pcap = d / f"{name}.pcap"
        build_traffic(pcap, first, 60)
        ref = d / f"ref-{name}"
        ref.mkdir()
        run_dnsprobe("read", pcap, "-o", ref, "-q", "--no-progress")
        out[name] = (pcap, keys(rows_of(ref)))
    return out


def test_dead_processes_are_restarted(testbed, hugepages, parts, out_dir):
    from support.live import LIBDPDK, DpdkProbe

    if not LIBDPDK:
        pytest.skip("libdpdk is not installed, so the DPDK extension is not built")
    probe = DpdkProbe(out_dir, f"--huge-dir={hugepages.dir} --no-pci --vdev=net_af_packet0,iface={testbed.iface}",
                      "0x3")
    probe.wait_ready()
    expected = Counter()
    try:
        for part, victim in (("A", "1"), ("B", "0"), ("C", None)):
            pcap, want = parts[part]
            testbed.send(pcap, pps=5000)
            expected += want
            done = probe.wait_counter("matched", expected.total())
            if victim is None:
                break
            probe.signal(signal.SIGHUP)  # every transaction so far into a closed file
            doc = probe.wait_counter("records", expected.total())
            pids = {w: doc["workers"][w]["pid"] for w in ("0", "1")}
            os.kill(pids[victim], signal.SIGKILL)
            # A secondary comes back alone; a primary with a new secondary too.
            again = ("0", "1") if victim == "0" else ("1",)
            doc = probe.wait_for(lambda d, again=again, pids=pids: all(
                d["workers"][w]["pid"] != pids[w] and d["workers"][w]["alive"] and d["workers"][w]["interfaces"]
                for w in again) and all(d["workers"][w]["pid"] == pids[w] for w in ("0", "1") if w not in again),
                f"worker(s) {', '.join(again)} restarted")
    finally:
        rc = probe.stop()
    assert rc == 0, probe.stderr
    assert keys(rows_of(out_dir)) == expected and done["counters"]["matched"] == expected.total()
    doc = probe.stats()
    assert [doc["workers"][w]["restarts"] for w in ("0", "1")] == [1, 2]  # killed, then stopped with worker 0
    assert doc["counters"]["lost_in_dead_worker"] == 0
    assert "stopped with worker 0; it starts again after it" in probe.stderr
    assert hugepages.files() == []  # the killed primary's too
    assert not list(Path("/var/run/dpdk").glob(f"dnsprobe{probe.proc.pid}g*"))


def test_device_with_rss_gives_each_process_its_queue(hugepages, out_dir):
    # net_null hashes (RSS on IP among its offloads) and has queues to spare: no distribution, each process reads
    # the RX queue of its number. It makes frames of zeros as fast as they are read (not IP: counted as non_ip),
    # and never runs dry: the stop reads it for a bounded time.
    from support.live import LIBDPDK, DpdkProbe

    if not LIBDPDK:
        pytest.skip("libdpdk is not installed, so the DPDK extension is not built")
    probe = DpdkProbe(out_dir, f"--huge-dir={hugepages.dir} --no-pci --vdev=net_null0,size=64", "0x3")
    probe.wait_ready()
    try:
        probe.wait_for(lambda d: all(w["counters"]["packets"] for w in d["workers"].values()), "both processes read")
    finally:
        rc = probe.stop()
    assert rc == 0, probe.stderr
    doc = probe.stats()
    queues = {w: doc["workers"][w]["interfaces"]["net_null0"] for w in ("0", "1")}
    assert [q["mode"] for q in queues.values()] == ["rss", "rss"] and queues["0"]["rss_hash_functions"]
    read = {w: q["queues"][f"net_null0/q{w}"]["frames"] for w, q in queues.items()}
    c = doc["counters"]
    assert c["packets"] == c["non_ip"] == sum(read.values()) and all(read.values())
    assert c["dpdk_ipackets"] >= c["packets"] and c["dpdk_ring_full"] == 0
    assert hugepages.files() == []


@pytest.mark.parametrize("shape", ["processes", "threads"])
def test_every_dpdk_worker_rotates_when_told(testbed, parts, shape, out_dir, request):
    """SIGHUP: the supervisor tells every worker to "rotate", and each closes its file while the capture runs, so
    every transaction so far is in a closed file (the worker shell, probe/run/worker.py; a worker kind that did
    not answer would keep its transactions in its .part file until the stop). The primary and the secondary of the
    multi-process shape; the queue threads of the one process without hugepages. (AF_PACKET workers:
    test_live_capture.test_sighup_rotates.)"""
    from support.live import LIBDPDK, NO_HUGE, WORKER_RSS_BOUND_MIB, DpdkProbe

    if not LIBDPDK:
        pytest.skip("libdpdk is not installed, so the DPDK extension is not built")
    vdev = f"--vdev=net_af_packet0,iface={testbed.iface}"
    if shape == "processes":
        probe = DpdkProbe(out_dir, f"--huge-dir={request.getfixturevalue('hugepages').dir} --no-pci {vdev}", "0x3")
    else:
        probe = DpdkProbe(out_dir, f"{NO_HUGE} {vdev},qpairs=2,framesz=4096", "0x3", mbuf_size=4096)
    probe.wait_ready()
    pcap, want = parts["A"]
    try:
        testbed.send(pcap, pps=5000)
        probe.wait_counter("matched", want.total())
        assert not list(out_dir.glob("*.parquet"))  # rotate_seconds (300 s): no file closed on time yet
        probe.signal(signal.SIGHUP)
        probe.wait_for(lambda d: keys(rows_of(out_dir)) == want, "every transaction in a closed file")
        closed = sorted(p.name.split(".w")[1] for p in out_dir.glob("*.parquet"))
        peaks = probe.workers_peak_rss_mib()  # after a rotation, which converts each worker's journal
    finally:
        rc = probe.stop()
    assert rc == 0, probe.stderr
    assert closed == ["0.parquet", "1.parquet"]  # both workers (queues) had transactions, and closed their file
    # Issue 33: no worker above 256 MiB, the primary and the secondary (the hugepages they share are not in their
    # RSS) or the one process of both queue threads.
    assert len(peaks) == (2 if shape == "processes" else 1) and all(
        mib < WORKER_RSS_BOUND_MIB for mib in peaks.values()), peaks
