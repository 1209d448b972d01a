"""Analytics output benchmark: what enrichment, the answers column, the hive layout and sorting cost
`dnsprobe read` on the standard mix, in CPU time per core, and what sorting saves in bytes.

    python benchmarks/enrichment.py                  # 1,000,000 packets of the standard mix, 3 rounds
    python benchmarks/enrichment.py --quick          # 100,000 packets, 1 round
    python benchmarks/enrichment.py --only "all enrichment" --rounds 5   # that variant and plain only

Each variant is the real command, pinned to one core and charged its own CPU time (benchmarks/offline.py's
run_measured), the variants interleaved round by round so that the VM's drift hits them alike; the figure of a
variant is its median. Cost per transaction = (variant's CPU - plain run's CPU) / records. The enrichment
databases are written here (mmdb-writer): a country and an ASN database of 20,000 networks each, covering the mix's
client addresses (IPv4 10.0.0.0/8, IPv6 2001:db8::/32), so every lookup finds a record, as with GeoLite2.
Results: benchmarks/results/enrichment.json and enrichment.md.
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import offline  # noqa: E402
import traffic  # noqa: E402

TARGET_SHARE = 0.25  # all enrichment together: at most 25 % of the offline rate


def write_databases(directory, networks=20_000):
    from mmdb_writer import MMDBWriter
    from netaddr import IPSet

    country = MMDBWriter(ip_version=6, database_type="GeoLite2-Country", ipv4_compatible=True)
    asn = MMDBWriter(ip_version=6, database_type="GeoLite2-ASN", ipv4_compatible=True)
    codes = ["NL", "DE", "FR", "BE", "US", "JP", "BR", "ZA", "AU", "IN"]
    per4 = networks * 4 // 5
    for i in range(per4):  # 10.0.0.0/8 in /22s ... (per4 of them, the rest of the /8 in one block)
        net = f"10.{(i >> 6) & 255}.{(i & 63) << 2}.0/22"
        country.insert_network(IPSet([net]), {"country": {"iso_code": codes[i % len(codes)]}})
        asn.insert_network(IPSet([net]), {"autonomous_system_number": 64512 + i % 1000})
    for i in range(networks - per4):
        net = f"2001:db8:{i:x}::/48"
        country.insert_network(IPSet([net]), {"country": {"iso_code": codes[i % len(codes)]}})
        asn.insert_network(IPSet([net]), {"autonomous_system_number": 65000 + i % 500})
    paths = directory / "country.mmdb", directory / "asn.mmdb"
    country.to_db_file(str(paths[0]))
    asn.to_db_file(str(paths[1]))
    return paths


def variants(dbs):
    geo = ["--set", f"enrich.geoip_country={dbs[0]}", "--set", f"enrich.geoip_asn={dbs[1]}"]
    resolvers = ["--set", "enrich.public_resolvers=true"]
    psl = ["--set", "enrich.public_suffix=true"]
    hive = ["--set", "export.layout=hive", "--set", "export.server_name=ns1"]
    return {
        "plain": [],
        "geo (country + asn)": geo,
        "public resolvers": resolvers,
        "public suffix": psl,
        "all enrichment": geo + resolvers + psl,
        "answers column": ["--set", "export.answers=true"],
        "hive layout": hive,
        "sorted by domainname": ["--set", "export.sort=domainname"],
        "everything": geo + resolvers + psl + hive + ["--set", "export.answers=true"],
    }


def measure(pcap, core, tmp_root, extra):
    out = Path(tempfile.mkdtemp(prefix="dnsprobe-enrich-", dir=tmp_root))
    try:
        cmd = [*offline.dnsprobe_command(), "read", str(pcap), "-o", str(out), "-q", "--no-progress", *extra]
        _, m = offline.run_measured(cmd, core)
        stats = next(out.rglob("*.stats.json"))
        m["records"] = json.loads(stats.read_text())["counters"]["records"]
        m["output_bytes"] = sum(p.stat().st_size for p in out.rglob("*.parquet"))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return m


def summarise(samples, packets, base_cpu):
    cpu = statistics.median(s["cpu_seconds"] for s in samples)
    records = samples[0]["records"]
    return {
        "cpu_seconds": cpu,
        "cpu_seconds_all": [s["cpu_seconds"] for s in samples],
        "packets_per_cpu_second": round(packets / cpu),
        "records": records,
        "ns_per_transaction_over_plain": round((cpu - base_cpu) / records * 1e9),
        "share_of_plain": round((cpu - base_cpu) / base_cpu, 4),
        "output_bytes": samples[0]["output_bytes"],
        "bytes_per_record": round(samples[0]["output_bytes"] / records, 2),
        "max_rss_mb": max(s["max_rss_mb"] for s in samples),
    }


def markdown(res):
    lines = [
        "# Analytics output: enrichment, answers, layout, sorting (`dnsprobe read`, standard mix)",
        "",
        f"{res['started']}: {res['packets']:,} packets, {res['rounds']} interleaved rounds, median CPU time on one "
        f"core (machine: {res['machine']['cpu_model']}, load at start {res['machine']['load_average_at_start']}); "
        f"commit {res['code'].get('git_commit') or '?'}"
        f"{' with uncommitted changes' if res['code'].get('uncommitted_changes_in_probe_or_export') else ''}.",
        "",
        "| variant | CPU s | pkts/CPU-s | ns/transaction over plain | share of plain | bytes/record |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in res["variants"].items():
        lines.append(f"| {name} | {v['cpu_seconds']:.2f} | {v['packets_per_cpu_second']:,} | "
                     f"{v['ns_per_transaction_over_plain']:,} | {100 * v['share_of_plain']:.1f} % | "
                     f"{v['bytes_per_record']} |")
    if "all enrichment" in res["variants"]:
        share = res["variants"]["all enrichment"]["share_of_plain"]
        lines += ["", f"All enrichment together: {100 * share:.1f} % of the plain run's CPU time (target at most "
                  f"{100 * TARGET_SHARE:.0f} %): {'met' if share <= TARGET_SHARE else 'NOT met'}."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    offline.add_rounds_options(ap)
    offline.add_core_option(ap)
    ap.add_argument("--only", help="comma-separated variants to run besides plain (default: all of them)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    packets, rounds = offline.packets_and_rounds(args)
    core = offline.pinned_core(args.core)
    pcap = traffic.generate("standard", packets, 1)
    started = offline.started_utc()
    with tempfile.TemporaryDirectory(prefix="dnsprobe-enrich-bench-") as tmp:
        dbs = write_databases(Path(tmp))
        runs = variants(dbs)
        if args.only:
            wanted = {"plain", *(name.strip() for name in args.only.split(","))}
            unknown = wanted - set(runs)
            if unknown:
                ap.error(f"no variant {', '.join(sorted(unknown))} (variants: {', '.join(runs)})")
            runs = {name: extra for name, extra in runs.items() if name in wanted}
        samples = {name: [] for name in runs}
        for i in range(rounds):
            for name, extra in runs.items():
                m = measure(pcap, core, tmp, extra)
                samples[name].append(m)
                print(f"round {i + 1}/{rounds} {name}: {m['cpu_seconds']:.2f} s CPU", flush=True)
    base = statistics.median(s["cpu_seconds"] for s in samples["plain"])
    res = {
        "started": started,
        "packets": packets,
        "rounds": rounds,
        "machine": offline.machine(),
        "code": offline.code(),
        "variants": {name: summarise(s, packets, base) for name, s in samples.items()},
    }
    offline.report("enrichment", res, markdown(res), save=not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
