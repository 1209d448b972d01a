"""The timestamp column and the order of rows: a one-minute time-range query on an hour's file reads only the row
groups holding that minute's rows (export.time_order), or those and the ones a query timeout around them.

A transaction's row is made when it completes (at its response, or once its query has waited match.query_timeout),
so rows come later than rows of later timestamps: answered ones by their response's delay, unanswered ones by the
timeout. With export.time_order the writer cuts the late rows into row groups of their own
(export.parquet.writer.write_row_groups), each stream then nearly in timestamp order; without it rows stay in the
order they came, each at most a query timeout late. The capture here is an hour of traffic, one
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
TIMEOUT_NS = 5 * NS  # match.query_timeout's default


def _timestamp(i):
    """Capture time (ns) of transaction i's row: its query's, or its response's for a response without a query."""
    return START_NS + i * NS + (DELAY_NS if i % 11 == 5 else 0)


@pytest.fixture(scope="module")
def hour_pcap(tmp_path_factory):
    """An hour of traffic, one transaction a second."""
    tmp = tmp_path_factory.mktemp("hour")
    frames = []
    for i in range(SECONDS):
        qid, cport, name = i & 0xFFFF, 10_000 + i % 50_000, f"t{i}.example.com"
        t = START_NS + i * NS
        if i % 11 != 5:  # every 11th: a response whose query was not captured
            frames.append((t, udp_frame(q_dns(qid, name), cport=cport)))
        if i % 7 != 3 or i % 11 == 5:  # every 7th: a query left unanswered
            frames.append((t + DELAY_NS, udp_frame(r_dns(qid, name), to_server=False, cport=cport)))
    return write_pcap(tmp / "hour.pcap", frames)


def _read_hour(pcap, out, time_order):
    """The one Parquet file of the hour, read with 10-row groups, in batches of one frame: queries expire once per
    batch, as they would in a live capture of this rate (batches of 4096 frames span hours of it)."""
    out.mkdir()
    run_dnsprobe("read", pcap, "-o", out, "-q", "--no-progress", "--rotate-seconds", "0", "--set", "run.batch_size=1",
                 "--row-group-size", str(ROW_GROUP), "--set", f"export.time_order={str(time_order).lower()}")
    (path,) = out.glob("*.parquet")
    return path


@pytest.fixture(scope="module")
def hour_file(hour_pcap):
    """The hour in row groups of two streams, the late rows apart (export.time_order)."""
    return _read_hour(hour_pcap, hour_pcap.parent / "ordered", True)


@pytest.fixture(scope="module")
def hour_file_as_completed(hour_pcap):
    """The hour in row groups of the rows in the order they came (export.time_order off)."""
    return _read_hour(hour_pcap, hour_pcap.parent / "as-completed", False)


def _minute(m):
    low = datetime.datetime.fromtimestamp(START_NS // NS + 60 * m, datetime.timezone.utc)
    return low, low + datetime.timedelta(minutes=1)


def test_a_minute_reads_only_the_row_groups_holding_its_rows(hour_file):
    """With export.time_order the late rows (unanswered queries) are in row groups of their own, each stream nearly
    in timestamp order: a group spans only its rows, and a minute reads no group that holds none of its rows."""
    con = _duckdb()
    parquet = pq.ParquetFile(hour_file)
    meta = parquet.metadata
    groups = [parquet.read_row_group(g, columns=["timestamp", "response_present"]) for g in range(meta.num_row_groups)]
    late_groups = 0
    for group in groups:
        times = group.column("timestamp").cast(pa.int64()).to_pylist()
        answered = group.column("response_present").to_pylist()
        assert len(set(answered)) == 1  # one stream: all late, or none
        late_groups += not answered[0]
        newest = times[0]
        for t in times:  # in order, but for the responses' delay
            assert t >= newest - DELAY_NS // 1000
            newest = max(newest, t)
    assert late_groups == -(-len([i for i in range(SECONDS) if i % 7 == 3 and i % 11 != 5]) // ROW_GROUP)
    scanned = []
    for minute in range(60):
        low, high = (int(t.timestamp() * 1_000_000) for t in _minute(minute))
        holding = sum(1 for group in groups
                      if any(low <= t < high for t in group.column("timestamp").cast(pa.int64()).to_pylist()))
        scanned.append(_minute_scanned(con, hour_file, meta, minute))
        assert scanned[-1] == holding
    assert sum(scanned) / 60 < 60 // ROW_GROUP + 3


def test_without_the_order_a_minute_reads_the_groups_a_query_timeout_around_it(hour_file_as_completed):
    """Rows come as their transactions complete: a row is at most a query timeout (and the gap to the packet that
    expires it) later than the rows after it, so a row group spans at most its rows' range and that; a minute reads
    at most the groups holding rows of the minute widened by it."""
    path = hour_file_as_completed
    con = _duckdb()
    meta = pq.ParquetFile(path).metadata
    times = pq.read_table(path, columns=["timestamp"]).column("timestamp").cast(pa.int64()).to_pylist()
    assert sorted(times) == [_timestamp(i) // 1000 for i in range(SECONDS)] and times != sorted(times)
    late_us = (TIMEOUT_NS + NS) // 1000
    newest = times[0]
    for t in times:  # each row at most late_us before one that came earlier
        assert t >= newest - late_us
        newest = max(newest, t)
    starts = [sum(meta.row_group(g).num_rows for g in range(k)) for k in range(meta.num_row_groups + 1)]
    scanned = []
    for minute in range(60):
        low, high = (int(t.timestamp() * 1_000_000) for t in _minute(minute))
        bound = sum(1 for g in range(meta.num_row_groups)
                    if any(low - late_us <= t < high + late_us for t in times[starts[g]:starts[g + 1]]))
        scanned.append(_minute_scanned(con, path, meta, minute))
        assert 60 // ROW_GROUP <= scanned[-1] <= bound <= 60 // ROW_GROUP + 3
    assert sum(scanned) > 60 * 60 // ROW_GROUP  # (what export.time_order saves)


def _duckdb():
    """A DuckDB connection keeping the files' footers it parsed (a footer of hundreds of row groups takes longer to
    parse than a minute's query takes to run; the files do not change)."""
    con = duckdb.connect()
    con.execute("SET parquet_metadata_cache = true")
    return con


def _minute_scanned(con, hour_file, meta, minute):
    """Row groups DuckDB scans for the one-minute range of the minute (checking what it finds)."""
    low, high = _minute(minute)
    # (count(*) alone DuckDB answers from the statistics of the row groups the range covers, reading none of them)
    query = (f"SELECT count(*), count(DISTINCT qname) FROM '{hour_file}' WHERE timestamp >= TIMESTAMPTZ"
             f" '{low.isoformat()}' AND timestamp < TIMESTAMPTZ '{high.isoformat()}'")
    plan = con.execute("EXPLAIN ANALYZE " + query).fetchall()[0][1]
    scanned, total = map(int, re.search(r"Row Groups Scanned: (\d+) / (\d+)", plan).groups())
    assert total == meta.num_row_groups >= SECONDS // ROW_GROUP
    column = meta.schema.names.index("timestamp")
    overlapping = sum(1 for g in range(meta.num_row_groups)
                      if (s := meta.row_group(g).column(column).statistics).min < high and s.max >= low)
    assert scanned == overlapping
    want = sum(1 for i in range(SECONDS) if low.timestamp() * NS <= _timestamp(i) < high.timestamp() * NS)
    assert con.execute(query).fetchone() == (want, want) and want == 60
    return scanned


def test_every_row_once_and_the_timestamp_never_null(hour_file):
    table = pq.read_table(hour_file, columns=["timestamp", "time", "query_time", "response_time", "query_present",
                                              "response_present"])
    times = table.column("timestamp")
    assert times.type == pa.timestamp("us", tz="UTC") and times.null_count == 0
    assert sorted(times.cast(pa.int64()).to_pylist()) == [_timestamp(i) // 1000 for i in range(SECONDS)]
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
                 "--row-group-size", "500", "--set", "export.time_order=true")
    (path,) = out.glob("*.parquet")
    table = pq.read_table(path)
    times = table.column("timestamp")
    assert times.null_count == 0 and table.num_rows > 5000
    assert times.equals(pc.coalesce(table.column("query_time"), table.column("response_time")))
    assert not pc.all(table.column("response_present")).as_py()  # query-only rows (response-only: the hour's)
    meta = pq.ParquetFile(path).metadata
    late_groups = 0
    for g in range(meta.num_row_groups):  # each row group one stream: the late rows (unanswered queries), or not
        group = pq.ParquetFile(path).read_row_group(g, columns=["query_present", "response_present", "malformed"])
        late = pc.and_not(pc.and_not(group.column("query_present"), group.column("response_present")),
                          group.column("malformed"))
        assert pc.all(late).as_py() == pc.any(late).as_py()
        late_groups += pc.all(late).as_py()
    assert 0 < late_groups < meta.num_row_groups
