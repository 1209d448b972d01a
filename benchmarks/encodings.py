"""Output encodings measured: CPU per packet against bytes per transaction, for each candidate setting.

    python benchmarks/encodings.py                    # 1,000,000 packets of the standard mix, 3 rounds
    python benchmarks/encodings.py --packets 500000 --repeat 5
    python benchmarks/encodings.py --only zstd-3,lz4  # some candidates only (names: --list)

Each candidate is one `dnsprobe read FILE -o DIR -q --no-progress` of the same capture (benchmarks/traffic.py),
pinned to one CPU and charged the user+system CPU time of the child (benchmarks/offline.run_measured; C-DNS's
compressing thread included). The candidates run in interleaved rounds (every candidate once per round, the same
order each round), the median per candidate reported: this machine's speed drifts within minutes, and each
candidate gets the same share of fast and slow minutes. Bytes per transaction: the output files' bytes / the
records written.

Candidates: Parquet codecs (none, snappy, lz4, zstd at levels null = Arrow's default 1, 3 and 6, gzip),
dictionaries on every column or on none, row groups of 25k/100k/500k rows, data pages of 1 MiB (pyarrow's default)
or 8 MiB, no page index, no statistics; C-DNS blocks of 2,500/10,000/50,000 items and its whole-file codecs (gzip,
zstd, xz). Settings the configuration has are given with --set; the others (dictionaries, data page size,
statistics) are patched into pyarrow's ParquetWriter in the child (`encodings.py --child`), and every candidate runs
through that same child wrapper so they all pay the same start-up. "no-writer" patches ParquetWriter.write_table
out: the rows are built, nothing is encoded or written, which tells the writer's share of the CPU.

--columns also writes the records of the capture in-process, one column at a time, as the exporter would (its
dictionaries, delta encodings, statistics, page index, row groups of 100,000), without a codec and
with zstd: which columns the writer's time goes to.

Results go to benchmarks/results/encodings.json and encodings.md.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _parquet(name, note, *sets, patch=None):
    return {"name": name, "format": "parquet", "note": note, "sets": list(sets), "patch": patch or {}}


def _cdns(name, note, *sets):
    return {"name": name, "format": "cdns", "note": note, "sets": list(sets), "patch": {}}


CANDIDATES = [
    _parquet("no-writer", "rows built, ParquetWriter.write_table skipped (the writer's share)",
             patch={"no_write": True}),
    _parquet("none", "no codec", "export.compression=none"),
    _parquet("snappy", "", "export.compression=snappy"),
    _parquet("lz4", "LZ4_RAW in the file", "export.compression=lz4"),
    _parquet("zstd", "the default before: level null, Arrow's default, 1", "export.compression=zstd"),
    _parquet("zstd-3", "", "export.compression=zstd", "export.compression_level=3"),
    _parquet("zstd-6", "", "export.compression=zstd", "export.compression_level=6"),
    _parquet("gzip", "level null, Arrow's default, 9", "export.compression=gzip"),
    _parquet("zstd dict-all", "dictionary on every column but the delta-encoded times", "export.compression=zstd",
             patch={"use_dictionary": True}),
    _parquet("zstd dict-none", "no dictionary at all", "export.compression=zstd", patch={"use_dictionary": False}),
    _parquet("zstd rg-25k", "row groups of 25,000", "export.compression=zstd", "export.row_group_size=25000"),
    _parquet("zstd rg-500k", "row groups of 500,000", "export.compression=zstd", "export.row_group_size=500000"),
    _parquet("zstd page-8M", "data pages of 8 MiB", "export.compression=zstd", patch={"data_page_size": 8 << 20}),
    _parquet("lz4 rg-500k", "", "export.compression=lz4", "export.row_group_size=500000"),
    _parquet("zstd no-page-index", "no column/offset index", "export.compression=zstd",
             patch={"write_page_index": False}),
    _parquet("zstd no-statistics", "no statistics, no page index", "export.compression=zstd",
             patch={"write_statistics": False, "write_page_index": False}),
    _cdns("cdns none", "10,000 items per block (default)"),
    _cdns("cdns none b2500", "2,500 items per block", "export.cdns_block_items=2500"),
    _cdns("cdns none b50000", "50,000 items per block", "export.cdns_block_items=50000"),
    _cdns("cdns gzip-9", "the gzip default before (level null = 9)", "export.cdns_compression=gzip",
          "export.compression_level=9"),
    _cdns("cdns gzip", "level null = 6", "export.cdns_compression=gzip"),
    _cdns("cdns zstd", "level null = 3", "export.cdns_compression=zstd"),
    _cdns("cdns zstd-1", "", "export.cdns_compression=zstd", "export.compression_level=1"),
    _cdns("cdns xz", "level null = preset 6", "export.cdns_compression=xz"),
    _cdns("cdns xz-1", "", "export.cdns_compression=xz", "export.compression_level=1"),
    _cdns("cdns zstd b50000", "", "export.cdns_compression=zstd", "export.cdns_block_items=50000"),
]


# ----------------------------------------------------------------------------------------------
# The child: `dnsprobe` with pyarrow's ParquetWriter patched (encodings.py --child PATCH_JSON read ...)
# ----------------------------------------------------------------------------------------------


def run_child(patch, argv):
    """The dnsprobe command (probe.console.run) with the writer settings of `patch` that the configuration has no
    key for: use_dictionary (True: every column but the delta-encoded, False: none), data_page_size,
    write_statistics, write_page_index, no_write."""
    if patch:
        sys.modules.setdefault("numpy", None)  # as probe.console does: pyarrow is imported here first
        import pyarrow.parquet as pq

        base = pq.ParquetWriter

        class PatchedWriter(base):
            def __init__(self, *args, **kwargs):
                if patch.get("use_dictionary") is False:
                    kwargs["use_dictionary"] = False
                elif patch.get("use_dictionary"):  # every column but the delta-encoded times (Arrow refuses both)
                    kwargs["use_dictionary"] = [n for n in args[1].names if n not in kwargs["column_encoding"]]
                for key in ("data_page_size", "write_statistics", "write_page_index"):
                    if key in patch:
                        kwargs[key] = patch[key]
                super().__init__(*args, **kwargs)

            if patch.get("no_write"):
                def write_table(self, table, row_group_size=None):
                    pass

        pq.ParquetWriter = PatchedWriter
    sys.argv = ["dnsprobe", *argv]
    from probe.console import run

    return run()


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------


def measure(cand, pcap, core, tmp_root, offline):
    out = Path(tempfile.mkdtemp(prefix="codec-", dir=tmp_root))
    try:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cand["patch"]), "read", str(pcap),
               "-o", str(out), "-q", "--no-progress", "--format", cand["format"]]
        for s in cand["sets"]:
            cmd += ["--set", s]
        _, m = offline.run_measured(cmd, core)
        stats = json.loads(next(out.glob("*.stats.json")).read_text())
        counters = stats.get("counters", stats)
        m["records"] = counters["records"]
        m["output_bytes"] = sum(p.stat().st_size for p in out.iterdir() if not p.name.endswith(".stats.json"))
        if cand["format"] == "parquet" and not cand["patch"].get("no_write"):
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(next(out.glob("*.parquet"))).metadata
            m["codec_in_file"] = meta.row_group(0).column(3).compression
    finally:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    return m


def column_shares(pcap, tmp_root, packets, rounds=3):
    """Per column: the process CPU of writing it alone (best of `rounds`), without a codec and with zstd, in µs per
    packet, and its zstd bytes per transaction. The records: those `dnsprobe read` writes of the capture."""
    import io
    import subprocess

    import pyarrow as pa
    import pyarrow.parquet as pq

    from export.parquet.schema import DELTA_ENCODED, UNIQUE_VALUED, UNSORTED_WITHOUT_STATISTICS

    out = Path(tempfile.mkdtemp(prefix="codec-columns-", dir=tmp_root))
    subprocess.run([sys.executable, "-m", "probe", "read", str(pcap), "-o", str(out), "-q", "--no-progress"],
                   cwd=HERE.parent, check=True)
    table = pa.concat_tables(pq.read_table(f) for f in sorted(out.glob("*.parquet")))
    rows = []
    for name in table.column_names:
        one = table.select([name])
        row = {"column": name}
        for codec in ("none", "zstd"):
            best = None
            for _ in range(rounds):
                sink = io.BytesIO()
                t0 = time.process_time()
                writer = pq.ParquetWriter(
                    sink, one.schema, compression=codec, use_dictionary=name not in UNIQUE_VALUED,
                    column_encoding={name: "DELTA_BINARY_PACKED"} if name in DELTA_ENCODED else None,
                    write_statistics=name not in UNSORTED_WITHOUT_STATISTICS, write_page_index=True)
                writer.write_table(one, row_group_size=100_000)
                writer.close()
                cpu = time.process_time() - t0
                best = cpu if best is None else min(best, cpu)
            row[f"{codec}_us_per_packet"] = round(best / packets * 1e6, 4)
            row[f"{codec}_bytes_per_transaction"] = round(len(sink.getvalue()) / table.num_rows, 2)
        rows.append(row)
    rows.sort(key=lambda r: -r["zstd_us_per_packet"])
    return rows


def summarise(cand, samples, packets):
    cpus = [s["cpu_seconds"] for s in samples]
    cpu = statistics.median(cpus)
    records = samples[-1]["records"]
    return {
        "name": cand["name"], "format": cand["format"], "note": cand["note"], "sets": cand["sets"],
        "patch": cand["patch"], "runs": len(samples), "cpu_seconds_median": round(cpu, 4),
        "cpu_seconds_min": round(min(cpus), 4), "cpu_seconds_max": round(max(cpus), 4),
        "cpu_us_per_packet": round(cpu / packets * 1e6, 3), "pkts_per_cpu_second": round(packets / cpu),
        "max_rss_mb": max(s["max_rss_mb"] for s in samples), "records": records,
        "output_bytes": samples[-1]["output_bytes"],
        "bytes_per_transaction": round(samples[-1]["output_bytes"] / records, 2),
        "codec_in_file": samples[-1].get("codec_in_file"), "samples": samples,
    }


def markdown(res):
    rows = {r["name"]: r for r in res["candidates"]}
    lines = [
        "# Output encodings: CPU per packet against bytes per transaction", "",
        f"Run {res['date_utc']} by `{res['command']}`.", "",
        f"Input: `{res['input']['file']}`: {res['input']['packets']:,} packets of the standard mix (seed 1), "
        f"{res['input']['records']:,} transactions.", "",
        f"`dnsprobe read` per candidate, pinned to CPU {res['core']}, user+system CPU of the child; {res['repeat']} "
        "interleaved rounds, median (min-max). Δ: against the default of its format before (Parquet zstd, C-DNS none).",
        "",
        "| candidate | CPU µs/packet | min-max CPU s | Δ CPU | pkts/CPU-s | bytes/transaction | Δ bytes | max RSS MB "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["candidates"]:
        ref = rows["zstd" if r["format"] == "parquet" else "cdns none"]
        dcpu = r["cpu_seconds_median"] / ref["cpu_seconds_median"] - 1
        nbytes = "(nothing written)" if r["patch"].get("no_write") else f"{r['bytes_per_transaction']:.2f}"
        dbytes = "" if r["patch"].get("no_write") else \
            f"{r['bytes_per_transaction'] / ref['bytes_per_transaction'] - 1:+.1%}"
        lines.append(
            f"| {r['name']} | {r['cpu_us_per_packet']:.3f} | {r['cpu_seconds_min']:.2f}-{r['cpu_seconds_max']:.2f} | "
            f"{dcpu:+.1%} | {r['pkts_per_cpu_second']:,} | {nbytes} | {dbytes} | {r['max_rss_mb']:.0f} | {r['note']} |")
    if "no-writer" in rows and "zstd" in rows and "none" in rows:
        w, z, n = rows["no-writer"], rows["zstd"], rows["none"]
        per_rec = res["packets"] / z["records"]
        share = (z["cpu_seconds_median"] - w["cpu_seconds_median"]) / z["cpu_seconds_median"]
        lines += [
            "", f"The writer's share (Parquet, µs per packet; × {per_rec:.2f} per transaction):", "",
            f"- whole writer (zstd − no-writer): {z['cpu_us_per_packet'] - w['cpu_us_per_packet']:.3f} "
            f"of {z['cpu_us_per_packet']:.3f} ({share:.0%})",
            f"- encoding without codec (none − no-writer): {n['cpu_us_per_packet'] - w['cpu_us_per_packet']:.3f}",
            f"- the zstd codec (zstd − none): {z['cpu_us_per_packet'] - n['cpu_us_per_packet']:.3f}",
        ]
    if res.get("columns"):
        cols = res["columns"]
        lines += ["", "Each column written alone, in-process (`--columns`; best of 3, process CPU; as the exporter "
                  "writes it):", "",
                  "| column | µs/packet, no codec | µs/packet, zstd | bytes/transaction, no codec | zstd |",
                  "|---|---|---|---|---|"]
        for c in cols[:15]:
            lines.append(f"| {c['column']} | {c['none_us_per_packet']:.3f} | {c['zstd_us_per_packet']:.3f} | "
                         f"{c['none_bytes_per_transaction']:.2f} | {c['zstd_bytes_per_transaction']:.2f} |")
        rest = cols[15:]
        lines.append(f"| the other {len(rest)} | {sum(c['none_us_per_packet'] for c in rest):.3f} | "
                     f"{sum(c['zstd_us_per_packet'] for c in rest):.3f} | "
                     f"{sum(c['none_bytes_per_transaction'] for c in rest):.2f} | "
                     f"{sum(c['zstd_bytes_per_transaction'] for c in rest):.2f} |")
        lines.append(f"| all, one at a time | {sum(c['none_us_per_packet'] for c in cols):.3f} | "
                     f"{sum(c['zstd_us_per_packet'] for c in cols):.3f} | "
                     f"{sum(c['none_bytes_per_transaction'] for c in cols):.2f} | "
                     f"{sum(c['zstd_bytes_per_transaction'] for c in cols):.2f} |")
    m = res["machine"]
    lines += ["", "## Machine and code", "",
              f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs; load average at start "
              f"{m.get('load_average_at_start')}, at end {res['load_average_at_end']}",
              f"- {m['python']}; pyarrow {m['pyarrow']}; kernel {m['kernel']}",
              f"- dnsprobe at {res['code']['git_commit']}"
              f"{' (uncommitted changes)' if res['code']['uncommitted_changes_in_probe_or_export'] else ''}",
              ""]
    return "\n".join(lines)


def code(offline):
    """The code measured (benchmarks/offline.code), with the command every candidate runs."""
    return {**offline.code(), "dnsprobe_command": "python benchmarks/encodings.py --child PATCH read FILE -o TMPDIR -q "
            "--no-progress --format FORMAT [--set KEY=VALUE ...]"}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return run_child(json.loads(argv[1]), argv[2:])
    import offline  # noqa: E402  (benchmarks/ is not a package; the child never imports it)
    import traffic

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median reported; default 3)")
    ap.add_argument("--only", help="comma-separated candidate names")
    ap.add_argument("--list", action="store_true", help="print the candidates' names")
    offline.add_core_option(ap)
    ap.add_argument("--columns", action="store_true", help="also each Parquet column's writing time, in-process")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(c["name"] for c in CANDIDATES))
        return 0
    cands = CANDIDATES
    if args.only:
        wanted = args.only.split(",")
        cands = [c for c in CANDIDATES if c["name"] in wanted]
    core = offline.pinned_core(args.core)
    mach = offline.machine()
    pcap = traffic.generate("standard", args.packets, 1)
    offline.compile_bytecode()
    samples = {c["name"]: [] for c in cands}
    with tempfile.TemporaryDirectory(prefix="dnsprobe-codecs-") as tmp:
        for i in range(args.repeat):
            for c in cands:
                m = measure(c, pcap, core, tmp, offline)
                samples[c["name"]].append(m)
                print(f"round {i + 1}/{args.repeat} {c['name']:18} {m['cpu_seconds']:.3f} s CPU "
                      f"{m['output_bytes'] / m['records']:.2f} B/tx", flush=True)
        columns = column_shares(pcap, tmp, args.packets) if args.columns else None
    results = [summarise(c, samples[c["name"]], args.packets) for c in cands]
    res = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "command": "python benchmarks/encodings.py " + " ".join(argv),
        "core": core, "repeat": args.repeat, "packets": args.packets, "machine": mach,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "code": code(offline),
        "input": {"file": str(Path(pcap).relative_to(HERE.parent)) if Path(pcap).is_relative_to(HERE.parent)
                  else str(pcap), "packets": args.packets, "records": results[0]["records"]},
        "candidates": results,
        "columns": columns,
    }
    text = markdown(res)
    offline.report("encodings", res, text, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.path[:0] = [str(HERE), str(HERE.parent)]  # benchmarks' modules, and the dnsprobe of this checkout
    sys.exit(main())
