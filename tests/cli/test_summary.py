"""`dnsprobe inspect --summary` on the bundled sample as `dnsprobe read` writes it (Parquet in several files, C-DNS,
both in one directory, a hive dataset), every figure checked against DuckDB's SQL over the same Parquet files: the
counts, the ranked lists (ties by value), the per-second peak, the exact delay percentiles and the histogram. The
registered domains are checked against the ones the exporter's enrichment wrote (enrich.public_suffix)."""

import datetime
import json
from pathlib import Path

import duckdb
import pytest
from support.data import ROOT
from support.dnsprobe import run_dnsprobe

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"
TOP = 7


def read(out, *extra):
    out.mkdir()
    run_dnsprobe("read", SAMPLE, "-o", out, "-q", "--no-progress", *extra)
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The sample read as Parquet in files of 2,000 records (the summary sums several files' counts), as Parquet
    with registered domains (enrich.public_suffix), as C-DNS, and as a hive dataset."""
    top = tmp_path_factory.mktemp("summary")
    return {
        "parquet": read(top / "parquet", "--set", "export.rotate_records=2000"),
        "enriched": read(top / "enriched", "--set", "enrich.public_suffix=true"),
        "cdns": read(top / "cdns", "--format", "cdns", "--cdns-compression", "xz"),
        "hive": read(top / "hive", "--set", "export.layout=hive", "--set", "export.server_name=probe1"),
    }


def summary(*paths, limit=TOP):
    proc = run_dnsprobe("inspect", "--summary", *paths, "--json", "--limit", limit)
    return json.loads(proc.stdout)


def sql(directory, query):
    """Rows of a query over every Parquet file under directory (the table is `t`)."""
    con = duckdb.connect()
    con.execute(f"create view t as select * from read_parquet('{directory}/**/*.parquet', hive_partitioning=false)")
    return con.execute(query).fetchall()


def iso(us):
    t = datetime.datetime.fromtimestamp(us / 1e6, datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ranked(directory, column, limit=TOP, nulls=True):
    """(value, count) most frequent first; nulls=False: without the null value (a top list's)."""
    where = "" if nulls else f"where {column} is not null "
    return [list(r) for r in sql(directory, f"select {column}, count(*) c from t {where}group by 1 order by c desc, "
                                             f"1 nulls last limit {limit}")]


def test_the_figures_are_duckdbs(outputs):
    directory = outputs["parquet"]
    assert len(list(directory.glob("*.parquet"))) == 5
    s = summary(directory)
    ((records, first, last, matched, query_only, response_only),) = sql(directory, """
        select count(*), min(time), max(time),
               count(*) filter (query_present and response_present),
               count(*) filter (query_present and not response_present),
               count(*) filter (response_present and not query_present) from t""")
    assert s["records"] == records and s["files"] == 5
    assert s["time"] == {"first": iso(first), "last": iso(last), "seconds": (last - first) / 1e6}
    assert s["transactions"] == {"matched": matched, "query_only": query_only, "response_only": response_only}
    ((second, peak),) = sql(directory, "select time // 1000000 s, count(*) c from t group by 1 order by c desc, s "
                                       "limit 1")
    assert s["rate"] == {"mean_per_second": records / ((last - first) / 1e6), "peak_per_second": peak,
                         "peak_second": iso(second * 1_000_000).replace(".000000Z", "Z")}
    transports = sql(directory, "select coalesce(transport, case prot when 17 then 'udp' when 6 then 'tcp' end) x, "
                                "count(*) c from t group by 1 order by c desc, x")
    assert [[r["transport"], r["count"]] for r in s["transports"]] == [list(r) for r in transports]
    assert {("udp", 17), ("tcp", 6)} == set(sql(directory, "select distinct transport, prot from t"))
    for key in ("qtype", "rcode"):
        mix = ranked(directory, key, limit=1000)
        assert [[r[key], r["count"]] for r in s[key + "s"]] == mix
    assert {"A": 1, "AAAA": 28}.items() <= {r["name"]: r["qtype"] for r in s["qtypes"]}.items()
    assert {r["rcode"]: r["name"] for r in s["rcodes"]}[3] == "NXDOMAIN"
    for key, column in (("qnames", "qname"), ("clients", "src")):
        ((distinct,),) = sql(directory, f"select count(distinct {column}) from t")
        assert s[key]["distinct"] == distinct > TOP
        assert [[r[column], r["count"]] for r in s[key]["top"]] == ranked(directory, column, nulls=False)


def test_the_delays_are_exact(outputs):
    directory = outputs["parquet"]
    d = summary(directory)["response_delay_us"]
    ((n, low, high, mean),) = sql(directory, "select count(response_delay_us), min(response_delay_us), "
                                             "max(response_delay_us), avg(response_delay_us) from t")
    assert (d["count"], d["min"], d["max"]) == (n, low, high) and d["mean"] == pytest.approx(mean, rel=1e-12)
    for name, permille in (("p50", 500), ("p90", 900), ("p95", 950), ("p99", 990), ("p99.9", 999)):
        ((value,),) = sql(directory, f"""
            select d from (select response_delay_us d, row_number() over (order by response_delay_us) - 1 i
                           from t where response_delay_us is not null)
            where i = ({n} - 1) * {permille} // 1000""")
        assert d[name] == value, name
    buckets = d["histogram"]
    assert sum(b["count"] for b in buckets) == n
    assert buckets[0]["from_us"] <= low < buckets[0]["to_us"] and buckets[-1]["from_us"] <= high < buckets[-1]["to_us"]
    for b, after in zip(buckets, buckets[1:]):
        assert b["to_us"] == after["from_us"] and str(b["to_us"])[0] in "125" and set(str(b["to_us"])[1:]) <= {"0"}
    for b in buckets:
        ((count,),) = sql(directory, f"select count(*) from t where response_delay_us >= {b['from_us']} and "
                                     f"response_delay_us < {b['to_us']}")
        assert b["count"] == count


def test_registered_domains_are_the_public_suffix_lists(outputs):
    """Found per distinct QNAME by the summary when the files have none, they are the ones the exporter wrote per
    record with enrich.public_suffix; and those stored are used as they are."""
    enriched = outputs["enriched"]
    expected = ranked(enriched, "registered_domain", nulls=False)
    assert expected[0][0] and sql(enriched, "select count(*) from t where registered_domain is null") == [(0,)]
    ((distinct,),) = sql(enriched, "select count(distinct registered_domain) from t")
    for s in (summary(outputs["parquet"]), summary(enriched)):
        assert [[r["registered_domain"], r["count"]] for r in s["registered_domains"]["top"]] == expected
        assert s["registered_domains"]["distinct"] == distinct
    both = summary(outputs["parquet"], enriched)  # files with them and files without
    assert [[r["registered_domain"], r["count"] // 2] for r in both["registered_domains"]["top"]] == expected
    assert all(r["count"] % 2 == 0 for r in both["registered_domains"]["top"])


def test_cdns_hive_and_mixed_directories(outputs):
    """C-DNS output gives the Parquet figures; a hive dataset too; a directory of both counts each record twice."""
    parquet = summary(outputs["parquet"])
    parquet.pop("files")
    for other in (outputs["cdns"], outputs["hive"]):
        s = summary(other)
        assert s.pop("files") == 1
        assert s == parquet, other
    both = summary(outputs["cdns"], *sorted(outputs["parquet"].glob("*.parquet")))
    assert both["files"] == 6 and both["records"] == 2 * parquet["records"]
    assert both["response_delay_us"]["p99"] == parquet["response_delay_us"]["p99"]
    assert [r["count"] for r in both["qnames"]["top"]] == [2 * r["count"] for r in parquet["qnames"]["top"]]


def test_the_text_is_for_people(outputs):
    directory = outputs["parquet"]
    s = summary(directory, limit=10)
    text = run_dnsprobe("inspect", "--summary", directory).stdout
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120
    assert lines[0] == f"{s['records']:,} records in 5 files"
    assert f"{s['transactions']['matched']:,} matched" in lines[3]
    top = s["qnames"]["top"][0]
    assert any(line.split() == [f"{top['count']:,}", *f"{100 * top['count'] / s['records']:.1f} %".split(),
                                top["qname"]] for line in lines)
    assert f"top 10 QNAMEs of {s['qnames']['distinct']:,}" in lines and "NXDOMAIN" in text and "AAAA" in text
    bars = [line for line in lines if "█" in line]
    assert len(bars) == len(s["response_delay_us"]["histogram"])
    short = run_dnsprobe("inspect", "--summary", directory, "--limit", "0").stdout.splitlines()
    assert f"{s['clients']['distinct']:,} clients" in short and not any(x.startswith("top ") for x in short)


def test_wrong_use_is_a_usage_error(outputs, tmp_path):
    proc = run_dnsprobe("inspect", "--summary", outputs["parquet"], "--columns", "qname", check=False)
    assert proc.returncode == 2 and "--summary" in proc.stderr
    (tmp_path / "x.parquet").write_bytes(b"not parquet at all")
    proc = run_dnsprobe("inspect", "--summary", tmp_path / "x.parquet", check=False)
    assert proc.returncode == 1 and "neither a Parquet file nor a C-DNS file" in proc.stderr
    assert Path(tmp_path / "x.parquet").exists()


def test_a_file_read_in_part_is_counted_to_its_problem(tmp_path):
    """A C-DNS file cut in its third block: the records of its first two are summed, then an error line, exit 1."""
    out = read(tmp_path / "cdns", "--format", "cdns", "--set", "export.cdns_block_items=3000")
    (whole,) = out.glob("*.cdns")
    data = whole.read_bytes()
    cut = tmp_path / "cut.cdns"
    cut.write_bytes(data[: len(data) * 5 // 6])
    full = summary(whole)
    proc = run_dnsprobe("inspect", "--summary", cut, "--json", check=False)
    assert proc.returncode == 1 and "(the records before it are counted)" in proc.stderr
    part = json.loads(proc.stdout)
    assert part["records"] == 6000 < full["records"] and part["transactions"]["matched"] <= 6000
