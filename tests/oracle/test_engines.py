"""Analytics engines read our Parquet files with their default settings: DuckDB and Apache Spark (pyspark in local
mode, on Debian's OpenJDK). Both must see every record, the capture times to the microsecond and the same counts
per RCODE as the probe's own statistics and pyarrow."""

import json
import shutil
from collections import Counter

import pyarrow.compute as pc
import pytest
from support import ROOT, at_us, read_output, run_dnsprobe

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    run_dnsprobe("read", SAMPLE, "-o", out, "-q", "--no-progress", "--rotate-records", "4000")
    table = read_output(out)
    stats = json.loads(next(out.glob("*.stats.json")).read_text())["counters"]
    files = sorted(str(p) for p in out.glob("*.parquet"))
    assert len(files) >= 2 and table.num_rows == stats["records"] > 0
    rcodes = Counter(table.column("rcode").to_pylist())
    first_ns = pc.min(table.column("query_time").cast("int64")).as_py() * 1000
    return files, stats, rcodes, first_ns


def test_duckdb_reads_every_record(output):
    duckdb = pytest.importorskip("duckdb", reason="pip install duckdb (in the test extras)")
    files, stats, rcodes, first_ns = output
    con = duckdb.connect()
    rel = f"read_parquet({files!r})"
    assert con.execute(f"SELECT count(*) FROM {rel}").fetchone()[0] == stats["records"]
    got = dict(con.execute(f"SELECT rcode, count(*) FROM {rel} GROUP BY rcode").fetchall())
    assert got == dict(rcodes)
    typ = con.execute(f"SELECT typeof(query_time) FROM {rel} LIMIT 1").fetchone()[0]
    assert typ == "TIMESTAMP WITH TIME ZONE"
    epoch_us = con.execute(f"SELECT epoch_us(min(query_time)) FROM {rel}").fetchone()[0]
    assert epoch_us * 1000 == at_us(first_ns)


@pytest.fixture(scope="module")
def spark():
    pyspark = pytest.importorskip("pyspark", reason="pip install pyspark (in the test extras)")
    if not shutil.which("java"):
        pytest.skip("Spark needs Java: apt-get install openjdk-17-jre-headless (contrib/install-deps.sh does)")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("dnsprobe-tests")
               .config("spark.ui.enabled", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session, pyspark
    session.stop()


def test_spark_reads_every_record_with_default_settings(output, spark):
    session, pyspark = spark
    files, stats, rcodes, first_ns = output
    df = session.read.parquet(*files)
    assert df.count() == stats["records"]
    assert isinstance(df.schema["query_time"].dataType, pyspark.sql.types.TimestampType)
    got = {row["rcode"]: row["count"] for row in df.groupBy("rcode").count().collect()}
    assert got == dict(rcodes)
    first = df.selectExpr("unix_micros(min(query_time)) AS us").collect()[0]["us"]
    assert first * 1000 == at_us(first_ns)
