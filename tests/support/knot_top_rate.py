"""Knot DNS at the testbed's top rate into a dnstap socket, captured both ways at once: what dnstap misses of
the transactions the packet capture saw answered. Shared by tests/oracle/test_dnstap_top_rate.py (one short
run) and benchmarks/dnstap_loss.py (run after run).

Knot DNS (mod-dnstap, at real-time priority where chrt is found: on a loaded machine its own writer thread
otherwise falls behind and drops by itself) runs in a network namespace, `dnsprobe capture -i lo
--dnstap-socket` captures the same traffic, with a worker away at every flush (a second of rows into a zstd
journal: 80 to 200 ms), and dnsperf sends at 10,000 queries per second. libfstrm drops silently what it cannot
send, so only this comparison shows a loss. Needs root, knotd with knot-module-dnstap, kdig and dnsperf.
"""

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from support.live import Probe
from support.servers import EXAMPLE_ZONE, Netns, knot_config, stop_servers

KNOT = "127.0.0.1"
IDENTITY = "knot-top-rate"
TOP_QPS = 10_000  # the testbed's top rate for Knot DNS under dnsperf
QUERIES = ["www.example.test A", "www.example.test AAAA", "nx.example.test A", "big.example.test TXT",
           "example.test MX"]
SLOW_EXPORT = ["--set", "export.flush_seconds=1", "--set", "export.journal_compression=zstd"]


def transactions(out_dir):
    """(packet capture's transactions to Knot that have a response, dnstap's transactions): keys."""
    import pyarrow.parquet as pq

    columns = ["src", "srcp", "dst", "dstp", "id", "qname", "qtype", "response_present", "server_identity"]
    packets, dnstap = set(), set()
    for f in sorted(Path(out_dir).glob("*.parquet")):
        t = pq.read_table(f, columns=columns).to_pydict()
        for src, srcp, dst, dstp, qid, qname, qtype, answered, who in zip(*(t[c] for c in columns)):
            key = (src, srcp, qid, qname, qtype)
            if who == IDENTITY:
                dnstap.add(key)
            elif who is None and (dst, dstp, answered) == (KNOT, 53, True):
                packets.add(key)
    return packets, dnstap


def _wait(what, until, timeout=30):
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _dnsperf(ns, d, runs_of_dnsperf, run_s):
    """Queries dnsperf had answered, over its runs."""
    completed = 0
    for _ in range(runs_of_dnsperf):
        proc = ns.run("dnsperf", "-s", KNOT, "-d", d / "queries.txt", "-l", run_s, "-Q", TOP_QPS,
                      "-c", "4", "-t", "2", timeout=60)
        if proc.returncode:
            raise RuntimeError(proc.stdout + proc.stderr)
        completed += int(re.search(r"Queries completed:\s+(\d+)", proc.stdout).group(1))
    return completed


def one_run(runs_of_dnsperf, run_s, tag="dl"):
    """One run's figures: queries answered, transactions seen by packet capture, missing from dnstap, the
    probe's kernel drops, the load average at the start."""
    d = Path(tempfile.mkdtemp(prefix="dnsprobe-loss-", dir="/tmp"))  # short: a Unix socket path has 107 bytes
    os.chmod(d, 0o755)
    ns = Netns(tag).up()
    knot, probe = None, None
    load = os.getloadavg()[0]
    try:
        (d / "knot" / "db").mkdir(parents=True)
        (d / "out").mkdir()
        (d / "knot" / "example.test.zone").write_text(EXAMPLE_ZONE)
        (d / "queries.txt").write_text("\n".join(QUERIES) + "\n")
        (d / "knot.conf").write_text(knot_config(d, d / "tap.sock", None, IDENTITY))
        probe = Probe(None, d / "out", "-i", "lo", "--dnstap-socket", d / "tap.sock", "--dnstap-socket-mode", "0666",
                      *SLOW_EXPORT, netns=ns.name)
        probe.wait_ready()
        realtime = ["chrt", "-f", "20"] if shutil.which("chrt") else []
        knot = ns.start(d / "knot.log", *realtime, "knotd", "-c", d / "knot.conf")
        _wait("Knot's START", lambda: "started" in probe.stderr)
        _wait("Knot's answer", lambda: ns.kdig(KNOT, "www.example.test") is not None)
        completed = 1 + _dnsperf(ns, d, runs_of_dnsperf, run_s)
        time.sleep(1)  # what Knot still holds (it writes every ~50 ms)
        stop_servers([knot])
        _wait("Knot's STOP", lambda: probe.stats()["counters"]["dnstap_disconnections"] >= 1, timeout=10)
        if probe.stop() != 0:
            raise RuntimeError(probe.stderr)
        counters = probe.stats()["counters"]
        packets, dnstap = transactions(d / "out")
        return {"completed": completed, "transactions": len(packets), "lost": len(packets - dnstap),
                "kernel_drops": counters["kernel_drops"], "load_average": round(load, 2)}
    finally:
        stop_servers([knot] if knot else [])
        if probe is not None:
            probe.kill()
        ns.down()
        shutil.rmtree(d, ignore_errors=True)
