"""`dnsprobe report` on 10 million records: how long the HTML report of a large data set takes.

    python benchmarks/report.py                   # 10 files of the standard mix's ~1M transactions each, 3 rounds
    python benchmarks/report.py --unique-names    # also the worst case: every record's QNAME a name of its own
    python benchmarks/report.py --data DIR        # the data sets kept in DIR (those of benchmarks/summary.py)

The data sets are benchmarks/summary.py's (real `dnsprobe read` output of the standard mix, written `--copies`
times as one long capture); each run is the real command, `dnsprobe report DIR -o FILE`, pinned to one core
(offline.run_measured), charged its CPU time; the figure is the median over the rounds. The report counts what
`inspect --summary` counts and more (the timeline by RCODE, delays by transport, EDNS, TC), then draws its plots:
the difference between the two benchmarks is the report's own cost. Results: benchmarks/results/report.json and
report.md.
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's dnsprobe, whatever the virtualenv installed

import offline  # noqa: E402
import summary  # noqa: E402

LIMIT_SECONDS = 30  # the wall time a report of 10M records must take at most (issue 34)


def measure(directory, core, out):
    stdout, m = offline.run_measured([*summary.COMMAND, "report", str(directory), "-o", str(out)], core)
    m["stdout"] = stdout.strip()
    m["html_bytes"] = out.stat().st_size
    return m


def markdown(res):
    lines = [
        "# `dnsprobe report` on a large data set",
        "",
        f"{res['started']}: {res['copies']} copies of the standard mix's transactions, {res['rounds']} rounds, median "
        f"on one core (machine: {res['machine']['cpu_model']}, load at start {res['machine']['load_average_at_start']}"
        f"); commit {res['code'].get('git_commit') or '?'}. Limit: {LIMIT_SECONDS} s wall.",
        "",
        "| data set | records | CPU s | wall s | records per CPU-second | HTML KiB |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in res["data_sets"].items():
        lines.append(f"| {name} | {v['records']:,} | {v['cpu_seconds']:.2f} | {v['wall_seconds']:.2f} | "
                     f"{v['records_per_cpu_second']:,} | {v['html_bytes'] / 1024:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    summary.add_data_set_options(ap)
    ap.add_argument("--unique-names", action="store_true", help="also the data set of ten million distinct names")
    args = ap.parse_args(argv)
    core = offline.pinned_core(args.core)
    started = offline.started_utc()
    names = summary.DATA_SETS if args.unique_names else summary.DATA_SETS[:1]
    samples = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="dnsprobe-report-bench-") as tmp:
        if args.data:
            args.data.mkdir(parents=True, exist_ok=True)
        data = summary.data_sets_in(args.data or Path(tmp), args.copies, Path(tmp), names)
        for i in range(args.rounds):
            for name, (directory, records) in data.items():
                m = measure(directory, core, Path(tmp) / "report.html")
                assert m["stdout"].split(": ")[1].startswith(f"{records:,} records"), m["stdout"]
                samples[name].append(m)
                print(f"round {i + 1}/{args.rounds} {name}: {m['cpu_seconds']:.2f} s CPU, {m['wall_seconds']:.2f} s",
                      flush=True)
    data_sets = {}
    for name, runs in samples.items():
        records = data[name][1]
        cpu = statistics.median(r["cpu_seconds"] for r in runs)
        data_sets[name] = {"records": records, "cpu_seconds": cpu, "cpu_seconds_all": [r["cpu_seconds"] for r in runs],
                           "wall_seconds": statistics.median(r["wall_seconds"] for r in runs),
                           "wall_seconds_all": [r["wall_seconds"] for r in runs],
                           "records_per_cpu_second": round(records / cpu), "html_bytes": runs[0]["html_bytes"]}
    res = {"started": started, "copies": args.copies, "rounds": args.rounds, "machine": offline.machine(),
           "code": offline.code(), "data_sets": data_sets, "limit_wall_seconds": LIMIT_SECONDS}
    res["code"]["dnsprobe_command"] = "python -m probe report DIR -o FILE"
    offline.report("report", res, markdown(res), save=not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
