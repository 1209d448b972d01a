"""The output does not depend on the backend or the worker count: `dnsprobe capture` with 1, 2 and 3 AF_PACKET
workers and with DPDK, and `dnsprobe read` with 1, 2 and 3 workers, give exactly the transactions of a
one-worker `read` of the same capture, on traffic replayed through a veth that has every IPv6 extension header
the decoder walks (hop-by-hop, routing, destination options, AH) and fragments of both families in both
directions (support.captures.edge_traffic): the kernel filter keeps those frames, and the fanout program keeps every
flow, fragments included, on one worker. Every column is compared but the capture times (the kernel's, not the
file's) and what is computed from them. Three capture workers need more cores than this machine has beside the
sender: three sockets of one fanout group stand in for them, frame for frame."""

import os
import shutil
import struct
from collections import Counter
from pathlib import Path

import pytest
from support.dnsprobe import rows_of, run_dnsprobe
from support.live import Probe

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")
TIME_COLUMNS = {"unixtime", "time", "time_micro", "timestamp", "query_time", "response_time", "response_delay_us",
                "tcp_hs_rtt"}
CORES = len(os.sched_getaffinity(0))


def transactions(rows):
    return Counter(repr(sorted((k, v) for k, v in r.items() if k not in TIME_COLUMNS)) for r in rows)


def differences(got, want):
    """For a failure message: the columns in which the rows of the same QNAME and transport differ."""
    got_rows = {(r["qname"], r["prot"]): r for r in map(dict, map(eval, got))}  # noqa: S307 (our own reprs)
    out = Counter()
    for k in want:
        w = dict(eval(k))  # noqa: S307
        g = got_rows.get((w["qname"], w["prot"]))
        out.update(["(missing)"] if g is None else [c for c in w if g[c] != w[c]])
    return out


@pytest.fixture(scope="module")
def edge(tmp_path_factory, edge_pcap):
    d = tmp_path_factory.mktemp("split")
    pcap, frames = edge_pcap
    out = d / "read1"
    out.mkdir()
    run_dnsprobe("read", pcap, "-o", out, "-q", "--no-progress")
    return pcap, frames, transactions(rows_of(out))


@pytest.mark.parametrize("workers", [2, 3])
def test_read_workers(edge, workers, tmp_path):
    if workers > CORES:
        pytest.skip(f"needs {workers} cores (read refuses more workers than cores)")
    pcap, _, expected = edge
    run_dnsprobe("read", pcap, "-o", tmp_path, "-q", "--no-progress", "--workers", workers)
    assert transactions(rows_of(tmp_path)) == expected


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_capture_workers(testbed, edge, probes, workers, out_dir):
    if workers > CORES:
        pytest.skip(f"needs {workers} cores")
    pcap, frames, expected = edge
    probe = probes(testbed, out_dir, coremask=hex((1 << workers) - 1))
    probe.wait_ready()
    testbed.send(pcap, pps=2000)
    probe.wait_counter("packets", frames)  # every frame passed the kernel filter
    assert probe.stop() == 0, probe.stderr
    rows = rows_of(out_dir)
    got = transactions(rows)
    assert got == expected, f"columns that differ: {differences(got, expected)}"
    counters = probe.stats()["counters"]
    assert counters["kernel_received"] == frames and counters["kernel_drops"] == 0
    if workers > 1:  # each worker had flows, and every one of them whole
        assert len({p.name.split(".w")[1][0] for p in out_dir.glob("*.parquet")}) == workers


def test_three_sockets_in_a_fanout_group_get_the_shares_of_read(testbed, edge):
    """Three capture workers need three cores beside the sender; three AF_PACKET sockets in one fanout group, read
    here, stand in for them: socket k of the group gets exactly the frames of `read --workers 3`'s share k, in
    their order, byte for byte (the fanout program computes the hash read splits by)."""
    import dataclasses
    import select
    import threading
    import time

    from probe.capture.afpacket import AfPacketSource
    from probe.capture.pcapfile import read_capture
    from probe.config import load_config
    from probe.decode import _decoderec
    from probe.run.fanout import fanout_ids

    pcap, frames, _ = edge
    cfg = load_config()
    capture_cfg = dataclasses.replace(cfg.capture, block_size=1 << 18, block_count=16, block_timeout_ms=20)
    (group,) = fanout_ids(capture_cfg, [testbed.iface])
    sockets = []
    try:
        for _ in range(3):  # (joined in this order: the kernel gives share k to the k-th)
            sockets.append(AfPacketSource(testbed.iface, capture_cfg, (53,), group))
        sender = threading.Thread(target=testbed.send, args=(pcap,), kwargs={"pps": 2000})
        sender.start()
        got = [[] for _ in sockets]
        poller = select.poll()
        for src in sockets:
            poller.register(src.fileno(), select.POLLIN)
        deadline = time.monotonic() + 30
        while sum(map(len, got)) < frames and time.monotonic() < deadline:
            poller.poll(20)
            for share, src in zip(got, sockets, strict=True):
                if src.ready():
                    share += src.read().data
        sender.join()
        time.sleep(0.1)  # (a frame too many would show in the last blocks)
        for share, src in zip(got, sockets, strict=True):
            share += src.read().data
        drops = sum(src.counters()["kernel_drops"] for src in sockets)
    finally:
        for src in sockets:
            src.close()
    shares = [[] for _ in range(3)]
    for batch in read_capture(pcap):
        for k, share in enumerate(shares):
            share += _decoderec.select_share(batch.packed, batch.linktype, k, 3).lists()[2]
    assert drops == 0 and sum(map(len, got)) == frames == sum(map(len, shares))
    assert all(got) and got == shares


# DPDK through its net_af_packet device on the veth: one process alone (--no-huge), one process with a thread per
# queue (--no-huge, two queues whose sockets are in one fanout group), and two processes (a primary that
# distributes the frames by the flow hash, and a secondary; hugepages). dnsprobe replaces the device's packet
# sockets (probe/capture/dpdk_af_packet.py): without that, the kernel's DEFRAG fanout of the device hands IPv4
# datagrams over reassembled, with other lengths than read's, and a port hash sends IPv6 fragments astray.
DPDK_SHAPES = {"one process": ("0x1", 1, False), "threads": ("0x3", 2, False), "two processes": ("0x3", 1, True)}


@pytest.mark.parametrize("shape", list(DPDK_SHAPES))
def test_capture_dpdk(testbed, edge, out_dir, request, shape):
    from support.live import LIBDPDK, NO_HUGE, DpdkProbe

    if not LIBDPDK:
        pytest.skip("libdpdk is not installed, so the DPDK extension is not built")
    coremask, qpairs, multi = DPDK_SHAPES[shape]
    workers = bin(int(coremask, 16)).count("1")
    if workers > CORES:
        pytest.skip(f"needs {workers} cores")
    huge = request.getfixturevalue("hugepages") if multi else None
    memory = f"--huge-dir={huge.dir} --no-pci" if multi else NO_HUGE
    pcap, _, expected = edge
    vdev = f"net_af_packet0,iface={testbed.iface},qpairs={qpairs}"
    probe = DpdkProbe(out_dir, f"{memory} --vdev={vdev}", coremask)
    probe.wait_ready()
    try:
        testbed.send(pcap, pps=2000)
        probe.wait_counter("matched", sum(expected.values()))
    finally:
        assert probe.stop() == 0, probe.stderr
    got = transactions(rows_of(out_dir))
    assert got == expected, f"columns that differ: {differences(got, expected)}"
    doc = probe.stats()
    c = doc["counters"]
    assert c["dpdk_ipackets"] == c["packets"] and c["dpdk_imissed"] == c["dpdk_ring_full"] == 0
    assert len({p.name.split(".w")[1][0] for p in out_dir.glob("*.parquet")}) == workers  # each had flows
    port = doc["workers"]["0"]["interfaces"]["net_af_packet0"]
    assert port["frames_as_on_wire"] is True
    queues = [w["interfaces"]["net_af_packet0"]["queues"] for w in doc["workers"].values()]
    read = {name: q["frames"] for qs in queues for name, q in qs.items()}
    assert sum(read.values()) == c["packets"] and len(read) == workers
    if multi:  # what the primary passed to the secondary's ring, the secondary read
        assert port["mode"] == "distributor" and port["rings"]["w1"]["passed"] == read["net_af_packet0/w1"]
        assert huge.files() == []  # the EAL's hugepage files removed with the group
    assert not list(Path("/var/run/dpdk").glob(f"dnsprobe{probe.proc.pid}*"))


def test_probe_helper_is_the_live_tests_one():
    assert Probe.__module__ == "support.live"


@pytest.mark.parametrize("twin", ["c", "python"])
def test_sockets_joining_the_group_under_traffic_lose_no_frame_uncounted(testbed, edge, twin, monkeypatch):
    """A worker (re)started while traffic flows joins its interface's fanout group: from the join on the group
    hands its socket a share. Attaching a filter compiles it (checks, JIT): a socket that got its own filter after
    the join dropped its share of that time, uncounted (a frame or two per join at a few
    thousand frames a second). The filter now comes before the bind, and what the socket receives from the bind
    to the join (the group had it too) is set aside and counted (join_overlap). Here two more sockets join while
    the first is receiving: no frame is read twice, and every frame not read is counted. twin: the ring
    reader, C or Python (which set aside the overlap from different batches)."""
    import dataclasses
    import select
    import threading
    import time

    from probe.capture import afpacket
    from probe.capture.afpacket import AfPacketSource
    from probe.capture.pcapfile import read_capture
    from probe.config import load_config
    from probe.run.fanout import fanout_ids

    if twin == "python":  # the reference, where probe.capture._ring is not built
        monkeypatch.setattr(afpacket, "_ring", None)
    else:
        assert afpacket._ring is not None
    pcap, frames, _ = edge
    cfg = load_config()
    capture_cfg = dataclasses.replace(cfg.capture, block_size=1 << 18, block_count=16, block_timeout_ms=20)
    (group,) = fanout_ids(capture_cfg, [testbed.iface])
    sockets = [AfPacketSource(testbed.iface, capture_cfg, (53,), group)]
    got = Counter()
    try:
        sender = threading.Thread(target=testbed.send, args=(pcap,), kwargs={"pps": 5000})  # about 0.2 s
        sender.start()
        deadline = time.monotonic() + 30
        while sum(got.values()) + sum(s.join_overlap for s in sockets) < frames and time.monotonic() < deadline:
            if len(sockets) < 3 and sum(got.values()) >= frames * len(sockets) // 4:
                sockets.append(AfPacketSource(testbed.iface, capture_cfg, (53,), group))  # under traffic
            select.select([s.fileno() for s in sockets], [], [], 0.02)
            for s in sockets:
                if s.ready():
                    got.update(s.read().data)
        sender.join()
        time.sleep(0.1)  # (a frame too many would show in the last blocks)
        for s in sockets:
            got.update(s.read().data)
        assert len(sockets) == 3, "the sockets joined after the traffic"
        counters = [s.counters() for s in sockets]
    finally:
        for s in sockets:
            s.close()
    sent = Counter(d for batch in read_capture(pcap) for d in batch.data)
    assert sum(sent.values()) == frames
    assert all(c["kernel_received"] > 0 for c in counters), counters  # each had its share
    assert sum(c["kernel_drops"] for c in counters) == 0
    # What the kernel passed to a socket was read or set aside, and counted (the counters start at the bind).
    assert [c["kernel_received"] for c in counters] == [c["frames"] + c["join_overlap"] for c in counters], counters
    assert not got - sent, "a frame was read twice"
    assert sum((sent - got).values()) <= sum(c["join_overlap"] for c in counters), (sent - got, counters)


def test_a_group_id_taken_by_another_kind_of_group_is_named(testbed):
    import socket

    from probe.capture.afpacket import PACKET_FANOUT, SOL_PACKET, AfPacketSource
    from probe.config import load_config
    from probe.errors import ConfigError

    cfg = load_config()
    other = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    try:
        other.bind((testbed.iface, 0x0003))
        other.setsockopt(SOL_PACKET, PACKET_FANOUT, struct.pack("I", 0x4321 | 0 << 16))  # PACKET_FANOUT_HASH
        with pytest.raises(ConfigError, match="cannot join packet fanout group 17185 .*capture.fanout_group"):
            AfPacketSource(testbed.iface, cfg.capture, (53,), 0x4321)
    finally:
        other.close()
