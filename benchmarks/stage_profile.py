"""Where the time goes: the start of `dnsprobe read` to its first frame decoded, and a read's CPU per stage.

    python benchmarks/stage_profile.py                  # 1,000,000 packets of the standard mix, 3 rounds
    python benchmarks/stage_profile.py --quick          # 100,000 packets, 1 round

  start-up  `dnsprobe read` of a 2,000-packet file with DNSPROBE_TIMELINE=1 (probe/timeline.py), rounds of it:
            each point's offset from the moment this script started the process (CLOCK_MONOTONIC, shared by the
            processes), median; and `python -X importtime` of the same command, each module's own time summed by
            group (dnsprobe's modules, PyYAML, pyarrow, pyarrow.parquet and the file systems it imports, the rest).
  stages    the read in this process, as `dnsprobe read` runs it with one worker (a Pipeline fed by the file's
            source), each stage's method wrapped by a timer of this thread's CPU time, exclusive of the stages it
            calls (read, decode, match, column build, enrichment, the format's writer); what no stage holds is the
            pipeline's own Python ("glue"). Threads other than this one (C-DNS's compressor) are the process's CPU
            minus this thread's. Parquet, C-DNS, and Parquet with the public resolvers and public suffixes filled
            (enrichment), alternated in each round; medians. Wrapping adds a call per batch, not per packet.
  coremask  `dnsprobe read FILE --coremask 0x1` and `0x3` alternated, wall seconds, median: the speed-up of two
            pinned workers (the machine is shared: the `ceiling` of benchmarks/parallel.py says what it gives two
            processes).

The decoder's stage holds L2-L4 and the DNS walk together (one C call per batch, probe/decode/_decoderec.c), and the
Parquet writer's holds encoding, compression and the writes (one pyarrow call per row group): `perf` splits them
(docs/performance.md says how it was run). Results go to benchmarks/results/stage_profile.json and stage_profile.md.
"""

import argparse
import collections
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import offline  # noqa: E402  (benchmarks/ is not a package)
import traffic  # noqa: E402

STARTUP_PACKETS = 2000
VARIANTS = {
    "Parquet": {},
    "C-DNS": {"export.format": "cdns"},
    "Parquet, enriched": {"enrich.public_resolvers": True, "enrich.public_suffix": True},
}
# -X importtime groups, by module name (the first that matches).
IMPORT_GROUPS = (
    ("dnsprobe (probe, export)", re.compile(r"^(probe|export)(\.|$)")),
    ("PyYAML", re.compile(r"^_?yaml(\.|$)")),
    ("OpenSSL: hashlib (the configuration digest), ssl (pyarrow.fs)",
     re.compile(r"^(_?hashlib|_ssl|ssl|_blake2|_sha\w*|_md5)$")),
    ("pyarrow.parquet and pyarrow's file systems", re.compile(r"^pyarrow\.(parquet|_parquet|fs|_fs|_s3fs|_gcsfs|"
                                                                r"_hdfs|_azurefs|_dataset\w*)")),
    ("pyarrow", re.compile(r"^pyarrow(\.|$)")),
    ("the interpreter's own start (site, encodings, the editable install's finder)",
     re.compile(r"^(site|encodings|_distutils_hack|__editable__\w*|_frozen_importlib_external|codecs|io|abc|os|stat|"
                r"posixpath|genericpath|_collections_abc|_sitebuiltins)(\.|$)")),
)


# ----------------------------------------------------------------------------------------------
# Start-up
# ----------------------------------------------------------------------------------------------


def startup_timeline(pcap, rounds, tmp_root):
    """{point: median ms from the process's start}, from DNSPROBE_TIMELINE's marks (and the end of the process)."""
    out = Path(tmp_root) / "startup"
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "probe", "read", str(pcap), "-o", str(out), "--overwrite", "-q", "--no-progress"]
    env = dict(os.environ, DNSPROBE_TIMELINE="1")
    points = collections.defaultdict(list)
    for _ in range(rounds):
        began = time.monotonic_ns() / 1e6
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        points["process ended"].append(time.monotonic_ns() / 1e6 - began)
        for line in proc.stderr.splitlines():
            if line.startswith("dnsprobe timeline:"):
                words = line.split()
                points[" ".join(words[6:])].append(float(words[2]) - began)
    ordered = sorted(points.items(), key=lambda kv: statistics.median(kv[1]))
    return {p: round(statistics.median(v), 1) for p, v in ordered}


def import_groups(pcap, rounds, tmp_root):
    """{group: median ms}: -X importtime's own time of each module, summed by IMPORT_GROUPS (the rest: 'other')."""
    out = Path(tmp_root) / "importtime"
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-X", "importtime", "-m", "probe", "read", str(pcap), "-o", str(out), "--overwrite", "-q",
           "--no-progress"]
    sums = collections.defaultdict(list)
    for _ in range(rounds):
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        total = collections.Counter()
        for line in proc.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
            if m:
                name = m.group(2)
                group = next((g for g, pattern in IMPORT_GROUPS if pattern.match(name)), "other (standard library)")
                total[group] += int(m.group(1)) / 1000
        for group in [g for g, _ in IMPORT_GROUPS] + ["other (standard library)"]:
            sums[group].append(total[group])
    return {g: round(statistics.median(v), 1) for g, v in sums.items()}


# ----------------------------------------------------------------------------------------------
# Stages, in this process
# ----------------------------------------------------------------------------------------------


class StageTimer:
    """CPU time of this thread per stage, each call's time less that of the stages it calls."""

    def __init__(self):
        self.ns = collections.Counter()
        self._inner = []

    def wrap(self, stage, fn):
        def timed(*args, **kwargs):
            began = time.thread_time_ns()
            self._inner.append(0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time_ns() - began
                self.ns[stage] += spent - self._inner.pop()
                if self._inner:
                    self._inner[-1] += spent
        return timed


def profile_read(pcap, overrides, out_dir):
    """{stage: CPU s} of one read of pcap into out_dir as `dnsprobe read` runs it (probe.run.offline, one worker)."""
    import export.cdns.block as cdns_block
    import export.parquet.writer as parquet_writer
    from probe.capture.files import open_file_source
    from probe.config import load_config
    from probe.run import pipeline as pipeline_module
    from probe.run.offline import read_sources

    cfg = load_config(None, {"export.directory": str(out_dir), "export.overwrite": True, **overrides})
    timer = StageTimer()
    patched = [(parquet_writer, "write_row_groups"), (cdns_block.Block, "add"), (cdns_block.Block, "encode"),
               (pipeline_module.gc, "collect")]
    saved = [getattr(obj, name) for obj, name in patched]
    parquet_writer.write_row_groups = timer.wrap("Parquet: encode, compress, write", parquet_writer.write_row_groups)
    cdns_block.Block.add = timer.wrap("column build", cdns_block.Block.add)  # C-DNS: the block's items
    cdns_block.Block.encode = timer.wrap("C-DNS: CBOR encode", cdns_block.Block.encode)
    pipeline_module.gc.collect = timer.wrap("garbage collection", gc.collect)
    try:
        began_thread, began_process = time.thread_time_ns(), time.process_time_ns()
        def made():
            made = pipeline_module.Pipeline(cfg, out_dir, sources=read_sources([pcap]))
            made.exporter  # noqa: B018 - made here, in the set-up (a read makes it at its first export)
            return made

        pipeline = timer.wrap("set-up (the pipeline made: exporter, enrichment's lists)", made)()
        decoder, table, exporter = pipeline.decoder, pipeline.table, pipeline.exporter
        decoder.decode_into = timer.wrap("decode: L2-L4 and DNS walk", decoder.decode_into)
        decoder.flush = timer.wrap("decode: L2-L4 and DNS walk", decoder.flush)
        table.add = timer.wrap("match", table.add)
        table.flush = timer.wrap("match", table.flush)
        exporter.write = timer.wrap("exporter's own Python", exporter.write)
        exporter._close = timer.wrap("exporter's own Python", exporter._close)
        if hasattr(exporter, "builder"):
            exporter.builder.build_from_records = timer.wrap("column build", exporter.builder.build_from_records)
            exporter.steps = tuple(timer.wrap("enrichment", step) for step in exporter.steps)
        source = open_file_source(str(pcap), cfg.run.batch_size)
        source.read = timer.wrap("pcap read", source.read)
        while (batch := source.read()) is not None:
            pipeline.feed(batch, source.name)
        source.close()
        pipeline.finish()
        for f in exporter.finishing:  # (C-DNS: its compressor threads), done
            f.join()
        thread_ns = time.thread_time_ns() - began_thread
        process_ns = time.process_time_ns() - began_process
    finally:
        for (obj, name), value in zip(patched, saved):
            setattr(obj, name, value)
    stages = {stage: ns / 1e9 for stage, ns in timer.ns.items()}
    stages["pipeline's own Python (feed, batches, counters)"] = (thread_ns - sum(timer.ns.values())) / 1e9
    if process_ns - thread_ns > 0:
        stages["other threads (C-DNS: compress and write)"] = (process_ns - thread_ns) / 1e9
    stages["total"] = process_ns / 1e9
    return stages


def stage_table(pcap, rounds, tmp_root):
    """{variant: {stage: median CPU s}}, the variants alternated in each round."""
    samples = {v: collections.defaultdict(list) for v in VARIANTS}
    for _ in range(rounds):
        for variant, overrides in VARIANTS.items():
            out = Path(tempfile.mkdtemp(dir=tmp_root))
            for stage, seconds in profile_read(pcap, overrides, out).items():
                samples[variant][stage].append(seconds)
    return {v: {s: round(statistics.median(x), 4) for s, x in st.items()} for v, st in samples.items()}


# ----------------------------------------------------------------------------------------------
# perf: the stages inside one C call (the decoder's L2-L4 and DNS walk; Parquet's encoding, compression, writes)
# ----------------------------------------------------------------------------------------------

# (class, DSO pattern, symbol pattern) of a sample's own frame, the first that matches. A frame of the C library,
# the interpreter or the kernel's memory management is given to the first frame below it that has a class.
PERF_CLASSES = (
    ("pcap read", r"_pcaprecords", r""),
    ("ring read", r"_ring", r""),
    ("decode: L2-L4 (frame, IP, UDP/TCP, flow hash)", r"_decoderec|_tcpstream",
     r"^(classify|fast_frame|decode_packed|decode_frames|frame_at|flow_hash|select_share|check_frame_args|tcp_)"),
    ("decode: DNS walk and message record", r"_decoderec|_fastwire", r""),
    ("match", r"_matchrec", r""),
    ("column build", r"_parquetrec|_answers|_records|_cdnsblock", r""),
    ("enrichment", r"_lookup|_psl|_resolvers", r""),
    ("Parquet/C-DNS: compress", r"libarrow|libzstd|liblzma|libz\.|_zstd|backend_c", r"^(ZSTD|HUF|HIST|FSE|lzma|deflate|"
     r"LZ4)|zstd|compress"),
    ("Parquet: encode", r"libparquet", r""),
    ("Arrow (tables, buffers)", r"libarrow", r""),
    ("kernel: reading the file", r"kernel", r"^(ksys_read|vfs_read|filemap_read|filemap_get|copy_page_to_iter|"
     r"_copy_to_it)"),
    ("kernel: writing the files", r"kernel", r"^(ksys_write|vfs_write|ext4_|iomap_|generic_perform_write|"
     r"_copy_from_iter)"),
    ("kernel: page faults and memory", r"kernel", r"^(exc_page_fault|do_anonymous_page|__handle_mm_fault|"
     r"__do_sys_brk|__x64_sys_munmap|__x64_sys_mmap|do_exit|clear_page)"),
)
UNATTRIBUTED = "interpreter, C library, kernel (unattributed)"


def perf_class(frames):
    """The class of one sample: frames, (symbol, DSO) from its own frame down."""
    for symbol, dso in frames:
        for name, dso_pattern, sym_pattern in PERF_CLASSES:
            if re.search(dso_pattern, dso) and re.search(sym_pattern, symbol):
                if not name.startswith("kernel") or dso.startswith("[kernel"):
                    return name
    return UNATTRIBUTED


def perf_shares(cmd, data):
    """{class: share of the samples} of `perf record -g` of cmd (call chains by frame pointers: the unattributed
    row holds what they do not reach)."""
    subprocess.run(["perf", "record", "-q", "-F", "1999", "-g", "-o", str(data), "--", *cmd], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return perf_classes(data)


def perf_classes(data, main_tid=None):
    """{class: share of the samples} of a perf.data file, and "samples"; with main_tid (a process's pid), also
    "threads": the same of that thread's samples ("main") and of the others' ("other"), as shares of all."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,ip,sym,dso"], capture_output=True,
                            text=True, check=True).stdout
    counts = collections.Counter()
    by_thread = {"main": collections.Counter(), "other": collections.Counter()}
    for sample in script.split("\n\n"):
        frames = [(m.group(1), m.group(2)) for m in re.finditer(r"^\s*[0-9a-f]+ (\S+).*\((\S+)\)$", sample, re.M)]
        if frames:
            name = perf_class(frames)
            counts[name] += 1
            tid = sample.split(None, 1)[0]
            by_thread["main" if tid == str(main_tid) else "other"][name] += 1
    total = sum(counts.values())
    res = {name: round(n / total, 3) for name, n in counts.most_common()} | {"samples": total}
    if main_tid is not None:
        res["threads"] = {t: {name: round(n / total, 3) for name, n in c.most_common()} | {"all": round(
            sum(c.values()) / total, 3)} for t, c in by_thread.items()}
    return res


def perf_live(pcap, packets, rate, tmp_root, settings=()):
    """perf_classes of a live capture worker (benchmarks/live.py's testbed: a veth pair, tcpreplay at `rate` pkts/s
    on core 0, one worker on core 1) from the start of the replay to the worker's exit (SIGTERM after it caught up:
    its journal made into the Parquet file included), with the worker's CPU seconds and packets captured. settings:
    KEY=VALUE configuration of the capture (e.g. export.format=cdns)."""
    import live  # (its testbed needs root)

    live.ensure_tcpreplay()
    live.OPTIONS["code_dir"] = str(ROOT)  # `python -m probe` of this tree, as the rest of this benchmark
    live.OPTIONS["set"] = list(settings)
    out = Path(tempfile.mkdtemp(dir=tmp_root))
    data = Path(tmp_root) / "live-perf.data"
    probe = recorder = None
    with live.Testbed() as bed, open(out / "probe.log", "w+") as log:
        try:
            (out / "files").mkdir()
            probe, worker, _ = live.start_probe(bed, out / "files", log)
            recorder = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-g", "-p", str(worker), "-o",
                                         str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)  # perf attached
            cpu0 = live.proc_cpu(worker)[0]
            subprocess.run(live.tcpreplay_command(bed, pcap, rate), check=True, capture_output=True)
            while True:  # caught up: its CPU time stands still
                before = live.proc_cpu(worker)[0]
                time.sleep(0.3)
                if live.proc_cpu(worker)[0] - before < 0.01:
                    break
            cpu_run = live.proc_cpu(worker)[0] - cpu0
            live.stop_process(probe)
            recorder.wait(60)
        finally:
            live.stop_process(probe)
            live.stop_process(recorder)
    stats = json.loads(sorted((out / "files").glob("*.stats.json"))[-1].read_text())
    return {"offered_pps": rate, "packets_sent": packets, "captured": stats["counters"]["packets"],
            "worker_cpu_seconds_while_capturing": round(cpu_run, 3), "classes": perf_classes(data, worker)}


def perf_table(pcap, tmp_root):
    """{variant: perf_shares} of `dnsprobe read` (one worker) of pcap, Parquet and C-DNS."""
    res = {}
    for variant, flags in (("Parquet", []), ("C-DNS", ["--format", "cdns"])):
        out = Path(tempfile.mkdtemp(dir=tmp_root))
        cmd = [sys.executable, "-m", "probe", "read", str(pcap), "-o", str(out), "-q", "--no-progress", *flags]
        res[variant] = perf_shares(cmd, out / "perf.data")
    return res


# ----------------------------------------------------------------------------------------------
# Two pinned workers
# ----------------------------------------------------------------------------------------------


def coremask_speedup(pcap, rounds, tmp_root):
    """{mask: median wall s} of `read --coremask` 0x1 and 0x3, alternated, and the speed-up."""
    walls = collections.defaultdict(list)
    for _ in range(rounds):
        for mask in ("0x1", "0x3"):
            out = Path(tempfile.mkdtemp(dir=tmp_root))
            cmd = [sys.executable, "-m", "probe", "read", str(pcap), "-o", str(out), "-q", "--no-progress",
                   "--coremask", mask]
            began = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True)
            walls[mask].append(time.perf_counter() - began)
    res = {mask: round(statistics.median(v), 3) for mask, v in walls.items()}
    res["speedup"] = round(res["0x1"] / res["0x3"], 2)
    res["rounds"] = {mask: [round(x, 3) for x in v] for mask, v in walls.items()}
    return res


# ----------------------------------------------------------------------------------------------


def markdown(res):
    lines = [
        "# Where the time goes (`benchmarks/stage_profile.py`)",
        "",
        f"Run {res['date_utc']} by `{res['command']}`, commit {res['code']['git_commit']}; load average "
        f"{res['machine']['load_average_at_start']} at the start (a shared machine: compare shares, not seconds "
        "across runs).",
        "",
        f"## Start-up: `dnsprobe read` of {STARTUP_PACKETS:,} packets, {res['startup_rounds']} rounds, medians",
        "",
        "| point | ms from the process's start |",
        "|---|---|",
    ]
    lines += [f"| {p} | {ms} |" for p, ms in res["timeline"].items()]
    lines += ["", "| imports (-X importtime, own time of each module summed) | ms |", "|---|---|"]
    lines += [f"| {g} | {ms} |" for g, ms in res["imports"].items()]
    names = list(res["stages"])
    lines += ["", f"## CPU per stage: `read` of {res['packets']:,} packets, one worker, in-process, "
              f"{res['rounds']} rounds, medians", "",
              "| stage | " + " | ".join(f"{n}: CPU s (share)" for n in names) + " |",
              "|---|" + "---|" * len(names)]
    stages = list(dict.fromkeys(s for n in names for s in res["stages"][n] if s != "total"))
    order = sorted(stages, key=lambda s: -res["stages"][names[0]].get(s, 0))
    for stage in order + ["total"]:
        cells = []
        for n in names:
            st = res["stages"][n]
            value = st.get(stage)
            cells.append("-" if value is None else f"{value:.3f} ({100 * value / st['total']:.0f} %)")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    perf = dict(res.get("perf") or {})
    if res.get("live"):
        live_classes = dict(res["live"]["classes"])
        threads = live_classes.pop("threads", None)
        perf["live capture worker"] = live_classes
        if threads:  # (shares of all the worker's samples: the two columns add up to the one before)
            perf["live: its capture thread"] = threads["main"]
            perf["live: its other threads (the journal's conversion)"] = threads["other"]
    if perf:
        names = list(perf)
        lines += ["", "## perf: share of the samples by class (`perf record -g`, the whole process; C and kernel "
                  "frames by DSO and symbol, benchmarks/stage_profile.py PERF_CLASSES)", "",
                  "| class | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        classes = list(dict.fromkeys(c for n in names for c in perf[n] if c not in ("samples", "all")))
        for c in classes + ["all", "samples"]:
            cells = [f"{perf[n][c]:,}" if c == "samples" else f"{100 * perf[n][c]:.1f} %" if c in perf[n] else "-"
                     for n in names]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
    if res.get("live"):
        lv = res["live"]
        lines += ["", f"Live: {lv['packets_sent']:,} packets at {lv['offered_pps']:,} pkts/s, {lv['captured']:,} "
                  f"captured; the worker's CPU from the replay's start until it caught up: "
                  f"{lv['worker_cpu_seconds_while_capturing']} s (its exit, the journal made into Parquet, after)."]
    if res.get("coremask"):
        c = res["coremask"]
        lines += ["", f"## `read --coremask`, {res['packets']:,} packets, wall s, medians of alternated rounds", "",
                  f"0x1: {c['0x1']} s, 0x3: {c['0x3']} s: **×{c['speedup']}** (rounds: 0x1 {c['rounds']['0x1']}, "
                  f"0x3 {c['rounds']['0x3']})."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    offline.add_rounds_options(ap, "rounds of the stages and of --coremask")
    ap.add_argument("--startup-rounds", type=int, default=15)
    ap.add_argument("--no-coremask", action="store_true", help="skip the --coremask 0x1 / 0x3 runs")
    ap.add_argument("--perf", action="store_true", help="also `perf record` a read of each format (needs perf)")
    ap.add_argument("--live", type=int, metavar="PPS", help="also `perf record` a live capture worker, the file "
                    "replayed at PPS packets a second (root: a veth testbed, benchmarks/live.py)")
    ap.add_argument("--live-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a configuration key of the --live capture (repeatable), e.g. export.format=cdns")
    ap.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/stage_profile.*")
    args = ap.parse_args(argv)
    args.packets, args.rounds = offline.packets_and_rounds(args)
    if args.quick:
        args.startup_rounds = 5
    sys.modules.setdefault("numpy", None)  # as the command runs (probe/console.py)
    offline.compile_bytecode()
    small = traffic.generate("standard", STARTUP_PACKETS, 1)
    pcap = traffic.generate("standard", args.packets, 1)
    res = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "command": "python benchmarks/stage_profile.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": offline.machine(),
           "code": offline.code() | {"dnsprobe_command": "python -m probe read FILE -o TMPDIR -q --no-progress"},
           "packets": args.packets, "rounds": args.rounds, "startup_rounds": args.startup_rounds}
    with tempfile.TemporaryDirectory() as tmp_root:
        res["timeline"] = startup_timeline(small, args.startup_rounds, tmp_root)
        res["imports"] = import_groups(small, args.startup_rounds, tmp_root)
        res["stages"] = stage_table(pcap, args.rounds, tmp_root)
        if args.perf:
            res["perf"] = perf_table(pcap, tmp_root)
        if args.live:
            res["live"] = perf_live(pcap, args.packets, args.live, tmp_root, args.live_set)
        if not args.no_coremask:
            res["coremask"] = coremask_speedup(pcap, max(args.rounds, 5), tmp_root)
    res["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    offline.report("stage_profile", res, markdown(res), not args.no_save)


if __name__ == "__main__":
    sys.exit(main())
