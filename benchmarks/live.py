"""Live capture benchmark: the highest offered rate `dnsprobe capture` with 1 worker takes with 0 loss.

    python benchmarks/live.py                      # 500,000-packet trials of the standard mix, rate search
    python benchmarks/live.py --quick              # 200,000-packet trials, coarse search (about 1 minute)
    python benchmarks/live.py --rates 40k,60k,80k  # these rates only, no search
    python benchmarks/live.py --profile            # also py-spy the worker at a saturating rate, list hotspots

Must run as root (it creates a network namespace and a veth pair, and captures on it). The testbed is
its own: namespace dnsprobe-b<pid>, veth dpbc<pid> (host end, captured) <-> dpbp<pid> (inside the
namespace, where the generator sends). Nothing is sent anywhere else; the namespace and the pair are
removed at the end, also after an error or Ctrl-C. tcpreplay is installed with apt-get if missing.

One trial, at one offered rate:
  1. `dnsprobe capture -i dpbc<pid> --coremask 0x2 -o TMPDIR` starts: 1 worker pinned to core 1 (the
     supervisor is pinned to core 1 as well; it only wakes up 4 times a second). Parquet, zstd, the
     default configuration (ring of 32 x 1 MiB blocks, 100 ms block timeout).
  2. The generator, `tcpreplay -K --timer=nano --pps=RATE` pinned to core 0 with `taskset -c 0`, replays
     the cached capture (benchmarks/traffic.py, standard mix) from inside the namespace. The kernel's
     receive path of the veth (BPF filter, copy into the ring) runs in the sender's context, so on core 0
     as well. (The nano timer sleeps between packets: tcpreplay's default spins, keeping core 0 at 100 %
     whatever the rate, and so pushes every other task of the machine onto the worker's core.)
  3. After the replay the benchmark waits until the worker has caught up (its CPU use falls idle), then
     stops the probe with SIGTERM; the worker writes its pending transactions and closes its files.
  4. From the final statistics JSON: kernel_received, kernel_drops, packets (captured), records. The
     worker's CPU time and RSS are sampled from /proc/<worker pid> every 20 ms (and its total CPU time is
     taken from the supervisor's reaped-children time once the worker has exited).

A trial passes when nothing is lost -- tcpreplay sent every packet, kernel_drops == 0 and packets
captured == packets sent -- and the worker kept up: its backlog when the replay ended was under
--catch-up-limit seconds (0.5) of work. The second condition matters because the ring holds about
150,000 frames of this mix, a large part of a trial: without it a worker slower than the offered rate
would still show 0 loss on a short trial, only because the ring absorbed the difference.

Search: offered rates 50k, 100k, 150k, 200k, 300k, 400k pkts/s until one fails (halving below 50k if
50k fails), then bisection between the highest pass and the lowest failure down to --resolution. A
trial in which tcpreplay could not reach 95 % of the offered rate is marked generator-limited (the
search stops climbing there). Then one trial at the fixed rate (--fixed-rate, 100k) reports its drops.

Other work on the machine: before each trial the benchmark waits (up to --quiet-wait s) for the CPUs to be
nearly idle, and it measures, from /proc/stat, how much of the worker's core went to anything but the
worker during the replay. A failed trial in which that was over 15 % is run again (--retries); every
attempt is kept in the results, with that share.

CPU us per packet = the worker's CPU time (user + system) from the start of the replay to its exit
(decoding, matching, Parquet writing and the final flush; not its start-up) / packets captured.

Results go to benchmarks/results/live.json and live.md with a description of the machine and code.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import offline  # noqa: E402  (benchmarks/ is not a package): machine(), code helpers, dnsprobe_command()
import traffic  # noqa: E402
from testbed import Testbed as _Testbed  # noqa: E402

TARGET_PPS = 150_000
DEFAULT_PACKETS = 500_000
QUICK_PACKETS = 200_000
LADDER = (50_000, 100_000, 150_000, 200_000, 300_000, 400_000)
QUICK_LADDER = (50_000, 100_000, 200_000, 400_000)
MIN_RATE = 5_000
FIXED_RATE = 100_000
GENERATOR_CORE = 0
WORKER_CORE = 1
GENERATOR_SHORTFALL = 0.95  # actual/offered below this: the generator, not the probe, set the rate
SAMPLE_S = 0.02
IDLE_WINDOW_S = 0.2
IDLE_CPU_S = 0.02  # CPU seconds in IDLE_WINDOW_S under which the worker counts as idle (ticks are 10 ms)
CLK_TCK = os.sysconf("SC_CLK_TCK")
DISTURBED_SHARE = 0.15  # other work on the worker's core above this share of it: the trial was disturbed
QUIET_BUSY = 0.2  # before a trial, wait until the machine's CPUs are busy less than this (in CPUs) ...
# Set from the command line: tcpreplay's timer, and a directory to run `python -m probe` from (else the installed
# dnsprobe). nano: tcpreplay sleeps between packets instead of spinning (gtod, its default, keeps core 0 at 100 %
# whatever the rate, which pushes every other task of the machine onto the worker's core); as exact at 300k pkts/s.
OPTIONS = {"timer": "nano", "code_dir": None}


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class Testbed(_Testbed):
    """The benchmarks' testbed (benchmarks/testbed.py): one veth pair, dpbc<pid> ↔ dpbp<pid>, the peer in the
    namespace dnsprobe-b<pid>."""

    def __init__(self):
        super().__init__("b", pairs=1)


def ensure_tcpreplay():
    if shutil.which("tcpreplay"):
        return
    print("installing tcpreplay (Debian package)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "tcpreplay"], check=True, env=env, stdout=subprocess.DEVNULL)


def tcpreplay_version():
    try:
        p = subprocess.run(["tcpreplay", "-V"], capture_output=True, text=True)
        out = p.stdout + p.stderr
        m = re.search(r"version: (\S+)", out)
        return m.group(1) if m else None
    except OSError:
        return None


TCPREPLAY_FIELDS = (
    ("actual_packets", r"Actual: (\d+) packets"),
    ("actual_seconds", r"sent in ([\d.]+) seconds"),
    ("actual_pps", r"Mbps, ([\d.]+) pps"),
    ("successful", r"Successful packets:\s+(\d+)"),
    ("failed", r"Failed packets:\s+(\d+)"),
    ("truncated", r"Truncated packets:\s+(\d+)"),
    ("retried_enobufs", r"Retried packets \(ENOBUFS\):\s+(\d+)"),
    ("retried_eagain", r"Retried packets \(EAGAIN\):\s+(\d+)"),
)


def parse_tcpreplay(text):
    out = {}
    for key, rx in TCPREPLAY_FIELDS:
        m = re.search(rx, text)
        out[key] = (float(m.group(1)) if "." in m.group(1) else int(m.group(1))) if m else None
    return out


def tcpreplay_command(bed, pcap, rate, core=None):
    """The generator: tcpreplay inside the namespace, pinned to `core` (default GENERATOR_CORE), at `rate` pkts/s
    (None: --topspeed)."""
    pace = [f"--timer={OPTIONS['timer']}", f"--pps={rate}"] if rate else ["--topspeed"]
    core = GENERATOR_CORE if core is None else core
    return ["ip", "netns", "exec", bed.ns, "taskset", "-c", str(core), "tcpreplay", "-K",
            "--no-flow-stats", *pace, f"--intf1={bed.peer}", str(pcap)]


# ----------------------------------------------------------------------------------------------
# /proc readings


def proc_cpu(pid):
    """(own CPU seconds, reaped children's CPU seconds) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = text.rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK, (int(f[13]) + int(f[14])) / CLK_TCK


def proc_mem(pid):
    """{'rss_mb', 'hwm_mb'} of a process, or None when it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    vals = {}
    for line in text.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            vals[line[2:5].lower()] = round(int(line.split()[1]) / 1024, 1)
    return {"rss_mb": vals["rss"], "hwm_mb": vals["hwm"]} if "rss" in vals else None


def softnet():
    """Per CPU (processed, dropped) from /proc/net/softnet_stat (dropped: backlog queue full)."""
    rows = []
    for line in Path("/proc/net/softnet_stat").read_text().splitlines():
        f = line.split()
        rows.append((int(f[0], 16), int(f[1], 16)))
    return rows


def cpu_times():
    """Per CPU (busy, steal) seconds from /proc/stat; busy = user+nice+system+irq+softirq."""
    rows = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            f = [int(x) for x in line.split()[1:9]]
            rows.append(((f[0] + f[1] + f[2] + f[5] + f[6]) / CLK_TCK, f[7] / CLK_TCK))
    return rows


def wait_quiet(max_wait):
    """Wait (up to max_wait s) until the CPUs were busy less than QUIET_BUSY over a second; returns the last
    figure (in CPUs)."""
    deadline = time.monotonic() + max_wait
    while True:
        a = cpu_times()
        time.sleep(1.0)
        busy = sum(y[0] - x[0] for x, y in zip(a, cpu_times()))
        if busy < QUIET_BUSY or time.monotonic() >= deadline:
            return busy


def net_rx_softirqs():
    for line in Path("/proc/softirqs").read_text().splitlines():
        if line.strip().startswith("NET_RX:"):
            return [int(x) for x in line.split()[1:]]
    return []


class Sampler(threading.Thread):
    """Samples the worker's CPU time (and memory) and the supervisor's every SAMPLE_S until both are gone."""

    def __init__(self, worker_pid, supervisor_pid):
        super().__init__(daemon=True)
        self.worker_pid, self.supervisor_pid = worker_pid, supervisor_pid
        self.samples = []  # (monotonic time, worker CPU s)
        self.worker_mem = None
        self.supervisor_mem = None
        self.supervisor_cpu = None  # (own, reaped children)
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self):
        n = 0
        while not self.done.is_set():
            c = proc_cpu(self.worker_pid)
            s = proc_cpu(self.supervisor_pid)
            now = time.monotonic()
            with self.lock:
                if c is not None:
                    self.samples.append((now, c[0]))
                if s is not None:
                    self.supervisor_cpu = s
            if n % 5 == 0:
                m = proc_mem(self.worker_pid)
                if m is not None:
                    self.worker_mem = m
                m = proc_mem(self.supervisor_pid)
                if m is not None:
                    self.supervisor_mem = m
            if c is None and s is None:
                break
            n += 1
            time.sleep(SAMPLE_S)

    def now(self):
        with self.lock:
            return self.samples[-1] if self.samples else (time.monotonic(), 0.0)

    def wait_idle(self, since, timeout):
        """Wait until the worker used < IDLE_CPU_S in an IDLE_WINDOW_S window starting at or after `since`;
        returns that window's start (or None on timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                pts = [p for p in self.samples if p[0] >= since - SAMPLE_S]
            for i, (t0, c0) in enumerate(pts):
                for t1, c1 in pts[i + 1:]:
                    if t1 - t0 >= IDLE_WINDOW_S:
                        if c1 - c0 < IDLE_CPU_S:
                            return max(t0, since)
                        break
            time.sleep(IDLE_WINDOW_S / 2)
        return None


# ----------------------------------------------------------------------------------------------
# One trial


def start_probe(bed, out_dir, log, cores=(WORKER_CORE,), source=None, extra=(), pids=False):
    """Start `dnsprobe capture` with a worker per core of `cores` (source: the capture arguments, default
    `-i IFACE`); returns (process, pid of worker 0, command) once every worker runs (pids: the list of their
    distinct pids instead of worker 0's)."""
    code_dir = OPTIONS["code_dir"]
    if code_dir:
        offline.compile_bytecode(code_dir)
    base = [sys.executable, "-m", "probe"] if code_dir else offline.dnsprobe_command()
    mask = sum(1 << c for c in cores)
    cmd = [*base, "capture", *(source or ("-i", bed.iface)), "--coremask", hex(mask), "-o", str(out_dir),
           "--no-progress", "-q", *extra, *(a for kv in OPTIONS.get("set", ()) for a in ("--set", kv))]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=code_dir or ROOT,
                            preexec_fn=lambda: os.sched_setaffinity(0, {cores[0]}))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dnsprobe capture exited {proc.returncode} at start:\n{Path(log.name).read_text()}")
        for f in out_dir.glob("*.stats.json"):
            try:
                doc = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            workers = doc.get("workers", {})
            if workers and all(w.get("pid") and w.get("alive") for w in workers.values()):
                alive = sorted({w["pid"] for w in workers.values()})
                return proc, (alive if pids else workers["0"]["pid"]), cmd
        time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError("dnsprobe capture did not write its statistics within 60 s")


def stop_process(proc, timeout=30):
    """Stop a child we started in its own session: SIGTERM, then SIGKILL of its process group."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_trial(bed, pcap, expected, rate, catch_up_limit, profile_to=None):
    """One trial at `rate` offered pkts/s; returns its measurements."""
    tmp = Path(tempfile.mkdtemp(prefix="dnsprobe-live-"))
    probe = replay = spy = None
    log = open(tmp / "probe.log", "w+")  # noqa: SIM115 - closed in finally
    out_dir = tmp / "out"
    out_dir.mkdir()
    try:
        probe, worker_pid, cmd = start_probe(bed, out_dir, log)
        sampler = Sampler(worker_pid, probe.pid)
        sampler.start()
        time.sleep(0.3)  # the worker is in its poll loop; a few idle samples before the replay
        rx0, sn0, nr0, ct0 = bed.rx(), softnet(), net_rx_softirqs(), cpu_times()
        t0, cpu0 = sampler.now()
        replay_cmd = tcpreplay_command(bed, pcap, rate)
        if profile_to is not None:
            duration = int(expected / rate + 3)
            spy = subprocess.Popen(["taskset", "-c", str(GENERATOR_CORE), profile_to["py_spy"], "record", "--pid",
                                    str(worker_pid), "--nonblocking", "--rate", "200", "--format", "raw",
                                    "--duration", str(duration), "--output", str(profile_to["file"])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        replay = subprocess.Popen(replay_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        replay_out, _ = replay.communicate(timeout=expected / rate * 3 + 120)
        t_end, cpu_end = sampler.now()
        ct1 = cpu_times()
        if replay.returncode:
            raise RuntimeError(f"tcpreplay exited {replay.returncode}:\n{replay_out}")
        gen = parse_tcpreplay(replay_out)
        idle_at = sampler.wait_idle(t_end, timeout=max(60.0, 3 * expected / rate))
        _, cpu_idle = sampler.now()
        mem_before_stop = sampler.worker_mem
        rx1, sn1, nr1 = bed.rx(), softnet(), net_rx_softirqs()
        probe.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 180
        while True:  # os.wait4 for the rusage of the probe and its reaped worker
            pid, status, ru = os.wait4(probe.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("dnsprobe capture did not stop within 180 s of SIGTERM")
            time.sleep(0.05)
        probe.returncode = os.waitstatus_to_exitcode(status)
        sampler.done.set()
        sampler.join(5)
        if spy is not None:
            _, err = spy.communicate(timeout=60)
            profile_to["stderr"] = err[-2000:]
        with sampler.lock:
            worker_last = sampler.samples[-1][1] if sampler.samples else 0.0
            sup_own, sup_children = sampler.supervisor_cpu or (0.0, 0.0)
        # The worker's last /proc sample is up to SAMPLE_S before its exit; once the supervisor has reaped it,
        # its total is in the supervisor's children time (exact to the tick).
        worker_total = max(worker_last, sup_children)
        log.seek(0)
        log_text = log.read()
        stats_files = sorted(out_dir.glob("*.stats.json"))
        if probe.returncode or not stats_files:
            raise RuntimeError(f"dnsprobe capture exited {probe.returncode}:\n{log_text}")
        doc = json.loads(stats_files[-1].read_text())
        c = doc["counters"]
        rows = offline.parquet_rows(out_dir)
        parts = [p.name for p in out_dir.glob("*.part")]
    finally:
        for p in (replay, spy):
            stop_process(p, timeout=5)
        stop_process(probe)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)

    sent = gen["successful"] or 0
    captured = c["packets"]
    lost = sent - captured
    catch_up = (idle_at - t_end) if idle_at is not None else None
    replay_s = gen["actual_seconds"] or (t_end - t0)
    actual = gen["actual_pps"] or (sent / replay_s if replay_s else 0)
    zero_loss = (sent == expected and not gen["failed"] and c["kernel_drops"] == 0 and captured == sent)
    kept_up = catch_up is not None and catch_up <= catch_up_limit
    generator_limited = actual < GENERATOR_SHORTFALL * rate
    cpu_run = worker_total - cpu0
    per_cpu_rx = [b - a for a, b in zip(nr0, nr1)]
    wall = t_end - t0
    busy = [round((b[0] - a[0]) / wall, 3) for a, b in zip(ct0, ct1)]
    steal = [round((b[1] - a[1]) / wall, 3) for a, b in zip(ct0, ct1)]
    # What else ran on the worker's core during the replay (other processes, interrupts): its busy share
    # less the worker's own.
    other = round(busy[WORKER_CORE] - (cpu_end - cpu0) / wall, 3) if len(busy) > WORKER_CORE else None
    return {
        "offered_pps": rate,
        "actual_pps": round(actual),
        "generator_limited": generator_limited,
        "replay_seconds": round(replay_s, 3),
        "expected": expected,
        "sent": sent,
        "tcpreplay": gen,
        "veth_rx_packets": rx1["rx_packets"] - rx0["rx_packets"],
        "veth_rx_dropped": rx1["rx_dropped"] - rx0["rx_dropped"],
        "backlog_drops": sum(b[1] - a[1] for a, b in zip(sn0, sn1)),
        "net_rx_softirqs_per_cpu": per_cpu_rx,
        "cpu_busy_share_per_cpu": busy,
        "cpu_steal_share_per_cpu": steal,
        "worker_core_other_busy_share": other,
        "kernel_received": c["kernel_received"],
        "kernel_drops": c["kernel_drops"],
        "kernel_freezes": c["kernel_freezes"],
        "captured": captured,
        "lost": lost,
        "records": c["records"],
        "parquet_rows": rows,
        "part_files_left": parts,
        "worker_restarts": c.get("worker_restarts", 0),
        "probe_errors": doc.get("errors", []),
        "matched": c["matched"],
        "query_only": c["query_only"],
        "response_only": c["response_only"],
        "catch_up_seconds": round(catch_up, 3) if catch_up is not None else None,
        "zero_loss": zero_loss,
        "kept_up": kept_up,
        "passed": zero_loss and kept_up,
        "disturbed": other is not None and other > DISTURBED_SHARE,
        "worker_pid": worker_pid,
        "worker_cpu_seconds": round(cpu_run, 3),
        "worker_cpu_seconds_replay": round(cpu_end - cpu0, 3),
        "worker_cpu_seconds_to_idle": round(cpu_idle - cpu0, 3),
        "worker_utilisation_during_replay": round((cpu_end - cpu0) / replay_s, 3) if replay_s else None,
        "cpu_us_per_packet": round(cpu_run / captured * 1e6, 2) if captured else None,
        "cpu_us_per_packet_to_idle": round((cpu_idle - cpu0) / captured * 1e6, 2) if captured else None,
        "worker_rss_mb": (mem_before_stop or {}).get("rss_mb"),
        "worker_peak_rss_mb": (sampler.worker_mem or {}).get("hwm_mb"),
        "supervisor_cpu_seconds": round(sup_own, 3),
        "supervisor_rss_mb": (sampler.supervisor_mem or {}).get("rss_mb"),
        "probe_cpu_seconds_total": round(ru.ru_utime + ru.ru_stime, 3),
        "probe_exit_status": probe.returncode,
        "probe_command": " ".join(cmd),
        "tcpreplay_command": " ".join(replay_cmd),
    }


def verdict(t):
    if t["passed"]:
        return "pass"
    why = []
    if not t["zero_loss"]:
        why.append(f"lost {t['lost']:,}" + (f" (kernel drops {t['kernel_drops']:,})" if t["kernel_drops"] else ""))
        if t["tcpreplay"].get("failed"):
            why.append(f"tcpreplay failed {t['tcpreplay']['failed']:,}")
    if not t["kept_up"]:
        cu = t["catch_up_seconds"]
        why.append(f"behind {cu:.2f} s" if cu is not None else "never idle")
    return "FAIL: " + ", ".join(why) + (" (disturbed; retried)" if t.get("retried") else "")


def show(t):
    gl = " (generator-limited)" if t["generator_limited"] else ""
    cu = t["catch_up_seconds"]
    print(f"  offered {t['offered_pps']:>7,} actual {t['actual_pps']:>7,}{gl} | sent {t['sent']:,} captured "
          f"{t['captured']:,} kernel drops {t['kernel_drops']:,} | behind {cu if cu is not None else '-'} s, "
          f"util {t['worker_utilisation_during_replay']:.0%} | {t['cpu_us_per_packet']} us/pkt, "
          f"RSS {t['worker_peak_rss_mb']} MB | {verdict(t)}", flush=True)
    if t["records"] != t["parquet_rows"] or t["part_files_left"] or t["worker_restarts"] or t["probe_errors"]:
        print(f"    warning: records {t['records']:,}, Parquet rows {t['parquet_rows']:,}, .part files "
              f"{t['part_files_left']}, worker restarts {t['worker_restarts']}, errors {t['probe_errors']}", flush=True)
    other = t["worker_core_other_busy_share"]
    if other is not None and other > 0.05:
        print(f"    note: other work used {other:.0%} of the worker's core during this trial", flush=True)


# ----------------------------------------------------------------------------------------------
# Search


def reached(t):
    """The rate a trial reached: the offered one, or what a generator-limited trial managed."""
    return min(t["offered_pps"], t["actual_pps"]) if t["generator_limited"] else t["offered_pps"]


def search(trial, ladder, resolution, max_rate):
    """Trials up the ladder until one fails, halving below the ladder if its first rung fails, then bisection.
    Returns (highest passing rate or None, lowest failing rate or None, note)."""
    results = {}

    def run(rate):
        if rate not in results:
            results[rate] = trial(rate)
        return results[rate]

    best = fail = None
    note = None
    for rate in [r for r in ladder if r <= max_rate]:
        t = run(rate)
        if t["passed"]:
            if t["generator_limited"]:  # what was reached, not what was asked for (maybe below the last rung)
                best = max(reached(t), best or 0)
                note = f"the generator reached only {t['actual_pps']:,} of {rate:,} pkts/s offered; search stopped"
                break
            best = rate
        else:
            fail = rate
            break
    if best is None and fail is not None:
        rate = fail // 2
        while rate >= MIN_RATE:
            if run(rate)["passed"]:
                best = rate
                break
            fail = rate
            rate //= 2
    while best is not None and fail is not None and fail - best > resolution:
        mid = (best + fail) // 2
        mid -= mid % 1000 if fail - best > 2000 else 0
        if mid in (best, fail):
            break
        if run(mid)["passed"]:
            best = mid
        else:
            fail = mid
    return best, fail, note, results


# ----------------------------------------------------------------------------------------------
# Profile (py-spy raw output: "frame;frame;... count" lines, the leaf last)


def ensure_py_spy(install):
    found = shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy")
    if Path(found).exists():
        return str(found)
    if not install:
        return None
    print("installing py-spy (pip)", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=False)
    found = shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy")
    return str(found) if Path(found).exists() else None


def _frame_name(frame):
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame.strip())
    if not m:
        return frame.strip()
    func, where = m.groups()
    where = where.replace(str(ROOT) + "/", "")
    if "site-packages/" in where:
        where = where.split("site-packages/", 1)[1]
    return f"{where}:{func}"


def summarise_profile(path, top=20):
    self_counts, incl_counts = Counter(), Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_name(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        self_counts[frames[-1]] += n
        for f in set(frames):
            incl_counts[f] += n
    return {
        "samples": total,
        "top_self": [{"function": f, "share": round(n / total, 4)} for f, n in self_counts.most_common(top)],
        # Without the frames nearly every sample has (the call chain down to the worker's read loop).
        "top_inclusive": [{"function": f, "share": round(n / total, 4)} for f, n in incl_counts.most_common()
                          if n / total < 0.95][:top],
    }


# ----------------------------------------------------------------------------------------------
# Report


def none_passed(res):
    if res["rates_given"]:
        return "none of the rates given passed"
    return f"no rate down to {MIN_RATE:,} pkts/s passed"


def fixed_text(f):
    cu = f["catch_up_seconds"]
    text = (f"{f['kernel_drops']:,} kernel drops, {f['lost']:,} of {f['sent']:,} packets lost "
            f"({f['lost'] / f['sent']:.1%}), {f['cpu_us_per_packet']} µs/pkt")
    if cu is None:
        text += "; the worker never went idle after the replay"
    elif cu > 0.1:
        text += f"; the worker was still busy {cu} s after the replay ended (backlog held in the ring)"
    return text


def markdown(res):
    m, inp, s = res["machine"], res["input"], res["summary"]
    lines = [
        "# Live capture benchmark",
        "",
        f"Run {res['date_utc']} by `{res['command']}`.",
        "",
        f"Testbed: a veth pair, the generator (`tcpreplay -K --timer={res['timer']} --pps=RATE`, tcpreplay "
        f"{m.get('tcpreplay')}) pinned to core {GENERATOR_CORE} inside a network namespace, `dnsprobe capture` "
        f"with 1 worker pinned to core {WORKER_CORE} (coremask {hex(1 << WORKER_CORE)}) on the host end, writing "
        "Parquet (zstd), default configuration. The veth's kernel receive path (BPF filter, copy into the ring) "
        "runs on the generator's core.",
        "",
        f"Each trial replays `{inp['file']}`: {inp['packets']:,} packets of the `{inp['mix']}` mix (seed "
        f"{inp['seed']}), {inp['bytes'] / 1e6:.1f} MB. Pass = 0 loss (sent = captured, kernel_drops = 0) and the "
        f"worker kept up (its backlog at the end of the replay < {res['catch_up_limit_s']} s of work). "
        "CPU µs/pkt = worker CPU time from the start of the replay to its exit (incl. the final flush) / packets "
        "captured. RSS = the worker's peak.",
        "",
        "| offered pkts/s | actual pkts/s | sent | captured | kernel drops | lost | behind s | worker util | "
        "other work on worker core | CPU µs/pkt | peak RSS MB | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = sorted(res["trials"], key=lambda t: t["offered_pps"])
    if res.get("fixed"):
        rows.append(dict(res["fixed"], _fixed=True))
    for t in rows:
        cu = t["catch_up_seconds"]
        lines.append(
            f"| {t['offered_pps']:,}{' (fixed)' if t.get('_fixed') else ''} | {t['actual_pps']:,}"
            f"{' (gen.-limited)' if t['generator_limited'] else ''} | {t['sent']:,} | {t['captured']:,} | "
            f"{t['kernel_drops']:,} | {t['lost']:,} | {cu if cu is not None else '-'} | "
            f"{t['worker_utilisation_during_replay']:.0%} | {t['worker_core_other_busy_share'] or 0:.0%} | "
            f"{t['cpu_us_per_packet']} | {t['worker_peak_rss_mb']} | "
            f"{verdict(t)} |")
    lines.append("")
    if s["best_rate"] is not None:
        b = s["at_best"]
        failed = f"lowest failing rate {s['first_fail']:,}" if s["first_fail"] else "no rate failed"
        lines.append(f"- **highest offered rate with 0 loss: {s['best_rate']:,} pkts/s** (1 worker; {failed}); "
                     f"target ≥ {TARGET_PPS:,}: {'met' if s['target_met'] else 'NOT met'}")
        lines.append(f"- at that rate: worker **{b['cpu_us_per_packet']} µs CPU per packet** "
                     f"(≈ {round(1e6 / b['cpu_us_per_packet']):,} pkts per CPU-second), worker peak RSS "
                     f"**{b['worker_peak_rss_mb']} MB**, supervisor RSS {b['supervisor_rss_mb']} MB")
    else:
        lines.append(f"- {none_passed(res)}")
    if s.get("best_rate_zero_loss_only") and s["best_rate_zero_loss_only"] != s["best_rate"]:
        lines.append(f"- highest offered rate with 0 loss alone: {s['best_rate_zero_loss_only']:,} pkts/s, with "
                     "the worker still behind when the replay ended (the ring held the backlog; a longer trial "
                     "would have lost packets)")
    if s.get("note"):
        lines.append(f"- {s['note']}")
    if res.get("fixed"):
        f = res["fixed"]
        lines.append(f"- fixed rate {f['offered_pps']:,} pkts/s: {fixed_text(f)}")
    lines += [
        "",
        "## Machine and code",
        "",
        f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['usable_cpus']} usable), "
        f"{m['memory_gib']} GiB",
        f"- kernel {m['kernel']}; {m['python']}; dpkt {m['dpkt']}; pyarrow {m['pyarrow']}; tcpreplay {m['tcpreplay']}",
        f"- load average at start {m['load_average_at_start']}, at end {res['load_average_at_end']}",
        (f"- dnsprobe run with `python -m probe` from {res['code']['code_dir']}" if res["code"].get("code_dir") else
         f"- dnsprobe {res['code']['dnsprobe_version']} at {res['code']['git_commit']}"
         + (" with uncommitted changes in probe/ or export/"
            if res["code"]["uncommitted_changes_in_probe_or_export"] else "")),
        f"- probe: `{res['code']['probe_command']}`",
        f"- generator: `{res['code']['tcpreplay_command']}`",
    ]
    p = res.get("profile")
    if p and p.get("top_self"):
        lines += ["", f"## Worker profile (py-spy, {p['samples']:,} samples at {p['offered_pps']:,} pkts/s offered)",
                  "", "| function (self time) | share |", "|---|---|"]
        lines += [f"| `{r['function']}` | {r['share']:.1%} |" for r in p["top_self"]]
        lines += ["", "| function (inclusive) | share |", "|---|---|"]
        lines += [f"| `{r['function']}` | {r['share']:.1%} |" for r in p["top_inclusive"]]
    return "\n".join(lines) + "\n"


def print_table(res):
    print()
    print(f"{'offered':>9} {'actual':>9} {'sent':>9} {'captured':>9} {'k.drops':>8} {'lost':>8} {'behind':>7} "
          f"{'util':>5} {'us/pkt':>7} {'RSS MB':>7}  result")
    rows = sorted(res["trials"], key=lambda t: t["offered_pps"])
    if res.get("fixed"):
        rows.append(dict(res["fixed"], _fixed=True))
    for t in rows:
        cu = t["catch_up_seconds"]
        print(f"{t['offered_pps']:>9,} {t['actual_pps']:>9,} {t['sent']:>9,} {t['captured']:>9,} "
              f"{t['kernel_drops']:>8,} {t['lost']:>8,} {cu if cu is not None else '-':>7} "
              f"{t['worker_utilisation_during_replay']:>5.0%} {t['cpu_us_per_packet']:>7} "
              f"{t['worker_peak_rss_mb']:>7}  "
              f"{'(fixed) ' if t.get('_fixed') else ''}{verdict(t)}"
              f"{' (generator-limited)' if t['generator_limited'] else ''}")
    s = res["summary"]
    print()
    if s["best_rate"] is not None:
        b = s["at_best"]
        print(f"highest offered rate with 0 loss (1 worker): {s['best_rate']:,} pkts/s "
              f"(target >= {TARGET_PPS:,}: {'met' if s['target_met'] else 'NOT met'}); "
              f"at that rate the worker used {b['cpu_us_per_packet']} us CPU per packet, peak RSS "
              f"{b['worker_peak_rss_mb']} MB")
    else:
        print(none_passed(res))
    if s.get("best_rate_zero_loss_only") and s["best_rate_zero_loss_only"] != s["best_rate"]:
        print(f"highest offered rate with 0 loss alone: {s['best_rate_zero_loss_only']:,} pkts/s, with the worker "
              "still behind when the replay ended (the ring held the backlog)")
    if s.get("note"):
        print(s["note"])
    if res.get("fixed"):
        f = res["fixed"]
        print(f"fixed rate {f['offered_pps']:,} pkts/s: {fixed_text(f)}")
    p = res.get("profile")
    if p and p.get("top_self"):
        print(f"\nworker hotspots (py-spy, self time, {p['samples']:,} samples at {p['offered_pps']:,} pkts/s):")
        for r in p["top_self"][:15]:
            print(f"  {r['share']:6.1%}  {r['function']}")


# ----------------------------------------------------------------------------------------------


def parse_rate(text):
    """'50000', '50k', '1.5M' -> pkts/s."""
    text = text.strip().lower().replace("_", "").replace(",", "")
    mult = {"k": 1000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * mult)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, help=f"packets per trial (default {DEFAULT_PACKETS:,}; --quick "
                                                f"{QUICK_PACKETS:,})")
    ap.add_argument("--quick", action="store_true", help="short run (about 1 minute): fewer packets, coarser search")
    ap.add_argument("--mix", choices=traffic.MIXES, default="standard")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rates", help="comma-separated offered rates in pkts/s to try instead of the search "
                                    "(e.g. 40k,60k,80k)")
    ap.add_argument("--max-rate", type=parse_rate, default=LADDER[-1], help="highest rate the search tries")
    ap.add_argument("--resolution", type=parse_rate, help="bisection stops when pass and fail are this close "
                                                          "(default 5k; --quick 25k)")
    ap.add_argument("--fixed-rate", type=parse_rate, default=FIXED_RATE,
                    help=f"also run one trial at this rate and report its drops (default {FIXED_RATE:,}; 0: skip)")
    ap.add_argument("--catch-up-limit", type=float, default=0.5,
                    help="largest backlog (seconds of worker time after the replay) a passing trial may have")
    ap.add_argument("--profile", action="store_true",
                    help="also py-spy the worker during a trial at a saturating rate (installs py-spy with pip)")
    ap.add_argument("--no-profile", action="store_true", help="never profile (by default a full run profiles the "
                                                              "worker when the target is not met and py-spy is there)")
    ap.add_argument("--timer", choices=("nano", "gtod", "select", "ioport"), default="nano",
                    help="tcpreplay's packet timer (default nano: sleeps; gtod spins on core 0)")
    ap.add_argument("--code", metavar="DIR", help="measure `python -m probe` run from DIR (e.g. a `git archive` of "
                                                  "a commit) instead of the installed dnsprobe")
    ap.add_argument("--retries", type=int, help="times a failed trial is run again when other work took over "
                    f"{DISTURBED_SHARE * 100:.0f}%% of the worker's core (default 2; --quick 1)")
    ap.add_argument("--quiet-wait", type=float, help="before a trial, wait up to this many seconds for the machine "
                    f"to be quiet (< {QUIET_BUSY} CPUs busy; default 30; --quick 5)")
    ap.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/live.*")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a configuration key of the capture under test (repeatable), e.g. export.flush_seconds=0")
    args = ap.parse_args(argv)

    if os.geteuid() != 0:
        print("benchmarks/live.py must run as root: it creates a network namespace and a veth pair and opens "
              "packet sockets (try: sudo make bench, or sudo python benchmarks/live.py)", file=sys.stderr)
        return 2
    if not shutil.which("ip"):
        print("benchmarks/live.py needs iproute2's `ip` command", file=sys.stderr)
        return 2
    cpus = os.sched_getaffinity(0)
    if not {GENERATOR_CORE, WORKER_CORE} <= cpus:
        print(f"benchmarks/live.py needs CPUs {GENERATOR_CORE} and {WORKER_CORE} (generator, worker); "
              f"this process may use {sorted(cpus)}", file=sys.stderr)
        return 2

    OPTIONS.update(timer=args.timer, code_dir=str(Path(args.code).resolve()) if args.code else None, set=args.set)
    if args.retries is None:
        args.retries = 1 if args.quick else 2
    if args.quiet_wait is None:
        args.quiet_wait = 5.0 if args.quick else 30.0
    packets = args.packets or (QUICK_PACKETS if args.quick else DEFAULT_PACKETS)
    resolution = args.resolution or (25_000 if args.quick else 5_000)
    ensure_tcpreplay()
    mach = offline.machine()
    mach["tcpreplay"] = tcpreplay_version()
    cached = traffic.cache_path(args.mix, packets, args.seed).exists()
    pcap = traffic.generate(args.mix, packets, args.seed)  # before pinning: it builds on every CPU
    meta = traffic.metadata(pcap)
    print(f"input {pcap} ({packets:,} packets, {'cached' if cached else 'just generated'})", flush=True)
    os.sched_setaffinity(0, {GENERATOR_CORE})  # this script's own sampling stays off the worker's core
    py_spy = None
    if args.profile or not (args.no_profile or args.quick):
        py_spy = ensure_py_spy(install=args.profile)

    trials = []
    handlers = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with Testbed() as bed:
            print(f"testbed: namespace {bed.ns}, veth {bed.iface} (probe, core {WORKER_CORE}) <-> {bed.peer} "
                  f"(tcpreplay, core {GENERATOR_CORE})", flush=True)

            def trial(rate, attempts=1 + args.retries, **kw):
                """A trial at `rate`; a failed one that other work disturbed is run again (all are kept)."""
                for attempt in range(1, attempts + 1):
                    idle = wait_quiet(args.quiet_wait)
                    print(f"trial at {rate:,} pkts/s ({packets / rate:.1f} s of traffic)"
                          + (f", attempt {attempt}" if attempt > 1 else "")
                          + (f"; the machine is not quiet ({idle:.2f} CPUs busy)" if idle > QUIET_BUSY else ""),
                          flush=True)
                    t = run_trial(bed, pcap, packets, rate, args.catch_up_limit, **kw)
                    t.update(attempt=attempt, machine_busy_cpus_before=round(idle, 2))
                    if not t["passed"] and t["disturbed"] and attempt < attempts:
                        t["retried"] = True
                    trials.append(t)
                    show(t)
                    if not t.get("retried"):
                        return t
                return t

            if args.rates:
                rates = [parse_rate(r) for r in args.rates.split(",") if r.strip()]
                for r in rates:
                    trial(r)
                # As the search: the passing rates below the lowest failing one count (on a noisy machine a
                # higher rate may pass after a lower one failed); a passing trial counts for what it reached,
                # its offered rate or less where the generator fell short.
                fails = [t["offered_pps"] for t in trials if not t["passed"]]
                fail, note = (min(fails) if fails else None), None
                below = [t for t in trials if t["passed"] and (fail is None or t["offered_pps"] < fail)]
                passing = [reached(t) for t in below]
                best = max(passing) if passing else None
                limited = [t for t in below if t["generator_limited"]]
                if limited:
                    top = max(limited, key=lambda t: t["offered_pps"])
                    note = (f"the generator reached only {top['actual_pps']:,} of {top['offered_pps']:,} pkts/s "
                            "offered: the rate above is what it reached, not the worker's limit")
            else:
                ladder = QUICK_LADDER if args.quick else LADDER
                best, fail, note, _ = search(trial, ladder, resolution, args.max_rate)
            fixed = None
            if args.fixed_rate:
                print(f"fixed-rate trial at {args.fixed_rate:,} pkts/s", flush=True)
                idle = wait_quiet(args.quiet_wait)
                fixed = run_trial(bed, pcap, packets, args.fixed_rate, args.catch_up_limit)
                fixed.update(attempt=1, machine_busy_cpus_before=round(idle, 2))
                show(fixed)
            profile = None
            target_met = best is not None and best >= TARGET_PPS
            if py_spy and (args.profile or not target_met):
                prate = fail or max(args.fixed_rate or 0, FIXED_RATE)
                pfile = traffic.CACHE_DIR / "live-worker.pyspy.txt"  # git-ignored
                print(f"profiling the worker with py-spy at {prate:,} pkts/s (worker saturated)", flush=True)
                spec = {"py_spy": py_spy, "file": pfile}
                wait_quiet(args.quiet_wait)
                pt = run_trial(bed, pcap, packets, prate, args.catch_up_limit, profile_to=spec)
                if pfile.exists():
                    profile = dict(summarise_profile(pfile), offered_pps=prate, file=str(pfile.relative_to(ROOT)),
                                   worker_utilisation=pt["worker_utilisation_during_replay"])
                else:
                    print(f"py-spy wrote no profile: {spec.get('stderr', '').strip()}", flush=True)
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"\ninterrupted ({str(exc) or 'SIGINT'}); the probe and the generator were stopped and the testbed "
              "removed", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        print(f"\nbenchmarks/live.py: {exc}\n(the probe and the generator were stopped and the testbed removed)",
              file=sys.stderr)
        return 1
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)

    # The trial that reached `best`: its offered rate, or what a generator-limited trial reached (search()).
    by_rate = {t["offered_pps"]: t for t in trials}
    by_rate.update({reached(t): t for t in trials})
    at_best = by_rate.get(best) if best is not None else None
    last = trials[-1]
    code = offline.code()
    code["probe_command"] = last["probe_command"].replace(str(ROOT) + "/", "")
    code["tcpreplay_command"] = re.sub(r"--pps=\d+", "--pps=RATE", last["tcpreplay_command"]).replace(str(pcap), "PCAP")
    code.pop("dnsprobe_command", None)
    if OPTIONS["code_dir"]:
        code.update(code_dir=OPTIONS["code_dir"], git_commit=None, uncommitted_changes_in_probe_or_export=None,
                    dnsprobe_version=None)
    keep = ("cpu_us_per_packet", "cpu_us_per_packet_to_idle", "worker_cpu_seconds", "worker_peak_rss_mb",
            "worker_rss_mb", "supervisor_rss_mb", "actual_pps", "catch_up_seconds", "worker_utilisation_during_replay")
    res = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "command": "python benchmarks/live.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": mach,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "code": code,
        "cores": {"generator": GENERATOR_CORE, "worker": WORKER_CORE, "coremask": hex(1 << WORKER_CORE)},
        "catch_up_limit_s": args.catch_up_limit,
        "rates_given": args.rates,
        "timer": args.timer,
        "input": {"file": str(Path(pcap).relative_to(ROOT)) if Path(pcap).is_relative_to(ROOT) else str(pcap),
                  "mix": args.mix, "seed": args.seed, "packets": packets, "bytes": meta["bytes"],
                  "contents": meta["counts"]},
        "summary": {
            "best_rate": best,
            # Zero loss alone (the ring may have held a backlog the worker had not yet worked off).
            "best_rate_zero_loss_only": max((reached(t) for t in trials if t["zero_loss"]), default=None),
            "first_fail": fail,
            "note": note,
            "target_pps": TARGET_PPS,
            "target_met": target_met,
            "at_best": {k: at_best[k] for k in keep} if at_best else None,
            "fixed_rate": {k: fixed[k] for k in ("offered_pps", "actual_pps", "sent", "captured", "kernel_drops",
                                                  "lost", "cpu_us_per_packet")} if fixed else None,
        },
        "trials": trials,
        "fixed": fixed,
        "profile": profile,
    }
    print_table(res)
    if not args.no_save:
        offline.save_results("live", res, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
