"""Shared test helpers: run the real `dnsprobe` command and read back what it wrote."""

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
DNSPROBE_DATA = SHARED / "data" / "dns-probe"
COMPACTOR_DATA = SHARED / "data" / "compactor"


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
    """Records as dicts; timestamp columns as integer nanoseconds (exact, no datetime rounding)."""
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.int64()))
    return table.to_pylist()


def dnsprobe_read(pcap, out_dir, *extra):
    """Run `dnsprobe read PCAP -o OUT_DIR` and return the records as a list of dicts."""
    run_dnsprobe("read", pcap, "-o", out_dir, "-q", "--no-progress", *extra)
    return as_rows(read_output(out_dir))


# Columns DNS Probe's own tests do not compare: it stamps rows with the wall clock.
DNSPROBE_IGNORED = {"unixtime", "time", "time_micro", "tcp_hs_rtt"}


def assert_rows_equal_dnsprobe(expected_file, rows, label):
    """Our rows equal DNS Probe's expected Parquet file, row by row in order, on every column it compares."""
    expected = pq.read_table(expected_file)
    assert len(rows) == expected.num_rows, f"{label}: {len(rows)} rows, DNS Probe has {expected.num_rows}"
    columns = [c for c in expected.column_names if c not in DNSPROBE_IGNORED]
    for i, (want, got) in enumerate(zip(expected.select(columns).to_pylist(), rows)):
        diff = {c: (want[c], got[c]) for c in columns if want[c] != got[c]}
        assert not diff, f"{label} row {i}: (expected, ours) {diff}"


@pytest.fixture
def out_dir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d

