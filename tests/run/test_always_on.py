"""Always-on capture on real AF_PACKET sockets (a veth pair into a network namespace of the test's own), with real
signals and real link changes: a worker killed while traffic flows loses only what it had not yet put in a file,
and says how much; a link that goes down and up, or an interface that appears late, is waited for; captures
sharing a directory or an interface keep out of each other's way; the Prometheus endpoint, the live journal and
the log lines show what an operator needs. Waits are for counters in the statistics JSON, never fixed sleeps.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.captures import keys, traffic_parts
from support.data import ROOT
from support.dnsprobe import as_rows, rows_of, run_dnsprobe
from support.live import Probe, Testbed

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")

FLUSH_S = 3.0  # export.flush_seconds of the kill test: long enough to kill a worker before its flush


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """Three parts (A, B, C) of 200 transactions each: their filter-passing frame counts and expected keys."""
    return traffic_parts(tmp_path_factory.mktemp("always-on-traffic"), 200, "ABC")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def n(expected):
    return sum(expected.values())


def state(doc, ifname):
    """What worker 0 says it does on an interface: capturing, down, waiting (None before its first report)."""
    return doc["workers"]["0"]["interfaces"].get(ifname, {}).get("state")


def metric(text, name, **labels):
    """The value of one Prometheus series (0.0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{want}}}" if labels else name):
            return float(value)
    return 0.0


def test_killed_worker_loses_only_what_it_had_not_written(testbed, traffic, probes, out_dir):
    """SIGKILL of the worker after part B: part A (made durable before, in the live journal) is recovered into a
    readable file, part B (not yet flushed) is lost and counted as exactly that, the restarted worker captures part
    C, and the capture ends with exit status 1 (data lost). The same run checks what an operator sees: the live
    journal through `dnsprobe inspect`, the Prometheus metrics, the log lines and the summary line (with -q)."""
    (pcap_a, passed_a, expected_a), (pcap_b, passed_b, expected_b), (pcap_c, passed_c, expected_c) = (
        traffic["A"], traffic["B"], traffic["C"])
    port = free_port()
    probe = probes(testbed, out_dir, "--set", f"export.flush_seconds={FLUSH_S}", "--rotate-seconds", 0,
                   "--prometheus-port", port)
    probe.wait_ready()
    testbed.send(pcap_a, pps=2000)
    doc = probe.wait_counter("records", n(expected_a))  # in the journal, within flush_seconds
    assert doc["counters"]["records"] == n(expected_a)
    (journal,) = doc["workers"]["0"]["live_files"]
    assert journal.endswith(".parquet.journal")
    # The live journal of the running capture is readable: inspect a directory reads every file in it.
    live = run_dnsprobe("inspect", out_dir, "--json").stdout.splitlines()
    assert len(live) == n(expected_a)

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = sum(float(v) for v in re.findall(r"^dnsprobe_dns_transactions_total\{[^}]*\} (\S+)$", metrics, re.M))
    assert total == n(expected_a)
    assert metric(metrics, "dnsprobe_dns_transactions_total", rcode="NOERROR", qtype="A", transport="tcp") > 0
    assert metric(metrics, "dnsprobe_dns_response_delay_seconds_count") == n(expected_a)
    assert metric(metrics, "dnsprobe_dns_response_delay_seconds_bucket", le="+Inf") == n(expected_a)
    assert metric(metrics, "dnsprobe_kernel_received_total", worker="0", interface=testbed.iface) == passed_a
    assert metric(metrics, "dnsprobe_interface_up", worker="0", interface=testbed.iface) == 1
    assert metric(metrics, "dnsprobe_worker_up", worker="0") == 1
    assert re.search(r'^dnsprobe_build_info\{parser="fast",python="[\d.]+",version="[^"]+"\} 1\.0$', metrics, re.M)
    assert metric(metrics, "dnsprobe_process_cpu_seconds_total", process="worker", worker="0") > 0
    assert metric(metrics, "dnsprobe_process_resident_memory_bytes", process="supervisor", worker="") > 0
    assert "dpdk" not in metrics  # no always-zero DPDK series under AF_PACKET

    testbed.send(pcap_b, pps=2000)
    doc = probe.wait_counter("packets", passed_a + passed_b)
    victim = doc["workers"]["0"]["pid"]
    os.kill(victim, signal.SIGKILL)  # part B is matched, and not in the file yet (flush_seconds)
    killed_at = time.time_ns()
    assert doc["counters"]["records"] == n(expected_a), "part B was flushed before the kill"
    doc = probe.wait_for(lambda d: d["workers"]["0"]["pid"] != victim and d["workers"]["0"]["interfaces"]
                         and d["recovered_files"], "the restarted worker and the recovered journal")
    testbed.send(pcap_c, pps=2000)
    probe.wait_counter("packets", passed_a + passed_b + passed_c)
    assert probe.stop() == 1, probe.stderr  # data was lost: not a clean run

    rows = rows_of(out_dir)
    assert keys(rows) == expected_a + expected_c  # the restarted worker went on
    older = [r for r in rows if r["query_time"] < killed_at - FLUSH_S * 1e9]
    assert keys(older) == expected_a  # everything older than flush_seconds before the kill is in a file
    doc = probe.stats()
    c = doc["counters"]
    assert c["lost_in_dead_worker"] == n(expected_b)  # the gap, counted
    assert c["worker_restarts"] == 1 and c["records"] == len(rows)  # records: those in files
    assert not list(out_dir.glob("*.journal")) and not list(out_dir.glob("*.part"))
    files = sorted(f.name for f in out_dir.glob("*.parquet"))
    assert doc["files_written"] == files and c["files"] == len(files) == 2
    assert [f["file"] for f in doc["recovered_files"]] == [Path(journal).name.removesuffix(".journal")]
    # Log lines carry the time; the summary line is there with -q.
    stamp = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z dnsprobe: "
    assert all(re.match(stamp, line) for line in probe.lines), probe.stderr
    assert f"pid {victim}" in probe.stderr and f"lost {n(expected_b)} transaction(s)" in probe.stderr
    summary = probe.lines[-1]
    assert "stopped (SIGTERM)" in summary and f"lost in dead workers {c['lost_in_dead_worker']}" in summary


def test_link_down_and_up_during_traffic(testbed, traffic, probes, out_dir):
    """The link goes down after part A and comes back up: no worker restart, the file of part A is closed and
    readable at once, capture resumes on the same socket, and part B is exported too."""
    (pcap_a, passed_a, expected_a), (pcap_b, passed_b, expected_b) = traffic["A"], traffic["B"]
    probe = probes(testbed, out_dir, "--set", "export.flush_seconds=1", "--rotate-seconds", 0)
    probe.wait_ready()
    testbed.send(pcap_a, pps=2000)
    probe.wait_counter("packets", passed_a)
    try:
        subprocess.run(["ip", "link", "set", testbed.iface, "down"], check=True)
        doc = probe.wait_for(lambda d: d["counters"]["capture_interruptions"] == 1 and d["counters"]["files"] == 1,
                             "the interruption, and the file closed")
        assert state(doc, testbed.iface) == "down"
        (first,) = out_dir.glob("*.parquet")
        assert keys(as_rows(pq.read_table(first))) == expected_a
    finally:
        subprocess.run(["ip", "link", "set", testbed.iface, "up"], check=True)
    probe.wait_for(lambda d: state(d, testbed.iface) == "capturing", "capture resumed")
    testbed.send(pcap_b, pps=2000)
    doc = probe.wait_counter("packets", passed_a + passed_b)
    assert probe.stop() == 0, probe.stderr
    c = probe.stats()["counters"]
    assert c["worker_restarts"] == 0 and c["capture_interruptions"] == 1 and c["files"] == 2
    assert keys(rows_of(out_dir)) == expected_a + expected_b
    assert "Network is down" in probe.stderr and "is up again" in probe.stderr


def test_interface_created_after_start_is_waited_for(traffic, probes, out_dir):
    """An interface that does not exist at start is, with --wait-for-interface, a warning and a wait, not an error:
    once it is created (and up), capture starts on it."""
    pcap, passed, expected = traffic["A"]
    late = Testbed("l", pairs=1)
    try:
        probe = probes(late, out_dir, "--set", "export.flush_seconds=1", "--wait-for-interface")
        probe.wait_ready()
        assert f"interface {late.iface!r} does not exist" in probe.stderr and "waiting for it" in probe.stderr
        late.up()
        probe.wait_for(lambda d: state(d, late.iface) == "capturing", "capture on the new interface")
        late.send(pcap, pps=2000)
        probe.wait_counter("packets", passed)
        assert probe.stop() == 0, probe.stderr
        assert keys(rows_of(out_dir)) == expected
        assert "is there and up" in probe.stderr
    finally:
        late.down()


def unfragmented(pcap, out):
    """The capture without its IP fragments (and so without the transactions whose response was fragmented),
    the frames the kernel filter passes, and the expected keys."""
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.utils import rdpcap, wrpcap

    frames = [f for f in rdpcap(str(pcap)) if not (IP in f and (f[IP].flags.MF or f[IP].frag))]
    path = out / "unfragmented.pcap"
    wrpcap(str(path), frames)
    ref = out / "ref"
    ref.mkdir()
    run_dnsprobe("read", path, "-o", ref, "-q", "--no-progress")
    dns = sum(1 for f in frames if (UDP in f or TCP in f) and 53 in (f.sport, f.dport))
    return path, dns, keys(rows_of(ref))


def test_two_captures_share_a_directory_not_a_fanout_group(testbed, traffic, probes, out_dir, tmp_path):
    """Two captures on one interface into one directory, started together: each gets every transaction in files
    of its own (no name is reused, nothing overwritten), each its own statistics file; a third one given the
    first one's fanout group is refused. (Without IP fragments: the kernel reassembles them for one fanout group
    of an interface only, docs/live-capture.md.)"""
    pcap, passed, expected = unfragmented(traffic["A"][0], tmp_path)
    first = probes(testbed, out_dir, "--set", "export.flush_seconds=1")
    second = probes(testbed, out_dir, "--set", "export.flush_seconds=1")
    first.wait_ready()
    second.wait_ready()
    group = first.wait_for(lambda d: d["fanout_groups"], "fanout groups")["fanout_groups"][testbed.iface]
    proc = subprocess.run([sys.executable, "-m", "probe", "capture", "-i", testbed.iface, "-o", str(out_dir), "--set",
                           f"capture.fanout_group={group}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"group {group} is already used on interface {testbed.iface!r}" in proc.stderr
    testbed.send(pcap, pps=2000)
    first.wait_counter("packets", passed)
    second.wait_counter("packets", passed)
    assert first.stop() == 0 and second.stop() == 0, first.stderr + second.stderr
    docs = [first.stats(), second.stats()]
    assert docs[0]["fanout_groups"] != docs[1]["fanout_groups"]
    names = [set(doc["files_written"]) for doc in docs]
    assert names[0] and names[1] and not names[0] & names[1]
    assert names[0] | names[1] == {f.name for f in out_dir.glob("*.parquet")}
    for doc in docs:
        rows = [r for name in doc["files_written"] for r in as_rows(pq.read_table(out_dir / name))]
        assert keys(rows) == expected
    assert len(list(out_dir.glob("*.stats.json"))) == 2


def test_capture_without_root_as_the_hint_says(testbed, traffic, nobody_dir):
    """The no-permission message's advice works: an unprivileged user with CAP_NET_RAW as an ambient capability
    (setpriv, as systemd's AmbientCapabilities= does) captures."""
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv")
    nobody, out = nobody_dir
    pcap, passed, expected = traffic["A"]
    cmd = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--inh-caps", "+net_raw",
           "--ambient-caps", "+net_raw", sys.executable, "-m", "probe", "capture"]
    probe = Probe(testbed, out, "--set", "export.flush_seconds=1", command=cmd)
    try:
        probe.wait_ready()
        testbed.send(pcap, pps=2000)
        probe.wait_counter("packets", passed)
        assert probe.stop() == 0, probe.stderr
    finally:
        probe.kill()
    assert keys(rows_of(out)) == expected
    assert all(f.stat().st_uid == nobody for f in out.glob("*.parquet"))
