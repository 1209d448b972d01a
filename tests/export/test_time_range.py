"""The timestamp column and the order of rows: a one-minute time-range query on an hour's file reads only that
minute's row groups.

A transaction's row is made when it completes (at its response, or once its query has waited match.query_timeout),
so rows come later than rows of later timestamps; the writer holds the last query_timeout of rows back and cuts row
groups in timestamp order (export.parquet.writer.write_row_groups). The capture here is an hour of traffic, one
transaction a second, some queries unanswered (their rows come match.query_timeout, 5 s, late) and some responses
without their query, read into row groups of 10 rows, 10 seconds each.
"""

import datetime
import re

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support.data import ROOT
from support.dnsprobe import run_dnsprobe
from support.frames import NS, udp_frame, write_pcap
from support.messages import q_dns, r_dns

START_NS = 1_714_564_800 * NS  # 2024-05-01 12:00:00 UTC
SECONDS = 3600
ROW_GROUP = 10
DELAY_NS = 20_000_000  # a response 20 ms after its query


def _timestamp(i):
    """Capture time (ns) of transaction i's row: its query's, or its response's for a response without a query."""
    return START_NS + i * NS + (DELAY_NS if i % 11 == 5 else 0)


@pytest.fixture(scope="module")
def hour_file(tmp_path_factory):
    """(the one Parquet file of an hour of traffic, read with 10-row groups), the timestamps written (ns)."""
    tmp = tmp_path_factory.mktemp("hour")
    frames = []
    for i in range(SECONDS):
        qid, cport, name = i & 0xFFFF, 10_000 + i % 50_000, f"t{i}.example.com"
        t = START_NS + i * NS
        if i % 11 != 5:  # every 11th: a response whose query was not captured
            frames.append((t, udp_frame(q_dns(qid, name), cport=cport)))
        if i % 7 != 3 or i % 11 == 5:  # every 7th: a query left unanswered
            frames.append((t + DELAY_NS, udp_frame(r_dns(qid, name), to_server=False, cport=cport)))
    pcap = write_pcap(tmp / "hour.pcap", frames)
    out = tmp / "out"
    out.mkdir()
    run_dnsprobe("read", pcap, "-o", out, "-q", "--no-progress", "--rotate-seconds", "0",
                 "--row-group-size", str(ROW_GROUP))
    (path,) = out.glob("*.parquet")
    return path


def _minute(m):
    low = datetime.datetime.fromtimestamp(START_NS // NS + 60 * m, datetime.timezone.utc)
    return low, low + datetime.timedelta(minutes=1)


def test_a_minute_reads_only_its_row_groups(hour_file):
    con = duckdb.connect()
    meta = pq.ParquetFile(hour_file).metadata
    for minute in range(60):
        _assert_minute_reads_its_groups(con, hour_file, meta, minute)


def _assert_minute_reads_its_groups(con, hour_file, meta, minute):
    low, high = _minute(minute)
    # (count(*) alone DuckDB answers from the statistics of the row groups the range covers, reading none of them)
    query = (f"SELECT count(*), count(DISTINCT qname) FROM '{hour_file}' WHERE timestamp >= TIMESTAMPTZ"
             f" '{low.isoformat()}' AND timestamp < TIMESTAMPTZ '{high.isoformat()}'")
    plan = con.execute("EXPLAIN ANALYZE " + query).fetchall()[0][1]
    scanned, total = map(int, re.search(r"Row Groups Scanned: (\d+) / (\d+)", plan).groups())
    assert total == meta.num_row_groups >= SECONDS // ROW_GROUP
    # 60 rows a minute, in order, in groups of 10: the minute's 6 groups. Without the order, a group holding an
    # unanswered query reaches 5 s back, and a minute's query reads the next minute's first group too.
    assert scanned == 60 // ROW_GROUP, plan
    column = meta.schema.names.index("timestamp")
    overlapping = sum(1 for g in range(meta.num_row_groups)
                      if (s := meta.row_group(g).column(column).statistics).min < high and s.max >= low)
    assert scanned == overlapping
    want = sum(1 for i in range(SECONDS) if low.timestamp() * NS <= _timestamp(i) < high.timestamp() * NS)
    assert con.execute(query).fetchone() == (want, want) and want == 60


def test_rows_are_in_timestamp_order_and_it_is_never_null(hour_file):
    table = pq.read_table(hour_file, columns=["timestamp", "time", "query_time", "response_time", "query_present",
                                              "response_present"])
    times = table.column("timestamp")
    assert times.type == pa.timestamp("us", tz="UTC") and times.null_count == 0
    assert times.cast(pa.int64()).to_pylist() == [_timestamp(i) // 1000 for i in range(SECONDS)]
    assert times.cast(pa.int64()).equals(table.column("time"))
    # The query's time, else the response's: query-only and response-only rows have theirs.
    query_only = table.filter(pc.invert(table.column("response_present")))
    response_only = table.filter(pc.invert(table.column("query_present")))
    assert query_only.num_rows == len([i for i in range(SECONDS) if i % 7 == 3 and i % 11 != 5]) > 400
    assert response_only.num_rows == len(range(5, SECONDS, 11))
    assert query_only.column("query_time").equals(query_only.column("timestamp"))
    assert response_only.column("response_time").equals(response_only.column("timestamp"))
    assert response_only.column("query_time").null_count == response_only.num_rows


def test_the_bundled_sample_has_a_timestamp_in_every_row(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run_dnsprobe("read", ROOT / "samples" / "sample-mix.pcap.xz", "-o", out, "-q", "--no-progress",
                 "--row-group-size", "500")
    (path,) = out.glob("*.parquet")
    table = pq.read_table(path)
    times = table.column("timestamp")
    assert times.null_count == 0 and table.num_rows > 5000
    assert times.equals(pc.coalesce(table.column("query_time"), table.column("response_time")))
    assert not pc.all(table.column("response_present")).as_py()  # query-only rows (response-only: the hour's)
    meta = pq.ParquetFile(path).metadata
    for g in range(meta.num_row_groups):  # each row group in timestamp order
        group = pq.ParquetFile(path).read_row_group(g, columns=["timestamp"]).column("timestamp").cast(pa.int64())
        assert group.to_pylist() == sorted(group.to_pylist())
