"""Running the real `dnsprobe` command (and Python in a fresh interpreter), and reading back what it wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from support.data import ROOT


def copy_env():
    """The environment for running a copy of the package that stands for an install without an extension: not
    pointed at another build of the extensions (make test-asan sets DNSPROBE_NATIVE_DIR, which would supply it)."""
    return {k: v for k, v in os.environ.items() if k != "DNSPROBE_NATIVE_DIR"}


def run_python(code, *args):
    """Run Python code (sys.argv[1:]: args) in a fresh interpreter from the repository's root (a crash there fails
    the test instead of ending the test run); returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def run_dnsprobe(*args, check=True):
    """Run `python -m probe ARGS`; returns CompletedProcess (text). check=True asserts exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "probe", *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )
    if check:
        assert proc.returncode == 0, f"dnsprobe {args} failed ({proc.returncode}):\n{proc.stderr}"
    return proc


def read_output(directory):
    """All records written to a directory, in file-name order, as one Arrow table."""
    files = sorted(Path(directory).glob("*.parquet"))
    assert files, f"no parquet files in {directory}"
    return pa.concat_tables([pq.read_table(f) for f in files])


def as_rows(table):
    """Records as dicts; timestamp columns as integer nanoseconds since the epoch (exact, whatever the unit
    written: microseconds today), so that tests compare them with the capture's nanoseconds through at_us()."""
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64()))
    return table.to_pylist()


def at_us(ns):
    """A capture time in nanoseconds as the output stores it: cut to the microsecond (whole nanoseconds)."""
    return ns - ns % 1000


def dnsprobe_read(pcap, out_dir, *extra):
    """Run `dnsprobe read PCAP -o OUT_DIR` and return the records as a list of dicts."""
    run_dnsprobe("read", pcap, "-o", out_dir, "-q", "--no-progress", *extra)
    return as_rows(read_output(out_dir))


def probe_run(pcap, out_dir, *extra):
    """`dnsprobe read PCAP -o OUT_DIR EXTRA`; returns (rows, counters).

    Like dnsprobe_read, with the statistics; timestamps as integer nanoseconds (as_rows). No Parquet file → no rows.
    """
    out_dir.mkdir(exist_ok=True)
    run_dnsprobe("read", *(pcap if isinstance(pcap, (list, tuple)) else [pcap]), "-o", out_dir, "-q",
                 "--no-progress", *extra)
    stats_files = list(out_dir.glob("*.stats.json"))
    assert len(stats_files) == 1, stats_files
    counters = json.loads(stats_files[0].read_text())["counters"]
    if not list(out_dir.glob("*.parquet")):
        return [], counters
    return as_rows(read_output(out_dir)), counters


def rows_of(out_dir, pattern="*.parquet"):
    files = sorted(Path(out_dir).glob(pattern))
    return [row for f in files for row in as_rows(pq.read_table(f))]


def by_id(rows):
    out = {r["id"]: r for r in rows}
    assert len(out) == len(rows), f"duplicate ids in {rows}"
    return out


# Columns DNS Probe's own tests do not compare: it stamps rows with the wall clock.
DNSPROBE_IGNORED = {"unixtime", "time", "time_micro", "tcp_hs_rtt"}


def assert_rows_equal_dnsprobe(expected_file, rows, label):
    """Our rows equal DNS Probe's expected Parquet file, row by row, on every column it compares. Both sorted by
    those columns: DNS Probe writes a transaction when it completes, we in the order of capture time (the
    timestamp column)."""
    expected = pq.read_table(expected_file)
    assert len(rows) == expected.num_rows, f"{label}: {len(rows)} rows, DNS Probe has {expected.num_rows}"
    columns = [c for c in expected.column_names if c not in DNSPROBE_IGNORED]

    def in_order(records):
        return sorted(({c: r[c] for c in columns} for r in records), key=lambda r: [repr(r[c]) for c in columns])

    for i, (want, got) in enumerate(zip(in_order(expected.select(columns).to_pylist()), in_order(rows))):
        diff = {c: (want[c], got[c]) for c in columns if want[c] != got[c]}
        assert not diff, f"{label} row {i}: (expected, ours) {diff}"
