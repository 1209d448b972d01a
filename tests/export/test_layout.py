"""The dataset layout (export.layout hive), rotation by size, the page index and sorting: files under
year=/month=/day=[/hour=]/server= by the transactions' capture time, never two partitions in a file, the same rows
as the flat layout, read back by DuckDB with hive partitioning; statistics beside the dataset, not in it."""

import datetime
import json
import struct
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from scapy.layers.dns import DNS, DNSQR
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap
from support.data import ROOT
from support.dnsprobe import read_output, run_dnsprobe
from support.frames import udp_frame
from support.messages import q_dns

from export.parquet.schema import UNCOMPRESSED
from export.parquet.writer import PAGE_ROWS

MIDNIGHT = datetime.datetime(2026, 12, 3, tzinfo=datetime.timezone.utc).timestamp()
SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"


def around_midnight(path):
    """Transactions every 0.25 s from 23:59:58 to 00:00:02 UTC, and queries without a response among them, one of
    them at 23:59:59.9 (exported after midnight, when it times out: its row belongs to the day before)."""
    frames = []
    for i in range(16):
        t = MIDNIGHT - 2 + i * 0.25
        client = f"198.51.100.{i + 1}"
        q = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:35") / IP(src=client, dst="192.0.2.53") / UDP(
            sport=30000 + i, dport=53) / DNS(id=i, rd=1, qd=DNSQR(qname=f"n{i}.example.com"))
        q.time = t
        frames.append(q)
        if i % 4 != 3:
            r = Ether(src="02:00:00:00:00:35", dst="02:00:00:00:00:01") / IP(src="192.0.2.53", dst=client) / UDP(
                sport=53, dport=30000 + i) / DNS(id=i, qr=1, rcode=i % 3, qd=DNSQR(qname=f"n{i}.example.com"))
            r.time = t + 0.01
            frames.append(r)
    late = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:35") / IP(src="198.51.100.99", dst="192.0.2.53") / UDP(
        sport=29999, dport=53) / DNS(id=99, qd=DNSQR(qname="late.example.com"))
    late.time = MIDNIGHT - 0.1
    frames.append(late)
    frames.sort(key=lambda f: f.time)
    wrpcap(str(path), frames)
    return path


def partition_of(time_us, hour=False):
    t = datetime.datetime.fromtimestamp(time_us // 1_000_000, datetime.timezone.utc)
    parts = [f"year={t.year}", f"month={t.month}", f"day={t.day}"] + ([f"hour={t.hour}"] if hour else [])
    return "/".join(parts)


def files_of(out):
    return sorted(p for p in Path(out).rglob("*.parquet"))


@pytest.mark.parametrize("hour", [False, True])
def test_hive_partitions_by_capture_time_and_server(tmp_path, hour):
    pcap = around_midnight(tmp_path / "midnight.pcap")
    flat, hive = tmp_path / "flat", tmp_path / "hive"
    flat.mkdir()
    hive.mkdir()
    run_dnsprobe("read", pcap, "-o", flat, "-q")
    run_dnsprobe("read", pcap, "-o", hive, "-q", "--set", "export.layout=hive", "--set", "export.server_name=ns1",
                 "--set", f"export.partition_hour={str(hour).lower()}")
    # Beside the dataset, under a name engines skip (Hadoop's '_'): nothing else at the top but the partitions.
    (stats_file,) = [p for p in hive.iterdir() if not p.name.startswith("year=")]
    assert stats_file.name.startswith("_dnsprobe.") and stats_file.name.endswith(".stats.json")
    stats = json.loads(stats_file.read_text())["counters"]
    seen = Counter()
    for f in files_of(hive):
        rel = f.parent.relative_to(hive).as_posix()
        assert rel.endswith("/server=ns1")
        table = pq.read_table(f, partitioning=None)
        partitions = {partition_of(t, hour) for t in table.column("time").to_pylist()}
        assert partitions == {rel.removesuffix("/server=ns1")}, f  # a file never mixes partitions
        assert set(table.column("server_location").to_pylist()) == {"ns1"}
        seen[rel] += table.num_rows
    day2, day3 = "year=2026/month=12/day=2", "year=2026/month=12/day=3"
    expected = {f"{day2}/hour=23/server=ns1": 9, f"{day3}/hour=0/server=ns1": 8} if hour else {
        f"{day2}/server=ns1": 9, f"{day3}/server=ns1": 8}
    assert dict(seen) == expected and sum(seen.values()) == stats["records"] == 17
    # The same rows as the flat layout (but server_location).
    rows = lambda t: sorted(map(str, t.drop_columns(["server_location"]).to_pylist()))  # noqa: E731
    assert rows(read_output(flat)) == rows(pq.read_table(files_of(hive), partitioning=None))
    duckdb = pytest.importorskip("duckdb", reason="pip install duckdb (in the test extras)")
    con = duckdb.connect()
    rel = f"read_parquet('{hive}/**/*.parquet', hive_partitioning = true)"
    got = con.execute(f"SELECT year, month, day, server, count(*) FROM {rel} GROUP BY ALL ORDER BY ALL").fetchall()
    assert got == [(2026, 12, 2, "ns1", 9), (2026, 12, 3, "ns1", 8)]
    want = Counter(read_output(flat).column("rcode").to_pylist())
    assert dict(con.execute(f"SELECT rcode, count(*) FROM {rel} GROUP BY rcode").fetchall()) == dict(want)


def test_empty_server_name_and_bad_settings(tmp_path, out_dir):
    pcap = around_midnight(tmp_path / "m.pcap")
    run_dnsprobe("read", pcap, "-o", out_dir, "-q", "--set", "export.layout=hive", "--set", "export.server_name=''")
    assert {f.parent.name for f in files_of(out_dir)} == {"server=__default__"}
    for setting, problem in (("export.server_name=a/b", "is not a server name"),
                             ("export.server_name=x=y", "is not a server name")):
        proc = run_dnsprobe("read", pcap, "-o", out_dir, "-q", "--set", setting, check=False)
        assert proc.returncode == 2 and problem in proc.stderr, proc.stderr
    proc = run_dnsprobe("read", pcap, "-o", out_dir, "-q", "--format", "cdns", "--set", "export.layout=hive",
                        check=False)
    assert proc.returncode == 2 and "'export.layout': 'hive' is for Parquet output" in proc.stderr


def test_statistics_page_index_and_encodings_of_an_unsorted_file(out_dir):
    run_dnsprobe("read", SAMPLE, "-o", out_dir, "-q", "--row-group-size", "5000")
    (f,) = files_of(out_dir)
    meta = pq.ParquetFile(f).metadata
    assert meta.num_row_groups >= 2
    for i in range(meta.num_row_groups):
        columns = {meta.row_group(i).column(j).path_in_schema: meta.row_group(i).column(j)
                   for j in range(meta.num_columns)}
        # Names and client addresses: no min/max, so no column index; the rest have both.
        for name in ("qname", "domainname", "src", "edns_client_subnet"):
            assert not columns[name].is_stats_set and not columns[name].has_column_index, name
        for name in ("time", "query_time", "dst", "qtype", "rcode", "transport", "country"):
            assert columns[name].is_stats_set and columns[name].has_column_index, name
            assert columns[name].has_offset_index
        times = columns["time"].statistics
        assert times.min <= times.max and times.min > 1_000_000_000_000_000
        # Times delta-encoded, without a dictionary; names with one.
        for name in ("time", "time_micro", "query_time", "response_time"):
            assert "DELTA_BINARY_PACKED" in columns[name].encodings, (name, columns[name].encodings)
            assert "RLE_DICTIONARY" not in columns[name].encodings, name
        assert "RLE_DICTIONARY" in columns["qname"].encodings
        # zstd everywhere (nested leaves too) but where it finds nothing: the delta-encoded times set on every row,
        # the columns of one value (export.parquet.schema.UNCOMPRESSED).
        for name, column in columns.items():
            codec = "UNCOMPRESSED" if name in UNCOMPRESSED else "ZSTD"
            assert column.compression == codec, (name, column.compression)
        assert {"time", "frag", "server_location", "edns_ede.list.element", "answers.list.element.data"} <= set(columns)


def test_data_pages_of_page_rows(tmp_path):
    """A row group of PAGE_ROWS + 1 rows: two data pages in every column, as DuckDB reads the page index (Arrow's
    own default cuts pages at 20,000 rows)."""
    duckdb = pytest.importorskip("duckdb", reason="pip install duckdb (in the test extras)")
    rows = PAGE_ROWS + 1
    # The same query every 10 s: each one unanswered, timed out before the next (a pcap written here: scapy's writer
    # takes seconds for this many frames).
    frame = udp_frame(q_dns(1, "a.example.com"))
    record = struct.pack("<I", len(frame)) * 2 + frame
    pcap = tmp_path / "queries.pcap"
    pcap.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
                     + b"".join(struct.pack("<II", int(MIDNIGHT) + 10 * i, 0) + record for i in range(rows)))
    out = tmp_path / "out"
    out.mkdir()
    run_dnsprobe("read", pcap, "-o", out, "-q", "--rotate-seconds", "0", "--row-group-size", str(rows))
    (f,) = files_of(out)
    assert pq.ParquetFile(f).metadata.num_rows == rows
    pages = duckdb.connect().execute(f"SELECT path_in_schema, list(num_rows ORDER BY page_id) FROM"
                                     f" parquet_page_index('{f}') GROUP BY ALL").fetchall()
    assert {"time", "qname", "rcode", "transport"} <= {name for name, _ in pages}
    assert all(counts == [PAGE_ROWS, 1] for _, counts in pages), pages


def test_a_codec_level_reaches_every_compressed_column_and_no_other(tmp_path):
    # (pyarrow refuses a level for a column without a codec: the level is set by column, as the codec)
    tables, sizes = [], []
    for level in (1, 9):
        out = tmp_path / f"level{level}"
        out.mkdir()
        run_dnsprobe("read", SAMPLE, "-o", out, "-q", "--compression", "gzip", "--set",
                     f"export.compression_level={level}")
        (f,) = files_of(out)
        meta = pq.ParquetFile(f).metadata
        for j in range(meta.num_columns):
            column = meta.row_group(0).column(j)
            expected = "UNCOMPRESSED" if column.path_in_schema in UNCOMPRESSED else "GZIP"
            assert column.compression == expected, (column.path_in_schema, column.compression)
        tables.append(pq.read_table(f))
        sizes.append(f.stat().st_size)
    assert tables[0].equals(tables[1])
    assert sizes[0] > sizes[1]  # gzip level 1 larger than level 9: the level was applied


def test_rotation_by_size_page_index_and_sorting(out_dir):
    limit = 150_000
    run_dnsprobe("read", SAMPLE, "-o", out_dir, "-q", "--set", f"export.rotate_bytes={limit}",
                 "--row-group-size", "500", "--set", "export.sort=domainname")
    files = files_of(out_dir)
    stats = json.loads(next(out_dir.glob("*.stats.json")).read_text())["counters"]
    assert len(files) >= 3 and stats["files"] == len(files)
    total = 0
    for f in files:
        meta = pq.ParquetFile(f).metadata
        total += meta.num_rows
        sizes = [sum(meta.row_group(i).column(j).total_compressed_size for j in range(meta.num_columns))
                 for i in range(meta.num_row_groups)]
        # Closed at the first row group that reaches the limit: less than one row group (and the footer) over it.
        assert f.stat().st_size < limit + max(sizes) + 64 * 1024 or f == files[-1]
        if f != files[-1]:
            assert f.stat().st_size >= limit
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            assert [c.column_index for c in group.sorting_columns] == [4, 3]  # domainname, qname
            assert all(group.column(j).has_column_index and group.column(j).has_offset_index
                       for j in range(group.num_columns) if group.column(j).path_in_schema in ("time", "qname"))
        for i in range(meta.num_row_groups):  # each row group sorted (the last of each stream may be short)
            names = pq.ParquetFile(f).read_row_group(i, columns=["domainname"]).column(0).to_pylist()
            assert names == sorted(names) and len(names) <= 500
    assert total == stats["records"]
