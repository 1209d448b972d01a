"""dnstap socket loss: what Knot DNS sends at 10,000 queries per second that dnstap misses, run after run.

    python benchmarks/dnstap_loss.py              # 10 runs
    python benchmarks/dnstap_loss.py --runs 3 --no-save

Each run (tests/support/knot_top_rate.py): Knot DNS (mod-dnstap, at real-time priority where chrt is found) in
a network namespace, `dnsprobe capture -i lo --dnstap-socket` capturing the same traffic both ways, with a
worker away at every flush (a second of rows into a zstd journal: 80 to 200 ms), dnsperf 3 times 4 s at 10,000
queries per second. The loss: the transactions the packet capture saw answered that are not in dnstap.
libfstrm drops silently what it cannot send, so only this comparison shows it. The same scenario, shortened
(2 times 4 s, repeated once when it lost), is the test tests/oracle/test_dnstap_top_rate.py; this measures how
often a run loses, which that test's repeat assumes is rare (docs/dnstap.md, Sockets: 1 run in 20 with the
receiver's 1 ms sleep). Needs root, knotd with knot-module-dnstap, kdig and dnsperf. Results:
benchmarks/results/dnstap_loss.json and .md.
"""

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' support package: Knot's configuration, the namespace, the probe

import offline  # noqa: E402  (benchmarks/ is not a package: the machine description, results)
from support.knot_top_rate import TOP_QPS, one_run  # noqa: E402
from support.servers import missing_servers  # noqa: E402

RUNS_OF_DNSPERF, RUN_S = 3, 4


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
        samples.append(one_run(RUNS_OF_DNSPERF, RUN_S))
        r = samples[-1]
        print(f"run {i + 1}/{args.runs}: {r['lost']:,} of {r['transactions']:,} lost (load {r['load_average']})",
              flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    res = {"runs": args.runs, "commit": commit, "machine": offline.machine(), "samples": samples}
    offline.report("dnstap_loss", res, markdown(res), not args.no_save)


if __name__ == "__main__":
    sys.exit(main())
