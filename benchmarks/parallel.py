"""Parallel offline reading: `dnsprobe read --workers N` against one worker, in wall-clock time on this machine.

    python benchmarks/parallel.py                 # 1,000,000 packets of the standard mix, 3 rounds
    python benchmarks/parallel.py --quick         # 100,000 packets, 1 round, no compressed inputs

Each figure is the median of the rounds; in a round the contenders run one after the other, in the same order,
so that the VM's drift (its speed changes by tens of percent within minutes) falls on all of them alike.

  workers   `dnsprobe read FILE -o DIR -q --no-progress --workers N` (also --coremask, one worker pinned per
            core): wall seconds, CPU seconds of all its processes (os.wait4), and per worker its CPU and busy
            seconds (from the statistics file). The output of every N equals one worker's (checked: the records,
            sorted, compared column by column). Also in CPU time, which the other sessions' load inflates far
            less than the wall clock: one worker's CPU over the parent's plus the busiest worker's.
  ceiling   two independent one-worker reads at once, pinned to cores 0 and 1: the speed-up this machine gives
            two CPU-bound processes at this moment, 2 x (alone / together). Other sessions' work and the
            hypervisor show here, not in dnsprobe.
  halves    two independent one-worker reads at once, pinned, each of one worker's share written as a file of
            its own: the split without a worker's reading and hashing of the frames it skips, nor the parent.
  phases    DNSPROBE_TIMELINE's points of every run (ms from the start of the command, medians): the serial
            start until the workers are forked, each worker's end, the parent's joining and exit.
  machine   /proc/stat over each run: busy CPU seconds of every process on the machine beside ours, and steal.
  split     in-process: the whole file into packed frames (read_capture), then the same with one worker's share
            kept as the splitter lays the frames out (include/wire.h flow_hash, keep or skip: read_capture's
            share), and a share that skips nearly every frame (the cost a worker pays for the others' frames).
  inputs    xz, gzip and zstd copies of the file: one worker; two with the parent decompressing once and copying
            into pipes (dnsprobe's way); two that each decompress the file themselves (the alternative).
  balance   packets per worker, 2 to 4 workers, of the address-pair hash and of a 5-tuple hash (ports included),
            on this mix, the bundled sample and the tests' oracle captures (tests/data).

Results go to benchmarks/results/parallel.json and parallel.md.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import offline  # noqa: E402  (benchmarks/ is not a package)
import traffic  # noqa: E402

TARGET_SPEEDUP = 1.8
QUICK_PACKETS = 100_000
# A read whose workers each decompress the file themselves (instead of the parent once, into pipes).
EACH_DECOMPRESSES = ("import sys, probe.run.offline as o; o._opens_itself = lambda path: True;"
                     " from probe.console import main; sys.exit(main()))")


def proc_stat():
    """(busy jiffies, steal jiffies) of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _, _, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq, steal


def run(cmd, out, pin=None):
    """Run a command; returns wall seconds, CPU seconds (its processes, waited for), machine busy/steal seconds, the
    points of its timeline (ms from its start: the first process to reach each)."""
    hz = os.sysconf("SC_CLK_TCK")
    busy0, steal0 = proc_stat()
    start_ms = time.monotonic_ns() / 1e6
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, DNSPROBE_TIMELINE="1"),
                            preexec_fn=(lambda: os.sched_setaffinity(0, pin)) if pin else None)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    busy1, steal1 = proc_stat()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {err}")
    cpu = ru.ru_utime + ru.ru_stime
    return {"wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "machine_busy_seconds": round((busy1 - busy0) / hz, 2), "steal_seconds": round((steal1 - steal0) / hz, 2),
            "others_cpu_seconds": round(max(0.0, (busy1 - busy0) / hz - cpu), 2), "phases": timeline(err, start_ms)}


def timeline(stderr, start_ms):
    """The points of a DNSPROBE_TIMELINE run's stderr, ms from start_ms (CLOCK_MONOTONIC, which every process shares);
    a point two processes pass (first frame decoded), the first."""
    points = {}
    for line in stderr.splitlines():
        m = re.match(r"dnsprobe timeline: ([\d.]+) ms pid \d+ (.+)", line)
        if m:
            points.setdefault(m.group(2), round(float(m.group(1)) - start_ms, 1))
    return points


def read_cmd(inputs, out, *extra, python_code=None):
    # `python -m probe` in this tree (ROOT, the commands' cwd): the code measured is the one beside this script,
    # also in a git worktree whose venv's console script would import another checkout.
    offline.compile_bytecode(ROOT)
    base = [sys.executable, "-c", python_code] if python_code else [sys.executable, "-m", "probe"]
    return [*base, "read", *map(str, inputs), "-o", str(out), "-q", "--no-progress", *map(str, extra)]


def measure_read(inputs, tmp, label, *extra, python_code=None):
    out = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=tmp))
    m = run(read_cmd(inputs, out, *extra, python_code=python_code), out)
    doc = json.loads(next(out.glob("*.stats.json")).read_text())
    m["packets"] = doc["counters"]["packets"]
    m["records"] = doc["counters"]["records"]
    if "workers" in doc:
        m["workers"] = {k: {"cpu_seconds": w["cpu_seconds"], "seconds": w["seconds"],
                            "packets": w["counters"]["packets"], "records": w["counters"]["records"]}
                        for k, w in doc["workers"].items()}
    return m, out


def sorted_records(out):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.concat_tables(pq.read_table(f) for f in sorted(out.glob("*.parquet")))
    keys = [f.name for f in table.schema if not pa.types.is_nested(f.type)]
    return table.sort_by([(name, "ascending") for name in keys])


def ceiling(pcap, tmp):
    """One read alone on core 0, then two at once on cores 0 and 1."""
    alone = run(read_cmd([pcap], Path(tempfile.mkdtemp(dir=tmp))), None, {0})
    together = at_once([pcap, pcap], tmp)
    return {"alone_wall_seconds": alone["wall_seconds"], "alone_cpu_seconds": alone["cpu_seconds"],
            "together_wall_seconds": together["wall_seconds"], "together_cpu_seconds": together["cpu_seconds"],
            "speedup_ceiling": round(2 * alone["wall_seconds"] / together["wall_seconds"], 3)}


def at_once(inputs, tmp):
    """One-worker reads of the inputs at once, the k-th pinned to core k: wall seconds until the last ends, and the
    CPU seconds of each."""
    outs = [Path(tempfile.mkdtemp(dir=tmp)) for _ in inputs]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(read_cmd([path], o), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=lambda core=core: os.sched_setaffinity(0, {core}))
             for core, (path, o) in enumerate(zip(inputs, outs, strict=True))]
    cpu = []
    walls = []
    for p in procs:
        _, _, ru = os.wait4(p.pid, 0)
        walls.append(time.perf_counter() - t0)
        cpu.append(ru.ru_utime + ru.ru_stime)
    for o in outs:
        shutil.rmtree(o, ignore_errors=True)
    return {"wall_seconds": round(max(walls), 3), "cpu_seconds": [round(c, 3) for c in cpu]}


def share_files(pcap, n, tmp):
    """Each worker's share of the capture (include/wire.h flow_hash modulo n, the frames read --workers n gives
    worker k) as a pcap file of its own."""
    import struct

    from probe.decode import _decoderec

    data = Path(pcap).read_bytes()
    linktype = struct.unpack_from("<I", data, 20)[0] & 0x0FFFFFFF
    parts = [[data[:24]] for _ in range(n)]
    pos = 24
    while pos + 16 <= len(data):
        end = pos + 16 + struct.unpack_from("<I", data, pos + 8)[0]
        parts[_decoderec.flow_hash(data[pos + 16 : end], linktype) % n].append(data[pos:end])
        pos = end
    paths = [Path(tmp) / f"share{k}of{n}.pcap" for k in range(n)]
    for path, part in zip(paths, parts, strict=True):
        path.write_bytes(b"".join(part))
    return paths


def splitter(pcap):
    """CPU seconds, in-process, over the whole file: reading it into packed frames; reading it keeping worker 0's
    share of 2; reading it keeping a share that skips nearly every frame."""
    from probe.capture.pcapfile import read_capture

    out = {}
    for name, share in (("read", None), ("read + share 0 of 2", (0, 2)),
                        ("read + skip nearly every frame", ((1 << 20) - 1, 1 << 20))):
        t0 = time.process_time()
        kept = 0
        for batch in read_capture(pcap, 4096, share=share):
            kept += len(batch)
        out[name] = {"cpu_seconds": round(time.process_time() - t0, 3), "frames_kept": kept}
    return out


def compressed_copies(pcap):
    """xz, gzip and zstd copies of the capture, cached beside it."""
    copies = {}
    for kind, suffix, cmd in (("xz", ".xz", ["xz", "-1", "-T2", "-c"]), ("gzip", ".gz", ["gzip", "-1", "-c"]),
                              ("zstd", ".zst", ["zstd", "-1", "-q", "-c"])):
        if not shutil.which(cmd[0]):
            continue
        path = Path(f"{pcap}{suffix}")
        if not path.exists():
            with open(f"{path}.part", "wb") as fh:
                subprocess.run([*cmd, str(pcap)], stdout=fh, check=True)
            os.replace(f"{path}.part", path)
        copies[kind] = path
    return copies


def decompression_seconds(path):
    from probe.compressed import open_stream

    t0 = time.process_time()
    stream, raw = open_stream(path)
    while stream.read(1 << 20):
        pass
    stream.close()
    raw.close()
    return round(time.process_time() - t0, 3)


def network_header(frame):
    """(ethertype, offset of the IP header) of an Ethernet frame, behind up to two VLAN tags."""
    at = 12
    for _ in range(3):
        etype = int.from_bytes(frame[at : at + 2], "big")
        if etype not in (0x8100, 0x88A8, 0x9100):
            return etype, at + 2
        at += 4
    return None, None


def mix(h):
    """flow_hash's last step (include/wire.h): times 0x9E3779B1, xor the upper half."""
    h = (h * 0x9E3779B1) & 0xFFFFFFFF
    return h ^ (h >> 16)


def _ports(frame, off, proto):
    if proto in (6, 17) and len(frame) >= off + 4:
        return int.from_bytes(frame[off : off + 2], "big") ^ int.from_bytes(frame[off + 2 : off + 4], "big")
    return 0


def five_tuple_hash(frame):
    """A symmetric hash of addresses, protocol and ports (the kind PACKET_FANOUT_HASH and L4 RSS compute), for
    the balance comparison; fragments after the first have no ports and hash on their addresses."""
    from probe.decode import _decoderec

    etype, ip = network_header(frame)
    h = _decoderec.flow_hash(frame, 1)
    if etype == 0x0800 and len(frame) >= ip + 20 and not int.from_bytes(frame[ip + 6 : ip + 8], "big") & 0x1FFF:
        return mix(h ^ frame[ip + 9] ^ _ports(frame, ip + (frame[ip] & 15) * 4, frame[ip + 9]))
    if etype == 0x86DD and len(frame) >= ip + 40:
        return mix(h ^ frame[ip + 6] ^ _ports(frame, ip + 40, frame[ip + 6]))
    return h


def balance(captures):
    """Per capture: packets of the busiest worker over the mean, for 2-4 workers, by address pair and by 5-tuple."""
    from probe.capture.pcapfile import read_capture
    from probe.decode import _decoderec

    out = {}
    for name, path in captures.items():
        pairs, tuples = [], []
        for batch in read_capture(path):
            if batch.linktype != 1:
                continue
            for frame in batch.data:
                pairs.append(_decoderec.flow_hash(frame, 1))
                tuples.append(five_tuple_hash(frame))
        if len(pairs) < 1000:
            continue  # a handful of flows says nothing about balance
        row = {"packets": len(pairs), "distinct_address_pairs": len(set(pairs))}
        for n in (2, 3, 4):
            for label, hashes in (("address_pair", pairs), ("five_tuple", tuples)):
                counts = [0] * n
                for h in hashes:
                    counts[h % n] += 1
                row[f"{label}_{n}"] = round(max(counts) / (len(hashes) / n), 3)
        out[name] = row
    return out


def median(samples, key):
    return round(statistics.median(s[key] for s in samples), 3)


def quiet(sample):
    """A run during which the machine's other sessions used less than a tenth of a core."""
    return sample["others_cpu_seconds"] < 0.1 * sample["wall_seconds"]


def phases(samples):
    """The median of each timeline point over the runs that passed it, in the order of the first run."""
    points = dict.fromkeys(p for s in samples for p in s["phases"])
    return {p: round(statistics.median(s["phases"][p] for s in samples if p in s["phases"]), 1) for p in points}


def summary(samples):
    calm = [s for s in samples if quiet(s)]
    out = {"runs": len(samples), "wall_seconds": median(samples, "wall_seconds"),
           "quiet_runs": len(calm), "quiet_wall_seconds": median(calm, "wall_seconds") if calm else None,
           "cpu_seconds": median(samples, "cpu_seconds"), "others_cpu_seconds": median(samples, "others_cpu_seconds"),
           "steal_seconds": median(samples, "steal_seconds"), "phases": phases(samples), "samples": samples}
    if "workers" in samples[0]:
        ids = sorted(samples[0]["workers"])
        out["worker_cpu_seconds"] = [round(statistics.median(s["workers"][k]["cpu_seconds"] for s in samples), 3)
                                     for k in ids]
        out["worker_seconds"] = [round(statistics.median(s["workers"][k]["seconds"] for s in samples), 3)
                                 for k in ids]
        out["worker_packets"] = [samples[0]["workers"][k]["packets"] for k in ids]
        # The parent's CPU (all of the command's but its workers') and the busiest worker's: the run's critical path
        # in CPU time, which the other sessions' load inflates far less than the wall clock.
        out["critical_cpu_seconds"] = round(statistics.median(
            s["cpu_seconds"] - sum(w["cpu_seconds"] for w in s["workers"].values())
            + max(w["cpu_seconds"] for w in s["workers"].values()) for s in samples), 3)
    return out


def markdown(res):
    inp, w = res["input"], res["workers"]
    one = w["1"]
    lines = [
        "# Parallel offline reading (`dnsprobe read --workers N`)",
        "",
        f"Run {res['date_utc']} by `{res['command']}`.",
        "",
        f"Input: `{inp['file']}`: {inp['packets']:,} packets of the `{inp['mix']}` mix, {inp['bytes'] / 1e6:.1f} MB, "
        "uncompressed, in the page cache. Medians of the rounds; wall seconds of the whole command.",
        "",
        "| run | wall s | speed-up | quiet runs: wall s, speed-up | CPU s (all processes) | per worker: CPU s / busy s"
        " | packets per worker | others' CPU s | steal s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in w.items():
        ref = w["1, the file 3 times"] if "3 times" in name else one  # the one-worker run of the same input
        speed = ref["wall_seconds"] / r["wall_seconds"]
        base = ref["quiet_wall_seconds"]
        calm = (f"{r['quiet_wall_seconds']:.2f} ({r['quiet_runs']}), {base / r['quiet_wall_seconds']:.2f}x"
                if r["quiet_runs"] and base else "-")
        per = ", ".join(f"{c:.2f} / {s:.2f}" for c, s in zip(r.get("worker_cpu_seconds", []),
                                                              r.get("worker_seconds", []), strict=True)) or "-"
        packets = ", ".join(f"{p:,}" for p in r.get("worker_packets", [])) or f"{inp['packets']:,}"
        lines.append(f"| {name} | {r['wall_seconds']:.2f} | {speed:.2f}x | {calm} | {r['cpu_seconds']:.2f} | {per} |"
                     f" {packets} | {r['others_cpu_seconds']:.2f} | {r['steal_seconds']:.2f} |")
    c = res["ceiling"]
    lines += [
        "",
        f"Output: every worker count wrote the records of one worker ({res['records']:,}), compared column by column "
        f"after sorting: **{'equal' if res['same_output'] else 'DIFFERENT'}**.",
        "",
        f"Target: 2 workers ≥ {TARGET_SPEEDUP}x one worker's wall clock. Reached: **{res['speedup_2']:.2f}x** "
        f"(median of all rounds; {'met' if res['speedup_2'] >= TARGET_SPEEDUP else 'NOT met'}); in the rounds where "
        "the machine's other sessions used less than a tenth of a core during both runs: "
        + (", ".join(f"{q:.2f}x" for q in res["speedup_2_quiet_rounds"]) or "none") + ".",
        "",
        "In CPU time (the other sessions' load inflates it far less than the wall clock): one worker's CPU over the "
        "parent's plus the busiest worker's, " + ", ".join(
            f"{name} **{one['cpu_seconds'] / r['critical_cpu_seconds']:.2f}x**" for name, r in w.items()
            if "critical_cpu_seconds" in r and "3 times" not in name) + ".",
        "",
        f"Start-up (a 100-frame file): {res['startup_wall_seconds']['1']:.2f} s with one worker, "
        f"{res['startup_wall_seconds']['2']:.2f} s with two: interpreter, imports and forks, which do not divide. "
        f"With it, two workers can reach at most **{res['speedup_2_bound']:.2f}x** on this input (the rest halved). "
        f"On the file read three times as one capture: **{res['speedup_2_three_files']:.2f}x**.",
        "",
        "## What this machine gives two processes",
        "",
        f"Two independent one-worker reads at once, pinned to cores 0 and 1: {c['together_wall_seconds']:.2f} s "
        f"against {c['alone_wall_seconds']:.2f} s for one alone (CPU {', '.join(map(str, c['together_cpu_seconds']))}"
        f" s against {c['alone_cpu_seconds']:.2f} s): a ceiling of **{c['speedup_ceiling']:.2f}x** for any "
        "two-process split of this work at this moment (medians). dnsprobe's 2 workers reach "
        f"{res['speedup_2'] / c['speedup_ceiling']:.0%} of it.",
        "",
        *phase_lines(res),
        "## The splitter's own cost (in-process, CPU s for the whole file)",
        "",
        "| | CPU s | frames kept |",
        "|---|---|---|",
    ]
    for name, s in res["splitter"].items():
        lines.append(f"| {name.replace('_', ' ')} | {s['cpu_seconds']:.3f} | {s['frames_kept']:,} |")
    if res.get("inputs"):
        lines += ["", "## Compressed inputs", "",
                  "Wall s, median of the quiet runs (other sessions under a tenth of a core; their count in "
                  "brackets), else of all runs (marked *).", "",
                  "| input | decompression alone, CPU s | 1 worker | 2 workers, parent decompresses once | "
                  "2 workers, each decompresses |", "|---|---|---|---|---|"]

        def wall(r):
            return (r["quiet_wall_seconds"], f"({r['quiet_runs']})") if r["quiet_runs"] else (r["wall_seconds"], "*")

        for kind, r in res["inputs"].items():
            (one_s, n1), (two, n2), (each, n3) = wall(r["1"]), wall(r["2"]), wall(r["2 each"])
            lines.append(f"| {kind} | {r['decompression_cpu_seconds']:.2f} | {one_s:.2f} {n1} | "
                         f"{two:.2f} {n2}: {one_s / two:.2f}x | {each:.2f} {n3}: {one_s / each:.2f}x |")
    lines += ["", "## Balance: packets of the busiest worker over the mean", "",
              "| capture | packets | address pairs | pair hash 2 / 3 / 4 | 5-tuple hash 2 / 3 / 4 |",
              "|---|---|---|---|---|"]
    for name, b in res["balance"].items():
        lines.append(f"| {name} | {b['packets']:,} | {b['distinct_address_pairs']:,} | "
                     f"{b['address_pair_2']} / {b['address_pair_3']} / {b['address_pair_4']} | "
                     f"{b['five_tuple_2']} / {b['five_tuple_3']} / {b['five_tuple_4']} |")
    m, code = res["machine"], res["code"]
    lines += ["", "## Machine and code", "",
              f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['usable_cpus']} usable), "
              f"{m['memory_gib']} GiB; kernel {m['kernel']}; {m['python']}",
              f"- load average at start {m['load_average_at_start']}, at end {res['load_average_at_end']}",
              f"- dnsprobe at {code['git_commit']}"
              + (" with uncommitted changes in probe/ or export/" if code["uncommitted_changes_in_probe_or_export"]
                 else "")]
    return "\n".join(lines) + "\n"


def phase_lines(res):
    """Where the wall clock of one worker and of two pinned goes (the timeline's points), and the two shares read as
    files of their own at once."""
    w = res["workers"]
    runs = [("1", w["1"])] + [(n, r) for n, r in w.items() if n.startswith("2 pinned")]
    lines = ["## Where the wall clock goes", "",
             "Timeline points (DNSPROBE_TIMELINE), ms from the command's start, medians of the rounds:", ""]
    for name, r in runs:
        lines.append(f"- {name}: " + ", ".join(f"{p} {t:.0f}" for p, t in r["phases"].items()))
    h = res.get("halves")
    if h:
        two = next((r for n, r in runs if n != "1"), w["2"])
        cpu = " and ".join(f"{c:.2f}" for c in h["cpu_seconds"])
        lines += ["", f"The two workers' shares written as files of their own, read by two one-worker reads at once "
                  f"(pinned): {h['wall_seconds']:.2f} s (CPU {cpu} s, each with its own start-up), against "
                  f"{two['wall_seconds']:.2f} s for two workers: what a worker's "
                  "reading and hashing of the frames it skips, and the parent, cost beyond a split done before."]
    return [*lines, ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_PACKETS:,} packets, 1 round, no compressed inputs")
    ap.add_argument("--mix", choices=traffic.MIXES, default="standard")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--no-compressed", action="store_true", help="skip the compressed inputs")
    ap.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/parallel.*")
    args = ap.parse_args(argv)
    packets = QUICK_PACKETS if args.quick else args.packets
    repeat = 1 if args.quick else args.repeat
    cores = sorted(os.sched_getaffinity(0))
    mach = offline.machine()
    pcap = traffic.generate(args.mix, packets, args.seed)
    print(f"input {pcap}", flush=True)
    contenders = [("1", [pcap], ()), ("2", [pcap], ("--workers", 2))]
    if len(cores) >= 2:
        contenders.append(("2 pinned (--coremask 0x3)", [pcap], ("--coremask", "0x3")))
    if len(cores) >= 3:  # (read refuses more workers than cores)
        contenders.append(("3", [pcap], ("--workers", 3)))
    contenders += [("1, the file 3 times", [pcap] * 3, ()), ("2, the file 3 times", [pcap] * 3, ("--workers", 2))]
    samples = {name: [] for name, _, _ in contenders}
    startup = {"1": [], "2": []}
    ceilings = []
    halves = []
    same = True
    with tempfile.TemporaryDirectory(prefix="dnsprobe-parallel-") as tmp:
        head = Path(tmp) / "head.pcap"
        offline.head_pcap(pcap, head, 100)
        shares = share_files(pcap, 2, tmp) if len(cores) >= 2 else None
        reference = None
        for r in range(repeat):
            for name in startup:
                startup[name].append(measure_read([head], tmp, "s", "--workers", name)[0])
            for name, inputs, extra in contenders:
                m, out = measure_read(inputs, tmp, "w", *extra)
                samples[name].append(m)
                print(f"round {r + 1}: {name:28} wall {m['wall_seconds']:.2f} s, CPU {m['cpu_seconds']:.2f} s, "
                      f"others {m['others_cpu_seconds']:.2f} s", flush=True)
                if r == 0 and len(inputs) == 1:
                    records = sorted_records(out)
                    if reference is None:
                        reference = records
                    else:
                        same = same and records.equals(reference)
                shutil.rmtree(out, ignore_errors=True)
            if len(cores) >= 2:
                ceilings.append(ceiling(pcap, tmp))
                halves.append(at_once(shares, tmp))
                print(f"round {r + 1}: ceiling {ceilings[-1]['speedup_ceiling']:.2f}x, the two shares as files at once "
                      f"{halves[-1]['wall_seconds']:.2f} s", flush=True)
        n_records = reference.num_rows
        reference = None
        inputs = {}
        if not (args.quick or args.no_compressed):
            for kind, path in compressed_copies(pcap).items():
                row = {"decompression_cpu_seconds": decompression_seconds(path)}
                runs = {"1": [], "2": [], "2 each": []}
                for _ in range(repeat):
                    runs["1"].append(measure_read([path], tmp, "c1")[0])
                    runs["2"].append(measure_read([path], tmp, "c2", "--workers", 2)[0])
                    runs["2 each"].append(measure_read([path], tmp, "c2e", "--workers", 2,
                                                       python_code=EACH_DECOMPRESSES)[0])
                for name, s in runs.items():
                    row[name] = summary(s)
                inputs[kind] = row
                print(f"{kind}: " + ", ".join(f"{n} {row[n]['wall_seconds']:.2f} s" for n in runs), flush=True)
    split = splitter(pcap)
    captures = {f"{args.mix} mix": pcap, "bundled sample": ROOT / "samples" / "sample-mix.pcap.xz"}
    data = ROOT / "tests" / "data"  # the tests' oracle captures
    for p in sorted((data / "compactor").glob("*.pcap*")) + sorted((data / "dns-probe").rglob("*.pcap.xz")):
        if not p.name.endswith(".info"):
            captures[p.name] = p
    bal = balance(captures)
    workers = {name: summary(s) for name, s in samples.items()}
    start = {name: median(s, "wall_seconds") for name, s in startup.items()}
    one, two = workers["1"]["wall_seconds"], workers["2"]["wall_seconds"]
    # Quiet rounds: the other sessions on the machine used less than a tenth of a core during both runs.
    calm = [a["wall_seconds"] / b["wall_seconds"] for a, b in zip(samples["1"], samples["2"], strict=True)
            if quiet(a) and quiet(b)]
    ceiling_summary = {k: (round(statistics.median(c[k] for c in ceilings), 3) if not isinstance(ceilings[0][k], list)
                           else ceilings[len(ceilings) // 2][k]) for k in ceilings[0]} if ceilings else None
    res = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "command": "python benchmarks/parallel.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": mach,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "code": offline.code(),
        "input": {"file": str(Path(pcap).relative_to(ROOT)), "packets": packets, "mix": args.mix,
                  "bytes": Path(pcap).stat().st_size},
        "records": n_records,
        "same_output": same,
        "workers": workers,
        "speedup_2": round(one / two, 3),
        "speedup_2_quiet_rounds": [round(q, 3) for q in calm],
        "startup_wall_seconds": start,
        # Amdahl: the start-up (interpreter, imports, the workers' forks) is serial, the rest halves at best.
        "speedup_2_bound": round(one / (start["2"] + (one - start["1"]) / 2), 3),
        "speedup_2_three_files": round(workers["1, the file 3 times"]["wall_seconds"]
                                       / workers["2, the file 3 times"]["wall_seconds"], 3),
        "ceiling": ceiling_summary,
        "halves": {"wall_seconds": median(halves, "wall_seconds"),
                   "cpu_seconds": [round(statistics.median(h["cpu_seconds"][k] for h in halves), 3) for k in range(2)],
                   "startup_wall_seconds": start["1"]} if halves else None,
        "splitter": split,
        "inputs": inputs,
        "balance": bal,
    }
    offline.report("parallel", res, markdown(res), save=not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
