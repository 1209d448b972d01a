"""`dnsprobe inspect` for people and for programs, on the bundled sample: the table in ISO times with QTYPE and
RCODE names, fitting a 120-column terminal, saying how many records it did not show; --json with every record
and the numbers as stored; a directory meaning every output file in it, Parquet and C-DNS alike."""

import json
import re

import pyarrow.parquet as pq
import pytest
from support.data import ROOT
from support.dnsprobe import run_dnsprobe

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The sample read into Parquet and into C-DNS (xz), in one directory."""
    out = tmp_path_factory.mktemp("inspect")
    run_dnsprobe("read", SAMPLE, "-o", out, "-q", "--no-progress")
    run_dnsprobe("read", SAMPLE, "-o", out, "-q", "--no-progress", "--format", "cdns", "--cdns-compression", "xz")
    (parquet,) = out.glob("*.parquet")
    (cdns,) = out.glob("*.cdns.xz")
    return out, parquet, cdns, pq.read_metadata(parquet).num_rows


def test_table_for_people(outputs):
    _, parquet, _, records = outputs
    text = run_dnsprobe("inspect", parquet).stdout
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120
    assert lines[-1] == f"… {records - 20:,} more records (--limit N prints N, --limit 0 all)"
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 20
    assert all(re.match(r"│ \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z │", row) for row in rows)
    cells = {cell.strip() for row in rows for cell in row.split("│")}
    assert {"NOERROR", "A", "AAAA", "UDP"} <= cells and "28" not in cells
    everything = run_dnsprobe("inspect", parquet, "--limit", "0").stdout
    assert "more record" not in everything and sum(1 for x in everything.splitlines() if x.startswith("│")) == records
    wide = run_dnsprobe("inspect", parquet, "--limit", "2", "--all-columns").stdout
    assert "edns_client_subnet" in wide  # asked for: as wide as it takes


def test_json_for_programs(outputs):
    _, parquet, _, records = outputs
    lines = run_dnsprobe("inspect", parquet, "--json").stdout.splitlines()
    assert len(lines) == records  # every record unless --limit
    first = json.loads(lines[0])
    assert isinstance(first["qtype"], int) and isinstance(first["rcode"], int) and isinstance(first["time"], int)
    assert len(run_dnsprobe("inspect", parquet, "--json", "--limit", "3").stdout.splitlines()) == 3


def test_a_directory_means_every_output_file_in_it(outputs):
    out, parquet, cdns, records = outputs
    from_dir = run_dnsprobe("inspect", out, "--json", "--columns", "id,qname,qtype,rcode").stdout.splitlines()
    from_files = run_dnsprobe("inspect", *sorted([cdns, parquet]), "--json", "--columns",
                              "id,qname,qtype,rcode").stdout.splitlines()
    assert from_dir == from_files and len(from_dir) == 2 * records
    # C-DNS and Parquet of the same capture: the same records (Parquet's in the order of their timestamp)
    assert sorted(from_dir[:records]) == sorted(from_dir[records:])


def test_a_hive_dataset_is_read_from_its_top_directory(tmp_path):
    out = tmp_path / "hive"
    out.mkdir()
    run_dnsprobe("read", SAMPLE, "-o", out, "-q", "--no-progress", "--set", "export.layout=hive",
                 "--set", "export.server_name=probe1")
    files = list(out.rglob("*.parquet"))
    assert files and all("server=probe1" in str(f.parent) for f in files)
    records = sum(pq.read_metadata(f).num_rows for f in files)
    assert len(run_dnsprobe("inspect", out, "--json").stdout.splitlines()) == records
