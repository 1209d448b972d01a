"""`dnsprobe inspect --summary` on 10 million records: how long the summary of a large data set takes.

    python benchmarks/summary.py                  # 10 files of the standard mix's ~1M transactions each, 3 rounds
    python benchmarks/summary.py --copies 2 --rounds 1   # 2M records, one round (a quick look)
    python benchmarks/summary.py --data DIR      # the data sets kept in DIR, and reused by the next run

The data set is real `dnsprobe read` output: the standard mix (benchmarks/traffic.py, 2,120,000 packets: about
1,000,000 transactions) read into one Parquet file, then written `--copies` times into a directory by the product's
own Parquet writer settings (export/parquet/writer.py's open_parquet: dictionaries, delta-encoded times, row groups
of export.row_group_size), copy k with its times moved k spans later, so that the data set is one long capture.
Two data sets:

- `standard mix`: the copies as read (a few thousand names and clients, as the mix draws them);
- `unique names`: every record's QNAME given a label of its own (`<copy>-<row>.` before it), the worst case of
  a random-subdomain flood: ten million distinct names to count, each looked up in the Public Suffix List.

Registered domains are not in the files (enrichment off, the default), so the summary finds them itself. Each run
is the real command, `dnsprobe inspect --summary DIR --json`, pinned to one core (offline.run_measured), charged
its CPU time; the figure is the median over the rounds. For scale, each round also times DuckDB (one thread, the
same core) answering one of the summary's questions in SQL, the ten most frequent QNAMEs with their number of
distinct ones. Results: benchmarks/results/summary.json and summary.md.
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's dnsprobe, whatever the virtualenv installed

import offline  # noqa: E402
import traffic  # noqa: E402

# `python -m probe` run in this checkout (offline.run_measured's working directory): the code measured is this one's.
COMMAND = [sys.executable, "-m", "probe"]
PACKETS = 2_120_000  # of the standard mix: about 1,000,000 transactions
TIME_COLUMNS = ("unixtime", "time", "query_time", "response_time")  # moved together; time_micro stays
DATA_SETS = ("standard mix", "unique names")


def base_table(tmp):
    """The standard mix's transactions as `dnsprobe read` writes them, one Arrow table."""
    import pyarrow.parquet as pq

    pcap = traffic.generate("standard", PACKETS, 1)
    out = Path(tmp) / "read"
    out.mkdir()
    offline.compile_bytecode(offline.ROOT)
    offline.run_measured([*COMMAND, "read", str(pcap), "-o", str(out), "-q", "--no-progress"],
                         offline.pinned_core())
    return pq.read_table(sorted(out.glob("*.parquet")))


def shifted(table, k, span_us, unique_names):
    """Copy k of the table: its times k spans later; with unique_names, each QNAME prefixed by a label of its own."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name in TIME_COLUMNS:
        column = table.column(name)
        step = span_us // 1_000_000 if name == "unixtime" else span_us
        if pa.types.is_timestamp(column.type):
            moved = pc.add(column.cast(pa.int64()), step * k).cast(column.type)
        else:
            moved = pc.add(column, step * k)
        table = table.set_column(table.schema.get_field_index(name), name, moved)
    if unique_names:
        rows = pa.array(range(table.num_rows)).cast(pa.string())
        labels = pc.binary_join_element_wise(str(k), rows, "-")
        qnames = pc.binary_join_element_wise(labels, table.column("qname"), ".")
        table = table.set_column(table.schema.get_field_index("qname"), "qname", qnames)
    return table


def write_dataset(table, directory, copies, unique_names):
    """`copies` Parquet files in directory, written with the product's writer settings; their number of records."""
    from export.parquet.writer import open_parquet
    from probe.config import load_config

    export_cfg = load_config().export
    first, last = table.column("time")[0].as_py(), table.column("time")[-1].as_py()
    span_us = (last - first) // 1_000_000 * 1_000_000 + 1_000_000  # whole seconds: unixtime moves with time
    directory.mkdir()
    for k in range(copies):
        writer, sink = open_parquet(directory / f"dnsprobe.copy{k:02d}.w0.parquet", export_cfg)
        writer.write_table(shifted(table, k, span_us, unique_names), row_group_size=export_cfg.row_group_size)
        writer.close()
        sink.close()
    return table.num_rows * copies


# The command as `python -m probe` runs it (probe.console.run), writing its peak memory (VmHWM) to the file argv[1]
# as it exits. The child's rusage cannot tell it: its maxrss starts at this (large) process's, from the fork.
PEAK_MEMORY_WRAPPER = """
import atexit, sys
out = sys.argv.pop(1)

def peak():
    with open("/proc/self/status") as status, open(out, "w") as f:
        f.write(next(line.split()[1] for line in status if line.startswith("VmHWM")))

atexit.register(peak)
from probe.console import run
sys.exit(run())
"""


def measure(directory, core):
    with tempfile.NamedTemporaryFile("r") as peak:
        stdout, m = offline.run_measured([sys.executable, "-c", PEAK_MEMORY_WRAPPER, peak.name, "inspect",
                                          "--summary", str(directory), "--json"], core)
        m["max_rss_mb"] = round(int(peak.read()) / 1024, 1)
    m["summary"] = json.loads(stdout)
    return m


# DuckDB's answer to one question of the summary, for scale: the top QNAMEs and how many distinct ones.
DUCKDB_QUERY = """
import duckdb, sys
con = duckdb.connect()
con.execute("set threads = 1")
files = sys.argv[1] + "/*.parquet"
con.execute(f"select qname, count(*) c from '{files}' group by 1 order by c desc, qname limit 10").fetchall()
con.execute(f"select count(distinct qname) from '{files}'").fetchall()
"""


def measure_duckdb(directory, core):
    _, m = offline.run_measured([sys.executable, "-c", DUCKDB_QUERY, str(directory)], core)
    return m


def markdown(res):
    lines = [
        "# `dnsprobe inspect --summary` on a large data set",
        "",
        f"{res['started']}: {res['copies']} copies of the standard mix's transactions, {res['rounds']} rounds, median "
        f"on one core (machine: {res['machine']['cpu_model']}, load at start {res['machine']['load_average_at_start']}"
        f"); commit {res['code'].get('git_commit') or '?'}.",
        "",
        "| data set | records | distinct QNAMEs | CPU s | wall s | records per CPU-second | max RSS MiB | DuckDB, top "
        "QNAMEs only: CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, v in res["data_sets"].items():
        lines.append(f"| {name} | {v['records']:,} | {v['distinct_qnames']:,} | {v['cpu_seconds']:.2f} | "
                     f"{v['wall_seconds']:.2f} | {v['records_per_cpu_second']:,} | {v['max_rss_mb']:,.0f} | "
                     f"{v['duckdb_top_qnames_cpu_seconds']:.2f} |")
    return "\n".join(lines) + "\n"


def data_sets_in(top, copies, tmp, names=DATA_SETS):
    """{name: (directory, records)} of the data sets (of DATA_SETS) under top, written unless there already."""
    import pyarrow.parquet as pq

    dirs = {name: top / f"{name.replace(' ', '-')}-{copies}" for name in names}
    table = None
    out = {}
    for name, directory in dirs.items():
        if not directory.is_dir():
            table = base_table(tmp) if table is None else table
            part = directory.with_name(directory.name + ".part")  # an interrupted writing is not reused
            shutil.rmtree(part, ignore_errors=True)
            write_dataset(table, part, copies, name == "unique names")
            part.rename(directory)
        out[name] = directory, sum(pq.read_metadata(f).num_rows for f in directory.glob("*.parquet"))
    return out


def run_rounds(args, tmp, core):
    """The measurements of each data set, round by round (the data sets alternated), and their records."""
    if args.data:
        args.data.mkdir(parents=True, exist_ok=True)
    data = data_sets_in(args.data or tmp, args.copies, tmp)
    samples = {name: [] for name in data}
    for i in range(args.rounds):
        for name, (directory, records) in data.items():
            m = measure(directory, core)
            assert m["summary"]["records"] == records, (m["summary"]["records"], records)
            m["duckdb"] = measure_duckdb(directory, core)
            samples[name].append(m)
            print(f"round {i + 1}/{args.rounds} {name}: {m['cpu_seconds']:.2f} s CPU, {m['wall_seconds']:.2f} s",
                  flush=True)
    return samples, {name: records for name, (_, records) in data.items()}


def add_data_set_options(ap):
    """The flags of a benchmark of these data sets (data_sets_in): their size, where they are kept, rounds, core."""
    ap.add_argument("--copies", type=int, default=10, help="files of about 1M records each (default 10)")
    ap.add_argument("--rounds", type=int, default=3)
    offline.add_core_option(ap)
    ap.add_argument("--data", type=Path, help="where to write the data sets and keep them (a later run with the same "
                    "--data and --copies reuses them); default: a temporary directory")
    ap.add_argument("--no-save", action="store_true")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_set_options(ap)
    args = ap.parse_args(argv)
    core = offline.pinned_core(args.core)
    started = offline.started_utc()
    with tempfile.TemporaryDirectory(prefix="dnsprobe-summary-bench-") as tmp:
        samples, records = run_rounds(args, Path(tmp), core)
    data_sets = {}
    for name, runs in samples.items():
        cpu = statistics.median(r["cpu_seconds"] for r in runs)
        data_sets[name] = {
            "records": records[name],
            "distinct_qnames": runs[0]["summary"]["qnames"]["distinct"],
            "cpu_seconds": cpu,
            "cpu_seconds_all": [r["cpu_seconds"] for r in runs],
            "wall_seconds": statistics.median(r["wall_seconds"] for r in runs),
            "records_per_cpu_second": round(records[name] / cpu),
            "max_rss_mb": max(r["max_rss_mb"] for r in runs),
            "duckdb_top_qnames_cpu_seconds": statistics.median(r["duckdb"]["cpu_seconds"] for r in runs),
        }
    res = {"started": started, "copies": args.copies, "rounds": args.rounds, "machine": offline.machine(),
           "code": offline.code(), "data_sets": data_sets}
    res["code"]["dnsprobe_command"] = "python -m probe inspect --summary DIR --json"
    offline.report("summary", res, markdown(res), save=not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
