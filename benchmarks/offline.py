"""Offline throughput benchmark: `dnsprobe read` against a naive all-dpkt baseline, in CPU time per core.

    python benchmarks/offline.py                 # 1,000,000 packets of the standard mix
    python benchmarks/offline.py --quick         # 100,000 packets
    python benchmarks/offline.py --packets 500000 --mix large --repeat 5
    python benchmarks/offline.py --profile       # also cProfile one dnsprobe run, print the hotspots
    python benchmarks/offline.py --workers 1,2   # also `read --coremask` with 1 and 2 workers: wall-clock speed-up

The capture comes from benchmarks/traffic.py (generated once, then cached under benchmarks/cache/).
Each contender runs as a child process pinned to one CPU (os.sched_setaffinity) and is charged the
user+system CPU time of that child (os.wait4's rusage, cross-checked with getrusage(RUSAGE_CHILDREN)),
so the figure is packets per CPU-second on one core, whatever else the machine is doing:

  dnsprobe  the real command, `dnsprobe read FILE -o TMPDIR -q --no-progress` (Parquet, zstd), and the
            same with `--format cdns` (C-DNS export; its bytes per transaction are reported raw and as
            gzip, xz and zstd would make them).
  baseline  the naive design, in this file: dpkt.pcap.Reader, then for every frame
            dpkt.ethernet.Ethernet -> IP/IP6 -> UDP/TCP -> dpkt.dns.DNS (exceptions caught, the
            message then kept with its header only, as malformed), one dict per message, queries
            and responses matched through a dict, rows written with pyarrow (Table.from_pylist,
            ParquetWriter, zstd) every 100,000 records.

Results go to benchmarks/results/offline.json and offline.md, with a description of the machine and
of the code measured (git commit, uncommitted changes).
"""

import argparse
import compileall
import datetime
import functools
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import traffic  # noqa: E402  (benchmarks/ is not a package)

TARGET_PPS = 150_000
TARGET_RATIO = 4.0
TARGET_CDNS_BYTES = 40  # raw C-DNS bytes per transaction (RFC 8618 Appendix C: about 1/7 of the pcap)
QUICK_PACKETS = 100_000


# ----------------------------------------------------------------------------------------------
# The baseline: dpkt objects for everything (runs in a child: offline.py --baseline-worker PCAP DIR)
# ----------------------------------------------------------------------------------------------

BASELINE_FLUSH = 100_000
BASELINE_QUERY_TIMEOUT = 5.0


def run_baseline(pcap, out_dir):
    import socket
    import struct

    import dpkt
    import pyarrow as pa
    import pyarrow.parquet as pq

    i32, i64, s, b = pa.int32(), pa.int64(), pa.string(), pa.bool_()
    schema = pa.schema([
        ("id", i32), ("unixtime", i64), ("time", i64), ("qname", s), ("domainname", s), ("len", i32),
        ("ttl", i32), ("ipv", i32), ("prot", i32), ("src", s), ("srcp", i32), ("dst", s), ("dstp", i32),
        ("udp_sum", i32), ("dns_len", i32), ("aa", b), ("tc", b), ("rd", b), ("ra", b), ("z", b), ("ad", b),
        ("cd", b), ("ancount", i32), ("arcount", i32), ("nscount", i32), ("qdcount", i32), ("opcode", i32),
        ("rcode", i32), ("qtype", i32), ("qclass", i32), ("edns_udp", i32), ("edns_version", i32),
        ("edns_do", b), ("edns_nsid", s), ("edns_client_subnet", s), ("edns_other", s), ("labels", i32),
        ("res_len", i32), ("dns_res_len", i32), ("tcp_hs_rtt", pa.float64()), ("query_present", b),
        ("response_present", b), ("response_delay_us", i64), ("malformed", b),
    ])
    dpkt_errors = (dpkt.UnpackError, struct.error, ValueError, KeyError, IndexError, TypeError, UnicodeError)
    writer = pq.ParquetWriter(Path(out_dir) / "baseline.parquet", schema, compression="zstd")
    rows = []
    pending = {}
    counts = dict.fromkeys(("packets", "dns_messages", "dpkt_failures", "non_dns", "records", "matched"), 0)

    def edns_of(dns):
        for rr in dns.ar:
            if rr.type == 41:
                other, ecs, nsid = [], "", ""
                data, pos = rr.rdata, 0
                while pos + 4 <= len(data):
                    code, olen = struct.unpack_from("!HH", data, pos)
                    value = data[pos + 4 : pos + 4 + olen]
                    pos += 4 + olen
                    if code == 8 and len(value) >= 4:
                        fam, src_len = struct.unpack_from("!HB", value)
                        addr = value[4:]
                        if fam == 1:
                            ecs = f"{socket.inet_ntop(socket.AF_INET, addr.ljust(4, bytes(1)))}/{src_len}"
                        else:
                            ecs = f"{socket.inet_ntop(socket.AF_INET6, addr.ljust(16, bytes(1)))}/{src_len}"
                    elif code == 3:
                        nsid = value.decode("utf-8", "backslashreplace")
                    if olen and code not in (3, 5, 6, 7):
                        other.append(str(code))
                return {"edns_udp": rr.cls, "edns_version": (rr.ttl >> 16) & 0xFF, "edns_do": bool(rr.ttl & 0x8000),
                        "ext_rcode": rr.ttl >> 24, "nsid": nsid, "ecs": ecs, "other": ",".join(other)}
        return None

    def row(q, r):
        m = q if q is not None else r
        qname = m["qname"]
        qe = q["edns"] if q is not None else None
        re_ = r["edns"] if r is not None else None
        if q is not None:
            client, cport, server, sport = q["src"], q["sport"], q["dst"], q["dport"]
        else:
            client, cport, server, sport = r["dst"], r["dport"], r["src"], r["sport"]
        us = int(m["ts"] * 1_000_000)
        return {
            "id": m["id"], "unixtime": us // 1_000_000, "time": us, "qname": qname,
            "domainname": ".".join(qname.lower().split(".")[-2:]) if qname else None,
            "len": q and q["len"], "ttl": q and q["ttl"], "ipv": m["ipv"], "prot": m["prot"],
            "src": client, "srcp": cport, "dst": server, "dstp": sport,
            "udp_sum": q and q["udp_sum"], "dns_len": q and q["dns_len"],
            "aa": r and r["aa"], "tc": r and r["tc"], "rd": q and q["rd"], "ra": q and q["ra"],
            "z": q and q["z"], "ad": q and q["ad"], "cd": q and q["cd"],
            "ancount": r and r["ancount"], "arcount": r and r["arcount"], "nscount": r and r["nscount"],
            "qdcount": q and q["qdcount"], "opcode": m["opcode"],
            "rcode": None if r is None else r["rcode"] | ((re_["ext_rcode"] << 4) if re_ else 0),
            "qtype": m["qtype"], "qclass": m["qclass"],
            "edns_udp": None if q is None else (qe["edns_udp"] if qe else 0),
            "edns_version": None if q is None else (qe["edns_version"] if qe else 0),
            "edns_do": None if q is None else bool(qe and qe["edns_do"]),
            "edns_nsid": None if r is None else (re_["nsid"] if re_ else ""),
            "edns_client_subnet": None if q is None else (qe["ecs"] if qe else ""),
            "edns_other": None if q is None else (qe["other"] if qe else ""),
            "labels": m["labels"], "res_len": r and r["len"], "dns_res_len": r and r["dns_len"],
            "tcp_hs_rtt": None, "query_present": q is not None, "response_present": r is not None,
            "response_delay_us": int((r["ts"] - q["ts"]) * 1_000_000) if q is not None and r is not None else None,
            "malformed": m["malformed"],
        }

    def emit(q, r):
        rows.append(row(q, r))
        if len(rows) >= BASELINE_FLUSH:
            flush()

    def flush():
        if rows:
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            counts["records"] += len(rows)
            rows.clear()

    next_sweep = None
    with open(pcap, "rb") as fh:
        for ts, buf in dpkt.pcap.Reader(fh):
            counts["packets"] += 1
            try:
                eth = dpkt.ethernet.Ethernet(buf)
            except dpkt_errors:
                continue
            ip = eth.data
            if isinstance(ip, dpkt.ip.IP):
                ipv, af, ttl = 4, socket.AF_INET, ip.ttl
            elif isinstance(ip, dpkt.ip6.IP6):
                ipv, af, ttl = 6, socket.AF_INET6, ip.hlim
            else:
                counts["non_dns"] += 1
                continue
            l4 = ip.data
            if isinstance(l4, dpkt.udp.UDP):
                prot, payload, csum = 17, l4.data, l4.sum
            elif isinstance(l4, dpkt.tcp.TCP):
                prot, payload, csum = 6, l4.data[2:], 0  # one whole message per segment in this naive design
                if not payload:
                    continue  # handshake, ACKs, FINs
            else:
                counts["non_dns"] += 1
                continue
            if l4.sport != 53 and l4.dport != 53:
                counts["non_dns"] += 1
                continue
            counts["dns_messages"] += 1
            msg = {"ts": ts, "len": len(buf), "ipv": ipv, "prot": prot, "src": socket.inet_ntop(af, ip.src),
                   "sport": l4.sport, "dst": socket.inet_ntop(af, ip.dst), "dport": l4.dport, "ttl": ttl,
                   "udp_sum": csum, "dns_len": len(payload)}
            try:
                dns = dpkt.dns.DNS(payload)
                if dns.qd:
                    q0 = dns.qd[0]
                    qname, qtype, qclass = q0.name, q0.type, q0.cls
                    labels = len(qname.split(".")) if qname else 0
                else:
                    qname = qtype = qclass = labels = None
                msg.update(
                    id=dns.id, qr=bool(dns.qr), opcode=dns.opcode, aa=bool(dns.aa), tc=bool(dns.tc), rd=bool(dns.rd),
                    ra=bool(dns.ra), z=bool(dns.op & 0x40), ad=bool(dns.op & 0x20), cd=bool(dns.op & 0x10),
                    rcode=dns.rcode, qdcount=len(dns.qd), ancount=len(dns.an), nscount=len(dns.ns),
                    arcount=len(dns.ar), qname=qname, qtype=qtype, qclass=qclass, labels=labels, edns=edns_of(dns),
                    malformed=False,
                )
            except dpkt_errors:
                counts["dpkt_failures"] += 1
                if len(payload) < 12:
                    mid = flags = qd = an = ns = ar = 0
                else:
                    mid, flags, qd, an, ns, ar = struct.unpack_from("!HHHHHH", payload)
                msg.update(
                    id=mid, qr=bool(flags & 0x8000), opcode=(flags >> 11) & 0xF, aa=bool(flags & 0x400),
                    tc=bool(flags & 0x200), rd=bool(flags & 0x100), ra=bool(flags & 0x80), z=bool(flags & 0x40),
                    ad=bool(flags & 0x20), cd=bool(flags & 0x10), rcode=flags & 0xF, qdcount=qd, ancount=an,
                    nscount=ns, arcount=ar, qname=None, qtype=None, qclass=None, labels=None, edns=None,
                    malformed=True,
                )
            if msg["qr"]:
                key = (prot, msg["dst"], msg["dport"], msg["src"], msg["sport"], msg["id"])
                q = pending.pop(key, None)
                if q is not None:
                    counts["matched"] += 1
                emit(q, msg)
            else:
                key = (prot, msg["src"], msg["sport"], msg["dst"], msg["dport"], msg["id"])
                old = pending.pop(key, None)
                if old is not None:
                    emit(old, None)
                pending[key] = msg
            if next_sweep is None:
                next_sweep = ts + 1.0
            elif ts >= next_sweep:
                next_sweep = ts + 1.0
                for k in [k for k, q in pending.items() if ts - q["ts"] > BASELINE_QUERY_TIMEOUT]:
                    emit(pending.pop(k), None)
    for q in pending.values():
        emit(q, None)
    flush()
    writer.close()
    return counts


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------


def dnsprobe_command():
    compile_bytecode()
    script = Path(sys.executable).parent / "dnsprobe"
    return [str(script)] if script.exists() else [sys.executable, "-m", "probe"]


@functools.cache
def compile_bytecode(root=None):
    """Write the .pyc files of the dnsprobe measured (the packages imported here, or those under `root`): with
    PYTHONDONTWRITEBYTECODE set, or sources newer than their .pyc files, every run would compile those modules
    again at start, and the figures would count it as dnsprobe's start-up."""
    import export
    import probe

    dirs = [Path(root) / "probe", Path(root) / "export"] if root else [Path(m.__file__).parent for m in (probe, export)]
    for d in dirs:
        compileall.compile_dir(str(d), quiet=1)


def run_measured(cmd, core, cwd=ROOT):
    """Run cmd pinned to `core`; returns (stdout text, measurement dict). Raises on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err,
                                preexec_fn=lambda: os.sched_setaffinity(0, {core}))
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        if proc.returncode:
            detail = err.read().decode(errors="replace")
            raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{detail}")
    cpu = ru.ru_utime + ru.ru_stime
    return stdout, {
        "cpu_seconds": round(cpu, 4),
        "user_seconds": round(ru.ru_utime, 4),
        "sys_seconds": round(ru.ru_stime, 4),
        "cpu_seconds_rusage_children_delta": round(
            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 4),
        "wall_seconds": round(wall, 4),
        "max_rss_mb": round(ru.ru_maxrss / 1024, 1),
    }


def parquet_rows(directory):
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in Path(directory).glob("*.parquet"))


def cdns_sizes(out):
    """Bytes of the C-DNS files written (raw) and of the same bytes compressed as dnsprobe would
    (export.cdns.writer.compressor, the code of export.cdns_compression), compressed here, outside the measured run."""
    from export.cdns.writer import compressor

    raw = b"".join(p.read_bytes() for p in sorted(out.glob("*.cdns")))
    sizes = {"raw": len(raw)}
    for codec in ("gzip", "xz", "zstd"):
        comp = compressor(codec, None)
        sizes[codec] = len(comp.compress(raw)) + len(comp.flush())
    return sizes


def measure_dnsprobe(pcap, core, tmp_root, fmt="parquet", sizes=False):
    out = Path(tempfile.mkdtemp(prefix="dnsprobe-", dir=tmp_root))
    try:
        cmd = [*dnsprobe_command(), "read", str(pcap), "-o", str(out), "-q", "--no-progress", "--format", fmt]
        _, m = run_measured(cmd, core)
        m["records"] = parquet_rows(out)
        stats = sorted(out.glob("*.stats.json"))
        if stats:
            s = json.loads(stats[0].read_text())
            counters = s.get("counters", s)
            m["stats"] = {k: counters.get(k) for k in ("packets", "dns_messages", "matched", "query_only",
                                                        "response_only", "malformed") if k in counters}
            m["records"] = counters.get("records", m["records"])
        m["output_bytes"] = sum(p.stat().st_size for p in out.iterdir() if not p.name.endswith(".stats.json"))
        if sizes and fmt == "cdns":
            m["cdns_bytes"] = cdns_sizes(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return m


def measure_workers(pcap, cores, tmp_root, fmt="parquet"):
    """`dnsprobe read --coremask` with one worker per core of `cores`: wall seconds and the CPU of every process
    (the command and its workers), and the records written (benchmarks/parallel.py measures it)."""
    import parallel  # (it imports this module)

    mask = hex(sum(1 << c for c in cores))
    m, out = parallel.measure_read([pcap], tmp_root, "w", "--format", fmt, "--coremask", mask)
    shutil.rmtree(out, ignore_errors=True)
    return {"workers": len(cores), "cores": list(cores), "wall_seconds": m["wall_seconds"],
            "cpu_seconds": m["cpu_seconds"], "records": m["records"]}


def parallel_table(pcap, packets, worker_counts, tmp_root, repeat):
    """Wall-clock pkts/s of `read` for each worker count (median of `repeat` interleaved runs), with the speed-up
    over one worker; counts beyond the usable cores are "not measured"."""
    usable = sorted(os.sched_getaffinity(0))
    rows = []
    samples = {n: [] for n in worker_counts if n <= len(usable)}
    for _ in range(repeat):
        for n in samples:
            samples[n].append(measure_workers(pcap, usable[:n], tmp_root))
    for n in worker_counts:
        if n not in samples:
            rows.append({"workers": n, "not_measured": f"needs {n} cores (this machine has {len(usable)})"})
            continue
        wall = statistics.median(s["wall_seconds"] for s in samples[n])
        rows.append({"workers": n, "wall_seconds_median": wall, "pkts_per_wall_second": round(packets / wall),
                     "cpu_seconds_median": statistics.median(s["cpu_seconds"] for s in samples[n]),
                     "records": samples[n][-1]["records"], "samples": samples[n]})
    one = next((r for r in rows if r["workers"] == 1 and "wall_seconds_median" in r), None)
    for r in rows:
        if one and "wall_seconds_median" in r:
            r["speedup"] = round(one["wall_seconds_median"] / r["wall_seconds_median"], 3)
    return rows


def measure_baseline(pcap, core, tmp_root):
    out = Path(tempfile.mkdtemp(prefix="baseline-", dir=tmp_root))
    try:
        stdout, m = run_measured([sys.executable, str(Path(__file__).resolve()), "--baseline-worker", str(pcap),
                                  str(out)], core)
        m["counts"] = json.loads(stdout.strip().splitlines()[-1])
        m["records"] = parquet_rows(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return m


def head_pcap(src, dst, frames):
    """The first `frames` records of a classic pcap (to measure start-up cost)."""
    import struct

    with open(src, "rb") as fh, open(dst, "wb") as out:
        out.write(fh.read(24))
        for _ in range(frames):
            hdr = fh.read(16)
            if len(hdr) < 16:
                break
            caplen = struct.unpack("<IIII", hdr)[2]
            out.write(hdr + fh.read(caplen))


def summarise(samples, packets, startup):
    cpus = [s["cpu_seconds"] for s in samples]
    cpu = statistics.median(cpus)
    return {
        "runs": len(samples),
        "cpu_seconds_median": round(cpu, 4),
        "cpu_seconds_min": round(min(cpus), 4),
        "cpu_seconds_max": round(max(cpus), 4),
        "pkts_per_cpu_second": round(packets / cpu),
        "pkts_per_cpu_second_best": round(packets / min(cpus)),
        "startup_cpu_seconds": startup,
        "pkts_per_cpu_second_excluding_startup": round(packets / (cpu - startup)) if cpu > startup else None,
        "wall_seconds_median": round(statistics.median(s["wall_seconds"] for s in samples), 3),
        "max_rss_mb": max(s["max_rss_mb"] for s in samples),
        "records": samples[-1]["records"],
        "samples": samples,
    }


# ----------------------------------------------------------------------------------------------
# Description of the machine and of the code
# ----------------------------------------------------------------------------------------------


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(module):
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - a missing optional module is just reported
        return None


def _git(*args):
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine():
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "memory_gib": mem,
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "dpkt": _version("dpkt"),
        "pyarrow": _version("pyarrow"),
        "scapy": _version("scapy"),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def add_rounds_options(ap, rounds_help="interleaved rounds (median reported)"):
    """--packets (of the standard mix), --quick and --rounds; packets_and_rounds(args) reads them."""
    ap.add_argument("--packets", type=int, default=1_000_000, help="packets of the standard mix (default 1,000,000)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_PACKETS:,} packets, 1 round")
    ap.add_argument("--rounds", type=int, default=3, help=f"{rounds_help} (default 3)")


def packets_and_rounds(args):
    """The packets and rounds of add_rounds_options' flags: --quick's, else --packets and --rounds."""
    return (QUICK_PACKETS, 1) if args.quick else (args.packets, args.rounds)


def add_core_option(ap):
    ap.add_argument("--core", type=int, help="CPU to pin the runs to (default: the last usable one)")


def pinned_core(chosen=None):
    """The CPU a benchmark pins its measured runs to: the one chosen (--core), else the last usable one."""
    return chosen if chosen is not None else max(os.sched_getaffinity(0))


def started_utc():
    """When a benchmark started, as its results say it (to the minute, UTC)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def code():
    dirty = _git("status", "--porcelain", "--", "probe", "export")
    return {
        "dnsprobe_version": _version("probe"),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes_in_probe_or_export": bool(dirty) if dirty is not None else None,
        "dnsprobe_command": " ".join(dnsprobe_command()) + " read FILE -o TMPDIR -q --no-progress",
    }


# ----------------------------------------------------------------------------------------------
# Profiling
# ----------------------------------------------------------------------------------------------


def profile_dnsprobe(pcap, core, tmp_root, top=25):
    import io
    import pstats

    out = Path(tempfile.mkdtemp(prefix="dnsprobe-prof-", dir=tmp_root))
    prof = traffic.CACHE_DIR / "offline.prof"  # git-ignored
    try:
        run_measured([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "probe", "read", str(pcap),
                      "-o", str(out), "-q", "--no-progress"], core)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    st = pstats.Stats(str(prof))
    total = st.total_tt
    rows = []
    for (filename, line, func), (_, ncalls, tottime, cumtime, _) in sorted(
        st.stats.items(), key=lambda kv: kv[1][2], reverse=True
    )[:top]:
        where = filename.replace(str(ROOT) + "/", "")
        if "site-packages/" in where:
            where = where.split("site-packages/", 1)[1]
        rows.append({"function": f"{where}:{line}({func})", "calls": ncalls, "tottime": round(tottime, 3),
                     "cumtime": round(cumtime, 3), "share": round(tottime / total, 4) if total else None})
    text = io.StringIO()
    pstats.Stats(str(prof), stream=text).sort_stats("cumulative").print_stats(top)
    return {"profile_file": str(prof.relative_to(ROOT)), "total_seconds_under_profiler": round(total, 3),
            "top_by_tottime": rows, "cumulative_text": text.getvalue()}


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def markdown(res):
    d, b = res["dnsprobe"], res.get("baseline")
    m, inp = res["machine"], res["input"]
    lines = [
        "# Offline benchmark",
        "",
        f"Run {res['date_utc']} by `{res['command']}`.",
        "",
        f"Input: `{inp['file']}`: {inp['packets']:,} packets of the `{inp['mix']}` mix (seed {inp['seed']}), "
        f"{inp['bytes'] / 1e6:.1f} MB; generated in {inp['generation_seconds']} s.",
        "",
        "CPU time is user+system of the child process, pinned to one CPU; pkts/s = packets / CPU seconds "
        "(median of the runs).",
        "",
        "| | runs | CPU s (median) | pkts/s per core | best run | excl. start-up | wall s | max RSS MB | records |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in (("dnsprobe", d), ("dnsprobe, C-DNS export", res.get("cdns")), ("dpkt baseline", b)):
        if r is None:
            continue
        lines.append(
            f"| {name} | {r['runs']} | {r['cpu_seconds_median']:.2f} | {r['pkts_per_cpu_second']:,} | "
            f"{r['pkts_per_cpu_second_best']:,} | {r['pkts_per_cpu_second_excluding_startup'] or 0:,} "
            f"(start-up {r['startup_cpu_seconds']:.2f} s) | {r['wall_seconds_median']:.2f} | {r['max_rss_mb']} | "
            f"{r['records']:,} |"
        )
    lines.append("")
    sz = res["sizes"]
    if res.get("cdns"):
        lines += [
            "Output bytes per transaction: Parquet (zstd) **{parquet}**; C-DNS raw **{cdns_raw}** "
            "(target ≤ {t}: {met}), gzip {cdns_gzip}, xz {cdns_xz}, zstd {cdns_zstd}.".format(
                t=TARGET_CDNS_BYTES, met="met" if sz["cdns_raw_target_met"] else "NOT met", **sz),
            "",
        ]
    t = res["targets"]
    lines.append(f"- dnsprobe: **{d['pkts_per_cpu_second']:,} pkts/s per core** "
                 f"(target ≥ {TARGET_PPS:,}: {'met' if t['pps_met'] else 'NOT met'})")
    if b is not None:
        lines.append(f"- ratio dnsprobe / baseline: **{res['ratio']:.2f}×** "
                     f"(target ≥ {TARGET_RATIO:g}×: {'met' if t['ratio_met'] else 'NOT met'})")
        bc = b["samples"][-1]["counts"]
        lines.append(f"- baseline: dpkt could not parse {bc['dpkt_failures']:,} of {bc['dns_messages']:,} DNS messages "
                     "(RR types it lacks: HTTPS, RRSIG, DS, NSEC, DNSKEY); they were kept as header-only rows.")
    if res.get("parallel"):
        lines += ["", "## Several workers (`read --coremask`, wall clock)", "", *parallel_lines(res["parallel"])]
    c = res["code"]
    lines += [
        "",
        "## Machine and code",
        "",
        f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['usable_cpus']} usable), "
        f"{m['memory_gib']} GiB; pinned to CPU {res['core']}",
        f"- kernel {m['kernel']}; {m['python']}; dpkt {m['dpkt']}; pyarrow {m['pyarrow']}; scapy {m['scapy']}",
        f"- load average at start {m['load_average_at_start']}, at end {res['load_average_at_end']}",
        f"- dnsprobe {c['dnsprobe_version']} at {c['git_commit']}"
        + (" with uncommitted changes in probe/ or export/" if c["uncommitted_changes_in_probe_or_export"] else ""),
        f"- command: `{c['dnsprobe_command']}`",
    ]
    if res.get("profile"):
        p = res["profile"]
        lines += ["", f"## dnsprobe profile (cProfile, {p['total_seconds_under_profiler']} s under the profiler)", "",
                  "| function | calls | tottime s | share | cumtime s |", "|---|---|---|---|---|"]
        for r in p["top_by_tottime"][:20]:
            lines.append(f"| `{r['function']}` | {r['calls']:,} | {r['tottime']:.3f} | {r['share']:.1%} | "
                         f"{r['cumtime']:.3f} |")
    return "\n".join(lines) + "\n"


def sizes_per_transaction(dres, cres):
    """Output bytes per transaction (record): Parquet as written (zstd), C-DNS raw and compressed."""
    out = {"parquet": round(dres["output_bytes"] / dres["records"], 2)}
    if cres:
        for codec, size in cres["cdns_bytes"].items():
            out[f"cdns_{codec}"] = round(size / cres["records"], 2)
        out["cdns_raw_target"] = TARGET_CDNS_BYTES
        out["cdns_raw_target_met"] = out["cdns_raw"] <= TARGET_CDNS_BYTES
    return out


def print_table(res):
    d, b, c = res["dnsprobe"], res.get("baseline"), res.get("cdns")
    print()
    print(f"{'':16} {'CPU s':>8} {'pkts/s/core':>12} {'best':>10} {'no start-up':>12} {'wall s':>8} {'records':>10}")
    for name, r in (("dnsprobe", d), ("dnsprobe C-DNS", c), ("dpkt baseline", b)):
        if r is None:
            continue
        print(f"{name:16} {r['cpu_seconds_median']:8.2f} {r['pkts_per_cpu_second']:12,} "
              f"{r['pkts_per_cpu_second_best']:10,} {r['pkts_per_cpu_second_excluding_startup'] or 0:12,} "
              f"{r['wall_seconds_median']:8.2f} {r['records']:10,}")
    sz = res["sizes"]
    print("\nbytes per transaction: " + ", ".join(f"{k} {v}" for k, v in sz.items() if not k.startswith("cdns_raw_t")))
    t = res["targets"]
    print(f"\ndnsprobe: {d['pkts_per_cpu_second']:,} pkts/s per core "
          f"(target >= {TARGET_PPS:,}: {'met' if t['pps_met'] else 'NOT met'})")
    if b is not None:
        print(f"ratio dnsprobe/baseline: {res['ratio']:.2f}x (target >= {TARGET_RATIO:g}x: "
              f"{'met' if t['ratio_met'] else 'NOT met'})")
    if res.get("parallel"):
        print()
        for line in parallel_lines(res["parallel"]):
            print(line)


def parallel_lines(rows):
    """The table of `read` with several workers (Markdown)."""
    out = ["| workers | wall s | pkts/s (wall) | speed-up | CPU s (all processes) |", "|---|---|---|---|---|"]
    for r in rows:
        if "not_measured" in r:
            out.append(f"| {r['workers']} | not measured: {r['not_measured']} | | | |")
        else:
            out.append(f"| {r['workers']} | {r['wall_seconds_median']:.3f} | {r['pkts_per_wall_second']:,} | "
                       f"{r.get('speedup', 1):.2f}x | {r['cpu_seconds_median']:.3f} |")
    return out


# ----------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=1_000_000, help="packets in the capture (default 1,000,000)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_PACKETS:,} packets")
    ap.add_argument("--mix", choices=traffic.MIXES, default="standard")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="dnsprobe runs (median reported; default 3)")
    ap.add_argument("--baseline-repeat", type=int, default=1, help="baseline runs (default 1)")
    ap.add_argument("--no-baseline", action="store_true", help="measure dnsprobe only")
    ap.add_argument("--no-cdns", action="store_true", help="do not measure the C-DNS export (--format cdns)")
    ap.add_argument("--profile", action="store_true", help="also run dnsprobe once under cProfile")
    add_core_option(ap)
    ap.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/offline.*")
    ap.add_argument("--workers", help="also measure `read --coremask` with these worker counts, comma-separated (the "
                    "wall-clock speed-up; counts beyond the usable cores are reported as not measured)")
    ap.add_argument("--baseline-worker", nargs=2, metavar=("PCAP", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.baseline_worker:
        print(json.dumps(run_baseline(*args.baseline_worker)))
        return 0

    packets = QUICK_PACKETS if args.quick else args.packets
    core = pinned_core(args.core)
    mach = machine()
    cached = traffic.cache_path(args.mix, packets, args.seed).exists()
    pcap = traffic.generate(args.mix, packets, args.seed)
    meta = traffic.metadata(pcap)
    print(f"input {pcap} ({packets:,} packets, {'cached' if cached else 'just generated'}; "
          f"generation took {meta['generation_seconds']} s)", flush=True)
    busy = mach["load_average_at_start"][0]
    if busy > mach["usable_cpus"] - 1:
        print(f"warning: load average {busy} on {mach['usable_cpus']} CPUs; other work may slow the runs down "
              "(CPU time is charged to the child only, but caches and memory bandwidth are shared)", flush=True)

    with tempfile.TemporaryDirectory(prefix="dnsprobe-bench-") as tmp:
        tiny = Path(tmp) / "head.pcap"
        head_pcap(pcap, tiny, 100)
        startup_d = measure_dnsprobe(tiny, core, tmp)["cpu_seconds"]
        startup_c = None if args.no_cdns else measure_dnsprobe(tiny, core, tmp, "cdns")["cpu_seconds"]
        # Parquet and C-DNS runs alternate: this VM's speed drifts by 10-20 % within minutes, and
        # alternating gives both formats the same share of fast and slow minutes.
        measures = [("dnsprobe", lambda i: measure_dnsprobe(pcap, core, tmp))]
        if not args.no_cdns:
            measures.append(
                ("dnsprobe --format cdns",
                 lambda i: measure_dnsprobe(pcap, core, tmp, "cdns", sizes=i == args.repeat - 1))
            )
        runs = _interleaved_runs(measures, args.repeat, packets)
        dsamples = runs[0]
        dres = summarise(dsamples, packets, startup_d)
        dres["output_bytes"] = dsamples[-1]["output_bytes"]
        cres = None
        if not args.no_cdns:
            csamples = runs[1]
            cres = summarise(csamples, packets, startup_c)
            cres["cdns_bytes"] = csamples[-1]["cdns_bytes"]
        bres = None
        if not args.no_baseline:
            startup_b = measure_baseline(tiny, core, tmp)["cpu_seconds"]
            baseline = ("baseline", lambda i: measure_baseline(pcap, core, tmp))
            bsamples = _interleaved_runs([baseline], args.baseline_repeat, packets)[0]
            bres = summarise(bsamples, packets, startup_b)
        parallel = None
        if args.workers:
            counts = [int(w) for w in args.workers.split(",")]
            parallel = parallel_table(pcap, packets, counts, tmp, args.repeat)
        prof = None
        if args.profile:
            RESULTS.mkdir(parents=True, exist_ok=True)
            prof = profile_dnsprobe(pcap, core, tmp)

    ratio = dres["pkts_per_cpu_second"] / bres["pkts_per_cpu_second"] if bres else None
    res = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "command": "python benchmarks/offline.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "core": core,
        "machine": mach,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "code": code(),
        "input": {"file": str(Path(pcap).relative_to(ROOT)) if Path(pcap).is_relative_to(ROOT) else str(pcap),
                  "mix": args.mix, "seed": args.seed, "packets": packets, "bytes": meta["bytes"],
                  "generation_seconds": meta["generation_seconds"], "contents": meta["counts"]},
        "dnsprobe": dres,
        "cdns": cres,
        "sizes": sizes_per_transaction(dres, cres),
        "baseline": bres,
        "parallel": parallel,
        "ratio": round(ratio, 3) if ratio else None,
        "targets": {"pkts_per_cpu_second": TARGET_PPS, "ratio": TARGET_RATIO,
                    "pps_met": dres["pkts_per_cpu_second"] >= TARGET_PPS,
                    "ratio_met": ratio is not None and ratio >= TARGET_RATIO},
    }
    if prof:
        res["profile"] = {k: v for k, v in prof.items() if k != "cumulative_text"}
        print("\n" + prof["cumulative_text"])
    print_table(res)
    if not args.no_save:
        save_results("offline", res, markdown(res))
    return 0


def _interleaved_runs(measures, repeat, packets):
    """`repeat` rounds, each running every (label, measure) once in turn; a list of samples per measure."""
    samples = [[] for _ in measures]
    for i in range(repeat):
        for (label, measure), mine in zip(measures, samples):
            mine.append(measure(i))
            cpu = mine[-1]["cpu_seconds"]
            print(f"{label} run {i + 1}/{repeat}: {cpu:.2f} s CPU ({packets / cpu:,.0f} pkts/s)", flush=True)
    return samples


def save_results(name, res, markdown_text):
    """benchmarks/results/NAME.json and NAME.md."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown_text)
    print(f"\nwrote {RESULTS / (name + '.json')} and {RESULTS / (name + '.md')}")


def report(name, res, markdown_text, save):
    """Print a benchmark's summary; with save, keep it and its figures (save_results)."""
    print("\n" + markdown_text)
    if save:
        save_results(name, res, markdown_text)


if __name__ == "__main__":
    sys.exit(main())
