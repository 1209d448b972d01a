"""Analytics engines read our output directory as it is, with their default settings: DuckDB, Apache Spark (pyspark
in local mode, on Debian's OpenJDK) and pyarrow, pointed at the directory (flat and hive), not at a list of files:
the statistics JSON beside the data is skipped by its name. Each must see every record, the capture times to the
microsecond and the same counts per RCODE as the probe's own statistics."""

import json
import shutil
from collections import Counter

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support.data import ROOT
from support.dnsprobe import at_us, read_output, run_dnsprobe

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    run_dnsprobe("read", SAMPLE, "-o", out, "-q", "--no-progress", "--rotate-records", "4000")
    table = read_output(out)
    (stats_file,) = out.glob("_dnsprobe.*.stats.json")
    stats = json.loads(stats_file.read_text())["counters"]
    assert len(list(out.glob("*.parquet"))) >= 2 and table.num_rows == stats["records"] > 0
    rcodes = Counter(table.column("rcode").to_pylist())
    first_ns = pc.min(table.column("query_time").cast("int64")).as_py() * 1000
    return out, stats, rcodes, first_ns


def test_pyarrow_reads_the_directory(output):
    out, stats, rcodes, _first_ns = output
    table = pq.read_table(out)
    assert table.num_rows == stats["records"]
    assert Counter(table.column("rcode").to_pylist()) == rcodes


def test_duckdb_reads_every_record(output):
    duckdb = pytest.importorskip("duckdb", reason="pip install duckdb (in the test extras)")
    out, stats, rcodes, first_ns = output
    con = duckdb.connect()
    rel = f"read_parquet('{out}')"
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
    out, stats, rcodes, first_ns = output
    df = session.read.parquet(str(out))
    assert df.count() == stats["records"]
    assert isinstance(df.schema["query_time"].dataType, pyspark.sql.types.TimestampType)
    got = {row["rcode"]: row["count"] for row in df.groupBy("rcode").count().collect()}
    assert got == dict(rcodes)
    first = df.selectExpr("unix_micros(min(query_time)) AS us").collect()[0]["us"]
    assert first * 1000 == at_us(first_ns)


# ---------------------------------------------------------------------------------------------
# The hive layout of two probes, enriched, read as one table; the example queries of docs/analytics.md

ANALYTICS_DOC = ROOT / "docs" / "analytics.md"
DOC_ROOT = "/data/dnsprobe"
SERVERS = ("ns1", "ns2")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two probes (server names ns1 and ns2) writing the sample into one hive dataset, every enrichment on: the
    client addresses of the sample are private ones, so the databases and the resolver list are the tests' own."""
    mmdb_writer = pytest.importorskip("mmdb_writer", reason="pip install mmdb-writer (in the test extras)")
    from netaddr import IPSet

    base = tmp_path_factory.mktemp("dataset")
    data = base / "data"
    data.mkdir()
    asn = mmdb_writer.MMDBWriter(ip_version=6, database_type="GeoLite2-ASN", ipv4_compatible=True)
    for net, number in (("10.0.0.0/9", 64500), ("10.128.0.0/9", 64501), ("2001:db8::/32", 64502)):
        asn.insert_network(IPSet([net]), {"autonomous_system_number": number})
    asn.to_db_file(str(base / "asn.mmdb"))
    lists = base / "lists"
    lists.mkdir()
    (lists / "google.txt").write_text("# name: Google\n10.0.0.0/10\n")
    (lists / "quad9.txt").write_text("# name: Quad9\n2001:db8:8000::/33\n")
    stats = {}
    for server in SERVERS:
        run_dnsprobe("read", SAMPLE, "-o", data, "-q", "--no-progress", "--rotate-records", "3000",
                     "--set", "export.layout=hive", "--set", f"export.server_name={server}",
                     "--set", "export.answers=true", "--set", f"enrich.geoip_asn={base / 'asn.mmdb'}",
                     "--set", "enrich.public_suffix=true", "--set", "enrich.public_resolvers=true",
                     "--set", f"enrich.resolver_lists={lists}")
        newest = max(data.glob("_*.stats.json"), key=lambda p: p.stat().st_mtime_ns)
        stats[server] = json.loads(newest.read_text())["counters"]
    files = sorted(data.rglob("*.parquet"))
    rows = []
    for f in files:
        server = f.parent.name.removeprefix("server=")
        rows += [dict(r, server=server) for r in pq.read_table(f, partitioning=None).to_pylist()]
    return data, stats, rows


def test_duckdb_reads_the_hive_dataset_of_two_probes(dataset):
    duckdb = pytest.importorskip("duckdb", reason="pip install duckdb (in the test extras)")
    data, stats, rows = dataset
    con = duckdb.connect()
    rel = f"read_parquet('{data}', hive_partitioning = true)"
    per_server = dict(con.execute(f"SELECT server, count(*) FROM {rel} GROUP BY server").fetchall())
    assert per_server == {s: stats[s]["records"] for s in SERVERS}
    partitions = con.execute(f"SELECT DISTINCT year, month, day FROM {rel}").fetchall()
    assert partitions == [(2024, 5, 1)]
    got = Counter(dict(con.execute(f"SELECT rcode, count(*) FROM {rel} GROUP BY rcode").fetchall()))
    assert got == Counter(r["rcode"] for r in rows)


def test_pyarrow_reads_the_hive_dataset_of_two_probes(dataset):
    data, stats, rows = dataset
    table = pq.read_table(data)
    per_server = Counter(table.column("server").to_pylist())
    assert per_server == {s: stats[s]["records"] for s in SERVERS} and table.num_rows == len(rows)


def doc_queries():
    text = ANALYTICS_DOC.read_text()
    return [block.split("```", 1)[0] for block in text.split("```sql\n")[1:]]


def quantile(values, q):
    """DuckDB's quantile_cont: linear interpolation between the closest ranks."""
    values = sorted(values)
    pos = (len(values) - 1) * q
    low = int(pos)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (pos - low)


def expected_results(rows):
    """What each query of docs/analytics.md must return, computed here in Python from the rows."""
    out = []
    answered = [r for r in rows if r["response_present"]]
    by_asn = Counter(r["asn"] for r in answered)
    nx = Counter(r["asn"] for r in answered if r["rcode"] == 3)
    out.append(sorted(((a, n, round(100.0 * nx[a] / n, 2)) for a, n in by_asn.items()), key=lambda t: (-t[1], t[0])))
    per_domain = Counter(r["registered_domain"] for r in rows if r["registered_domain"])
    top = sorted(per_domain.items(), key=lambda t: (-t[1], t[0]))[:10]
    out.append([(2024, 5, 1, d, n) for d, n in top])
    delays = {}
    for r in rows:
        if r["query_present"] and r["response_present"]:
            delays.setdefault((r["server"], r["dst"]), []).append(r["response_delay_us"])
    out.append([(s, d, len(v), quantile(v, 0.5), quantile(v, 0.95), quantile(v, 0.99))
                for (s, d), v in sorted(delays.items())])
    queries = [r for r in rows if r["query_present"]]
    out.append([(s, n, round(100.0 * sum(r["edns_do"] for r in queries if r["server"] == s) / n, 2))
                for s, n in sorted(Counter(r["server"] for r in queries).items())])
    resolvers = Counter(r["public_resolver"] for r in queries if r["public_resolver"])
    out.append(sorted(resolvers.items(), key=lambda t: (-t[1], t[0])))
    addresses = Counter((r["qname"], a["data"]) for r in rows if r["answers"] for a in r["answers"]
                        if a["section"] == "answer" and a["type"] in (1, 28))
    out.append([(q, a, n) for (q, a), n in sorted(addresses.items(), key=lambda t: (-t[1], t[0]))][:20])
    minute_us = 1_714_564_800_000_000  # 2024-05-01 12:00:00 UTC, the sample's first minute
    minute = [r for r in rows if minute_us <= r["time"] < minute_us + 60_000_000]
    out.append([(len(minute), len({r["qname"] for r in minute if r["qname"] is not None}))])
    return out


def test_docs_example_queries_run_against_duckdb(dataset):
    duckdb = pytest.importorskip("duckdb", reason="pip install duckdb (in the test extras)")
    data, _stats, rows = dataset
    queries = doc_queries()
    expected = expected_results(rows)
    assert len(queries) == len(expected) == 7
    con = duckdb.connect()
    for sql, want in zip(queries, expected):
        assert DOC_ROOT in sql
        got = con.execute(sql.replace(DOC_ROOT, str(data))).fetchall()
        assert want and rounded(got) == rounded(want), sql


def rounded(rows):
    """Rows with their floats to 6 decimals (percentiles interpolate in another order there)."""
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]


def test_spark_reads_the_hive_dataset_of_two_probes(dataset, spark):
    session, pyspark = spark
    types = pyspark.sql.types
    data, stats, rows = dataset
    df = session.read.parquet(str(data))
    assert df.count() == len(rows) == sum(s["records"] for s in stats.values())
    schema = {f.name: f.dataType for f in df.schema.fields}
    assert [f.name for f in df.schema.fields][-4:] == ["year", "month", "day", "server"]
    assert all(isinstance(schema[c], types.IntegerType) for c in ("year", "month", "day"))
    assert isinstance(schema["server"], types.StringType)
    assert isinstance(schema["query_time"], types.TimestampType)
    assert isinstance(schema["edns_ede"], types.ArrayType) and isinstance(schema["answers"].elementType,
                                                                          types.StructType)
    assert [f.name for f in schema["answers"].elementType.fields] == ["section", "name", "type", "class", "ttl", "data"]
    got = {r["server"]: r["count"] for r in df.groupBy("server").count().collect()}
    assert got == {s: stats[s]["records"] for s in SERVERS}
    got = {r["rcode"]: r["count"] for r in df.groupBy("rcode").count().collect()}
    assert got == dict(Counter(r["rcode"] for r in rows))
    asn = {r["asn"]: r["count"] for r in df.groupBy("asn").count().collect()}
    assert asn == dict(Counter(r["asn"] for r in rows)) and {"64500", "64501", "64502"} <= set(asn)
