"""dnstap socket loss: what Knot DNS sends at 10,000 queries per second that dnstap misses, run after run.

    python benchmarks/dnstap_loss.py              # 10 runs
    python benchmarks/dnstap_loss.py --runs 3 --no-save

Each run: Knot DNS (mod-dnstap, at real-time priority where chrt is found: on a loaded machine its own writer
thread otherwise falls behind and drops by itself) in a network namespace, `dnsprobe capture -i lo
--dnstap-socket` capturing the same traffic both ways, with a worker away at every flush (a second of rows
into a zstd journal: 80 to 200 ms), dnsperf 3 times 4 s at 10,000 queries per second. The loss: the
transactions the packet capture saw answered that are not in dnstap. libfstrm drops silently what it cannot
send, so only this comparison shows it. It was a test (tests/oracle/test_dnstap_servers.py); on a loaded
2-core machine it failed now and then, with the C receiver too, so it is measured here (docs/dnstap.md,
Sockets). Needs root, knotd with knot-module-dnstap, kdig and dnsperf. Results:
benchmarks/results/dnstap_loss.json and .md.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' support package: Knot's configuration, the namespace, the probe

import offline  # noqa: E402  (benchmarks/ is not a package: the machine description, results)
from support.live import Probe  # noqa: E402
from support.servers import EXAMPLE_ZONE, Netns, knot_config, missing_servers, stop_servers  # noqa: E402

KNOT = "127.0.0.1"
IDENTITY = "knot-top-rate"
TOP_QPS = 10_000  # the testbed's top rate for Knot DNS under dnsperf
RUNS_OF_DNSPERF, RUN_S = 3, 4
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


def wait(what, until, timeout=30):
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def one_run():
    """One run's figures: transactions seen by packet capture, missing from dnstap, the load average."""
    d = Path(tempfile.mkdtemp(prefix="dnsprobe-loss-", dir="/tmp"))
    os.chmod(d, 0o755)
    ns = Netns("dl").up()
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
        wait("Knot's START", lambda: "started" in probe.stderr)
        wait("Knot's answer", lambda: ns.kdig(KNOT, "www.example.test") is not None)
        completed = 1
        for _ in range(RUNS_OF_DNSPERF):
            proc = ns.run("dnsperf", "-s", KNOT, "-d", d / "queries.txt", "-l", RUN_S, "-Q", TOP_QPS,
                          "-c", "4", "-t", "2", timeout=60)
            if proc.returncode:
                raise RuntimeError(proc.stdout + proc.stderr)
            completed += int(re.search(r"Queries completed:\s+(\d+)", proc.stdout).group(1))
        time.sleep(1)  # what Knot still holds (it writes every ~50 ms)
        stop_servers([knot])
        wait("Knot's STOP", lambda: probe.stats()["counters"]["dnstap_disconnections"] >= 1, timeout=10)
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


def markdown(res):
    lines = [f"# dnstap socket loss ({res['runs']} runs)", "",
             f"Knot DNS at {TOP_QPS:,} queries per second, {RUNS_OF_DNSPERF} x {RUN_S} s per run; commit "
             f"{res['commit']}; {res['machine']['cpu_model']}, {res['machine']['logical_cpus']} CPUs", "",
             "| run | load average | transactions | lost |", "|---|---|---|---|"]
    for i, r in enumerate(res["samples"], 1):
        lines.append(f"| {i} | {r['load_average']} | {r['transactions']:,} | {r['lost']:,} |")
    lost = [r["lost"] for r in res["samples"]]
    lines += ["", f"Runs with a loss: {sum(1 for n in lost if n)} of {len(lost)}; lost at most {max(lost):,}.", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/dnstap_loss.*")
    args = ap.parse_args()
    missing = missing_servers("knotd", "kdig", "dnsperf")
    if missing:
        sys.exit(f"missing: {missing}")
    samples = []
    for i in range(args.runs):
        samples.append(one_run())
        r = samples[-1]
        print(f"run {i + 1}/{args.runs}: {r['lost']:,} of {r['transactions']:,} lost (load {r['load_average']})",
              flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    res = {"runs": args.runs, "commit": commit, "machine": offline.machine(), "samples": samples}
    offline.report("dnstap_loss", res, markdown(res), not args.no_save)


if __name__ == "__main__":
    sys.exit(main())
