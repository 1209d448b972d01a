"""Benchmark suite: loss-free pkts/s and CPU per packet by worker count, dnsprobe against dnscap, netsniff-ng, tcpdump.

    dnsprobe bench                          # (or make bench) every tool, every worker count the cores allow
    dnsprobe bench --plan --workers 1,2,4,8,16      # the core plan of each count and the model's rates, no run
    dnsprobe bench --smoke                  # seconds: 2,000 packets at 10k pkts/s, no search (the test's run)
    dnsprobe bench --workers 1,2,4 --max-rate 1M --packets 2000000 --tools dnsprobe,netsniff-ng
    dnsprobe bench --generator trafgen --tools tcpdump --rates 50k,100k      # trafgen for every trial
    dnsprobe bench --generators-only --packets 50000 --rates 50k,100k,200k   # what each generator reaches here
    dnsprobe bench --interface eth1 --generator-cmd 'ssh gen trafgen ... --rate {rate}pps'   # real NIC

Must run as root. The testbed is live.py's: a network namespace with one end of a veth pair, the generator(s)
sending from inside it, the capturer(s) on the host end. The core plan of N workers (scaling.core_plan, printed
at the start): one generator per pair of workers, ceil(N/2), each sending its part of the pcap (split by client)
pinned to a core of its own (--generator-core, 0, then the next), the workers pinned to the following cores (or
to --cores). A count whose plan needs more cores than the host has is not run: its cells say "not measured: needs
K cores" (K = N + ceil(N/2)). The results also go into a table in the columns of DNS Probe's (threads, pkts/s,
format) with the scaling model's prediction beside each row (scaling.py; docs/performance.md, "Scaling model").
Everything is removed at the end, also on Ctrl-C, SIGTERM or a failure; every process started is stopped.

Generators (--generator): tcpreplay (`--pps=R --timer=nano`: evenly spaced) or trafgen (netsniff-ng's; the
pcap converted to a trafgen configuration by traffic.py, cached next to it; `--cpus 1 --num <packets>`, moved
onto the generator core; `--rate Rpps`: each second's R packets back to back, then a pause; without --rate its
TX_RING path, as fast as it goes). auto (default): tcpreplay --topspeed is measured on the testbed first;
rates up to 90 % of it (--tcpreplay-max) go to tcpreplay, higher ones to trafgen as fast as it goes (the trial
records the rate reached: when it is below the one asked for, the trial is generator-limited and the search
stops there). Which generator sent a trial is in its `generator` entry, the fixed-rate table and the cells.
--generators-only measures both on the testbed, nothing capturing. trafgen 0.6.8 loads its configuration in
time quadratic in the number of packets (about 20 s for 100,000 here); CPU time counts from the first packet.

Rows (tool x format) and what runs for N workers (cores = the plan's N worker cores):
  dnsprobe parquet / cdns   `dnsprobe capture -i VETH --coremask <N cores>`, AF_PACKET fanout, N workers
  dnsprobe dpdk-parquet     `dnsprobe capture --dpdk --dpdk-args="--no-huge --no-pci -m 128
                            --vdev=net_af_packet0,iface=VETH,qpairs=1,..."` (the default pool: 8,191 mbufs for
                            one worker; when probe.capture._dpdk imports)
  dnscap pcap               `dnscap -i VETH -w FILE -m qun -e nytfsxir -s ir -T -f -S` (queries, updates,
                            notifies; every RCODE and TC; initiations and responses; TCP; fragments). dnscap has
                            no fanout: one process, run for N = 1 only.
  netsniff-ng pcap          `netsniff-ng --in VETH --out FILE --silent -f <port 53 as BPF>`, one instance per
                            core, `-C <group> -K hash -L defrag` when N > 1
  tcpdump pcap (baseline)   `tcpdump -i VETH -w FILE -B 32768 port 53`, one process, N = 1 only

One trial (rate R, N workers): start the capturer(s) and wait until they listen; the generator sends the cached
mix at R pkts/s; wait until the capturers are idle; stop them (dnsprobe SIGTERM, the others SIGINT) and read
- sent: tcpreplay's successful packets; with trafgen and with --interface, the growth of the capture interface's
  rx_packets (trafgen's own count beside it, as `reported`);
- received, kernel drops: the tool's own report (dnsprobe: kernel_received/kernel_drops, DPDK: dpdk_ipackets +
  dpdk_imissed + dpdk_rx_nombuf / dpdk_imissed + dpdk_rx_nombuf; tcpdump: "received by filter"/"dropped by
  kernel"; dnscap -S: recv/drop; netsniff-ng: "packets incoming"/"failed filter (out of space)");
- captured: packets the tool took in (dnsprobe: `packets`; the others: received - dropped);
- written: records of the output (dnsprobe: transactions; the others: frames in the pcaps they wrote);
- drops: every drop counter the tool reports, by name (dnsprobe: every counter with drop/missed/evict/
  nombuf/errors in its name);
- CPU s per worker (user + system, from the start of the replay to the tool's exit, incl. its final flush),
  CPU us/pkt = their sum / captured, peak RSS per worker.
A trial passes when nothing was lost (the generator sent everything, drops 0, captured = sent; for dnscap also
written = what `dnscap -r` keeps of the same file) and the capturers kept up (idle within --catch-up-limit s
of the end of the replay). Search: live.py's (a ladder up to the first failure, then bisection).

Offline section: `dnsprobe read` (Parquet, C-DNS), `dnscap -r` and `tshark -r -Y dns -w` on the cached mixes,
pinned to one worker core: pkts/s per core = packets / CPU seconds of the process.

Results: benchmarks/results/suite.json, suite.md and suite.png (--results DIR to write elsewhere).
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import live  # noqa: E402  (benchmarks/ is not a package): the testbed, sampling, search, tcpreplay
import offline  # noqa: E402
import scaling  # noqa: E402  (the core plan, the scaling model, the table beside DNS Probe's)
import traffic  # noqa: E402

from probe.capture.pcapfile import read_capture  # noqa: E402
from probe.errors import CaptureFileError  # noqa: E402

SMOKE_PACKETS = 2_000
SMOKE_RATE = 10_000
DEFAULT_PACKETS = 300_000
FANOUT_GROUP = 0x4D53
DNSCAP_OPTIONS = ("-m", "qun", "-e", "nytfsxir", "-s", "ir", "-T", "-f")
DROP_WORDS = ("drop", "missed", "evict", "nombuf", "errors", "overflow")
# dnsprobe's counters that say what the frames it took in were: a trial whose received count is not what was sent
# says which kind the difference is (frames of another interface or kernel chatter: non_ip/non_dns; a frame taken
# twice: a response_only or query_only; a worker restarted).
FRAME_KINDS = ("non_ip", "non_dns", "fragments", "tcp_segments", "queries", "responses", "matched", "query_only",
               "response_only", "duplicate_queries", "worker_restarts")
TRAFGEN_FRAMES = 50_000
# The DPDK row's EAL memory (--dpdk-eal): enough for the pool and rings of one or two workers. Without hugepages
# the EAL keeps a descriptor for every 4 KiB page of -m, all resident: -m 512 added 6 MiB to the worker's RSS.
DPDK_EAL = "--no-huge --no-pci -m 128"
DPDK_RING = "blocksz=4096,framesz=2048,framecnt=16384"  # net_af_packet's ring: 32 MiB, as AF_PACKET's (--dpdk-ring)
TCPREPLAY_REACH = 0.9  # auto: tcpreplay sends the rates up to this share of its --topspeed rate


def pcap_frames(paths):
    """Frames in the capture files another tool wrote, read with dnsprobe's own reader. A record cut
    off at the end (as a stopped tool may leave) or an empty file is not an error here."""
    n = 0
    for path in paths:
        try:
            for batch in read_capture(path):
                n += len(batch)
        except CaptureFileError as exc:
            if "truncated" not in exc.problem and "empty file" not in exc.problem:
                raise
    return n


def first_line(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [x.strip() for x in (p.stdout + p.stderr).splitlines() if x.strip()]
    return lines[0] if lines else None


def install(package):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print(f"installing {package} (Debian package)", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", package], env=env, check=False, capture_output=True)


# ----------------------------------------------------------------------------------------------
# The tools


class Tool:
    """A capturer: `start` launches it for some worker cores, `stop` stops it, `collect` reads its figures."""

    name = fmt = binary = package = ""
    max_workers = None  # None: any number (one instance or worker per core)
    stop_signal = signal.SIGINT
    settle_s = 0.0  # after the tool is idle, wait this long before stopping it (libpcap's 1 s block timeout)

    @property
    def label(self):
        return f"{self.name} {self.fmt}"

    def missing(self, may_install):
        if shutil.which(self.binary):
            return None
        if may_install:
            install(self.package)
            if shutil.which(self.binary):
                return None
        return f"{self.binary} not found (Debian package {self.package})"

    def version(self):
        return first_line([self.binary, "--version"])

    def start(self, bed, out, cores, logs):
        """Returns (processes, the pids whose CPU and memory count as the workers', commands)."""
        procs, cmds = [], []
        for i, core in enumerate(cores):
            cmd = self.command(bed, out, i, len(cores))
            log = open(out / f"{self.binary}.{i}.log", "w+")  # noqa: SIM115 - closed by the trial
            logs.append(log)
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=lambda c=core: os.sched_setaffinity(0, {c})))
            cmds.append(" ".join(cmd))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(self.ready(log) for log in logs):
            for p, log in zip(procs, logs):
                if p.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"{self.binary} exited {p.returncode} at start:\n{log.read()[-2000:]}")
            time.sleep(0.05)
        time.sleep(0.5)  # the socket is open and bound a little after the message
        return procs, [p.pid for p in procs], cmds

    def ready(self, log):
        return True


class Dnsprobe(Tool):
    name, binary, package = "dnsprobe", "dnsprobe", "dnsprobe"
    stop_signal = signal.SIGTERM
    eal = DPDK_EAL
    ring = DPDK_RING

    def __init__(self, fmt, dpdk=False):
        self.fmt = f"dpdk-{fmt}" if dpdk else fmt
        self.export_format, self.dpdk = fmt, dpdk

    def missing(self, may_install):
        if self.dpdk:
            try:
                import probe.capture._dpdk  # noqa: F401
            except ImportError as exc:
                return f"the DPDK extension does not import: {exc}"
        return None

    def version(self):
        return offline._version("probe")

    def start(self, bed, out, cores, logs):
        log = open(out / "dnsprobe.log", "w+")  # noqa: SIM115 - closed by the trial
        logs.append(log)
        extra = ["--format", self.export_format]
        source = None
        if self.dpdk:
            source = ["--dpdk", f"--dpdk-args={self.eal} --vdev=net_af_packet0,iface={bed.iface},qpairs=1,{self.ring}"]
        data = out / "data"
        data.mkdir()
        proc, pids, cmd = live.start_probe(bed, data, log, cores=tuple(cores), source=source, extra=extra, pids=True)
        return [proc], pids, [" ".join(cmd)]

    def collect(self, out, texts):
        data = out / "data"
        stats = sorted(data.glob("*.stats.json"))
        if not stats:
            raise RuntimeError(f"dnsprobe wrote no statistics:\n{texts[0][-2000:]}")
        doc = json.loads(stats[-1].read_text())
        c = doc["counters"]
        if self.dpdk:
            # ipackets are the frames read, imissed those the device dropped (as kernel_received has its drops)
            kdrops = c.get("dpdk_imissed", 0) + c.get("dpdk_rx_nombuf", 0)
            received = c.get("dpdk_ipackets", 0) + kdrops
        else:
            received, kdrops = c["kernel_received"], c["kernel_drops"]
        drops = {k: v for k, v in c.items() if any(w in k for w in DROP_WORDS) and isinstance(v, int)}
        return {"received": received, "kernel_drops": kdrops, "captured": c["packets"], "written": c["records"],
                "written_what": "transactions", "drops": drops, "errors": doc.get("errors", []),
                "frame_kinds": {k: c.get(k, 0) for k in FRAME_KINDS},
                "part_files_left": [p.name for p in data.glob("*.part")]}


class Pcapper(Tool):
    """The pcap writers: one (or, with fanout, one per core) process that writes frames to files."""

    fmt = "pcap"
    settle_s = 1.5
    writes_all = True  # writes every frame it takes in: captured = frames written

    def collect(self, out, texts):
        report = self.parse(texts)
        files = sorted(p for p in out.glob("cap*") if p.is_file())
        written = pcap_frames(files)
        report.update(written=written, written_what="frames in its pcap files",
                      captured=written if self.writes_all else report["received"] - report["kernel_drops"])
        report["drops"] = {"kernel_drops": report["kernel_drops"], **report.get("drops", {})}
        return report


class Tcpdump(Pcapper):
    name = binary = package = "tcpdump"
    max_workers = 1

    def command(self, bed, out, i, n):
        return ["tcpdump", "-n", "-i", bed.iface, "-w", str(out / "cap.pcap"), "-B", "32768", "port 53"]

    def ready(self, log):
        log.seek(0)
        return "listening on" in log.read()

    def parse(self, texts):
        t = texts[0]
        return {"received": int(re.search(r"(\d+) packets received by filter", t).group(1)),
                "kernel_drops": int(re.search(r"(\d+) packets dropped by kernel", t).group(1))}


class Dnscap(Pcapper):
    name = binary = package = "dnscap"
    max_workers = 1
    writes_all = False  # it writes the DNS messages it selects (not TCP segments without one): see expected_written

    def version(self):
        return first_line(["dnscap", "-V"])

    def command(self, bed, out, i, n):
        return ["dnscap", "-N", "-S", "-i", bed.iface, "-w", str(out / "cap"), *DNSCAP_OPTIONS,
                "-o", "pcap_buffer_size=33554432"]

    def parse(self, texts):
        m = re.search(r"(\d+) recv (\d+) drop \d+ total ptdrop (\d+)", texts[0])
        if not m:
            raise RuntimeError(f"dnscap printed no statistics:\n{texts[0][-2000:]}")
        recv, drop, ptdrop = map(int, m.groups())
        return {"received": recv, "kernel_drops": drop, "drops": {"pcap_thread_drops": ptdrop}}


class Netsniff(Pcapper):
    name = binary = package = "netsniff-ng"
    filter_file = None

    def version(self):
        return first_line(["netsniff-ng", "-v"])

    def command(self, bed, out, i, n):
        if self.filter_file is None or not Path(self.filter_file).exists():
            # Its own filter-expression compiler passes nothing here; tcpdump -dd's output is bpfc's syntax.
            code = subprocess.run(["tcpdump", "-i", bed.iface, "-dd", "port 53"], capture_output=True, text=True,
                                  check=True).stdout
            self.filter_file = out / "port53.bpf"
            self.filter_file.write_text(code)
        cmd = ["netsniff-ng", "--in", bed.iface, "--out", str(out / f"cap{i}.pcap"), "--silent",
               "-f", str(self.filter_file), "-S", "32MiB"]
        if n > 1:
            cmd += ["-C", str(FANOUT_GROUP), "-K", "hash", "-L", "defrag"]
        return cmd

    def ready(self, log):
        log.seek(0)
        return "Running!" in log.read()

    def parse(self, texts):
        recv = drop = 0
        for t in texts:
            m = re.search(r"(\d+)\s+packets incoming", t)
            f = re.search(r"(\d+)\s+packets failed filter \(out of space\)", t)
            if not (m and f):
                raise RuntimeError(f"netsniff-ng printed no statistics:\n{t[-2000:]}")
            recv, drop = recv + int(m.group(1)), drop + int(f.group(1))
        return {"received": recv, "kernel_drops": drop}


def all_tools():
    return [Dnsprobe("parquet"), Dnsprobe("cdns"), Dnsprobe("parquet", dpdk=True), Dnscap(), Netsniff(), Tcpdump()]


# ----------------------------------------------------------------------------------------------
# One trial


class Sampler(live.Sampler):
    """live.Sampler over any set of processes: samples hold their summed CPU time; per-pid last CPU and memory."""

    def __init__(self, pids):
        super().__init__(None, None)
        self.pids = list(pids)
        self.cpu = {}
        self.mem = {}

    def run(self):
        n = 0
        while not self.done.is_set():
            vals = {p: live.proc_cpu(p) for p in self.pids}
            with self.lock:
                self.cpu.update({p: v[0] for p, v in vals.items() if v is not None})
                self.samples.append((time.monotonic(), sum(self.cpu.values())))
            if n % 5 == 0:
                for p in self.pids:
                    m = live.proc_mem(p)
                    if m is not None:
                        self.mem[p] = m
            if all(v is None for v in vals.values()):
                break
            n += 1
            time.sleep(live.SAMPLE_S)


def wait_rusage(procs, timeout):
    """Reap the processes (already signalled); returns each one's (exit status, CPU s incl. reaped children, peak
    RSS in MB of it or any child it reaped: the final file's writing included, which the samples can miss)."""
    deadline = time.monotonic() + timeout
    out = {}
    while len(out) < len(procs):
        for p in procs:
            if p.pid in out:
                continue
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                out[p.pid] = (p.returncode, ru.ru_utime + ru.ru_stime, round(ru.ru_maxrss / 1024, 1))
        if time.monotonic() > deadline:
            raise RuntimeError(f"capturer(s) did not stop within {timeout} s")
        time.sleep(0.05)
    return [out[p.pid] for p in procs]


# ----------------------------------------------------------------------------------------------
# The generators


def pick_generator(rate, opts):
    """Which generator sends a trial at `rate`: --generator-cmd, else tcpreplay or trafgen (auto: trafgen as fast
    as it goes when the rate is above what tcpreplay reaches, opts.tcpreplay_max)."""
    if opts.generator_cmd:
        return "external"
    if opts.generator == "auto":
        return "trafgen" if opts.tcpreplay_max and rate > opts.tcpreplay_max else "tcpreplay"
    return opts.generator


def run_generator(bed, pcap, rate, expected, opts, started=lambda: None):
    """A trial's traffic: the generator pick_generator() names, at `rate` (auto's trafgen: as fast as it goes),
    from each of the plan's generator cores (opts.generator_cores; one: the generator core)."""
    name = pick_generator(rate, opts)
    pace = None if name == "trafgen" and opts.generator == "auto" else rate
    cores = getattr(opts, "generator_cores", None) or [live.GENERATOR_CORE]
    if len(cores) > 1 and name != "external":
        return send_parallel(bed, name, pcap, pace, expected, cores, started, opts.trafgen_frames)
    return send(bed, name, pcap, pace, expected, opts.generator_cmd, started, opts.trafgen_frames, cores[0])


def send_parallel(bed, name, pcap, rate, packets, cores, started, trafgen_frames=None):
    """One generator per core, each sending its part of the pcap (scaling.split_pcap: by client) at its share of
    `rate`; CPU time counts from the first one's start. Returns (sent, generator dict) as send() does, the
    generators' own dicts in `parts` (their rx counts are the interface's, shared: only the total is kept)."""
    parts = scaling.split_pcap(pcap, len(cores))
    counts = [sum(1 for _ in traffic.pcap_frames(p)) for p in parts]
    once = threading.Lock()
    results = [None] * len(parts)

    def first_start():
        if once.acquire(blocking=False):
            started()

    def one(i):
        try:
            pace = rate and max(1, round(rate * counts[i] / sum(counts)))
            results[i] = send(bed, name, parts[i], pace, counts[i], None, first_start, trafgen_frames, cores[i])
        except Exception as exc:  # noqa: BLE001 - re-raised below, in the trial's thread
            results[i] = exc

    rx0 = bed.rx()["rx_packets"]
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, Exception):
            raise RuntimeError(f"a generator failed: {r}") from r
    arrived = bed.rx()["rx_packets"] - rx0
    gens = [g for _, g in results]
    for g in gens:
        g.pop("veth_rx", None)
    secs = max((g.get("actual_seconds") or 0 for g in gens), default=0)
    sent = sum(s for s, _ in results) if name == "tcpreplay" else arrived
    reported = sum(g.get("reported") or g.get("successful") or 0 for g in gens)
    gen = {"name": name, "mode": gens[0]["mode"] if rate is None else f"{rate:,} pkts/s", "cores": list(cores),
           "parts": gens, "veth_rx": arrived, "successful": sent, "reported": reported,
           "failed": sum(g.get("failed") or 0 for g in gens) if name == "tcpreplay" else max(0, reported - arrived),
           "actual_seconds": secs, "actual_pps": arrived / secs if secs else 0}
    return sent, gen


def send(bed, name, pcap, rate, packets, generator_cmd=None, started=lambda: None, trafgen_frames=None, core=None):
    """Send `packets` packets of the pcap with generator `name` at `rate` pkts/s (None: as fast as it goes),
    pinned to `core` (default: the generator core); `started()` is called when sending begins (after trafgen
    has loaded its configuration). Returns (sent, generator dict). sent: tcpreplay's successful packets; for
    trafgen and --generator-cmd, the growth of the capture interface's rx_packets (trafgen's own count is
    `reported`). `veth_rx` is that growth for all."""
    rx0 = bed.rx()["rx_packets"]
    if name == "external":
        cmd = generator_cmd.format(rate=rate, pcap=pcap, packets=packets)
        started()
        t0 = time.monotonic()
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        secs = time.monotonic() - t0
        if p.returncode:
            raise RuntimeError(f"--generator-cmd exited {p.returncode}:\n{(p.stdout + p.stderr)[-2000:]}")
        time.sleep(0.5)
        gen = {"command": cmd, "mode": f"{rate:,} pkts/s", "exit_status": p.returncode, "actual_seconds": secs}
    elif name == "trafgen":
        gen = run_trafgen(bed, pcap, rate, packets, started, trafgen_frames, core)
    else:
        cmd = live.tcpreplay_command(bed, pcap, rate, core)
        started()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=packets / (rate or 100_000) * 3 + 120)
        if p.returncode:
            raise RuntimeError(f"tcpreplay exited {p.returncode}:\n{p.stdout}{p.stderr}")
        gen = live.parse_tcpreplay(p.stdout)
        gen.update(command=" ".join(cmd), mode=f"{rate:,} pkts/s" if rate else "topspeed")
    arrived = bed.rx()["rx_packets"] - rx0
    gen.update(name=name, veth_rx=arrived)
    if name != "tcpreplay":
        gen["successful"] = arrived
        gen["failed"] = max(0, gen.get("reported", arrived) - arrived)  # sent by trafgen, not delivered by the veth
        secs = gen.get("actual_seconds")
        gen["actual_pps"] = arrived / secs if secs else 0
    return gen["successful"] or 0, gen


def trafgen_command(bed, cfg, rate, packets, core=None):
    """trafgen inside the namespace: one process (--cpus 1) pinned to `core` (the generator core), `packets`
    frames of the configuration in its order; --rate R pps (trafgen's shaper: R frames back to back, then a
    sleep to the end of the second) or, rate None, as fast as it goes (its TX_RING path). --no-sock-mem and
    --notouch-irq: it changes no system-wide socket buffer sizes or IRQ affinities."""
    core = live.GENERATOR_CORE if core is None else core
    cmd = ["ip", "netns", "exec", bed.ns, "taskset", "-c", str(core), "trafgen", "--in", str(cfg),
           "--out", bed.peer, "--cpus", "1", "--num", str(packets), "--no-sock-mem", "--notouch-irq"]
    return cmd + (["--rate", f"{rate}pps"] if rate else [])


def descendants(pid):
    out = []
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for k in map(int, kids):
        out += [k, *descendants(k)]
    return out


def run_trafgen(bed, pcap, rate, packets, started, frames=None, core=None):
    """Send with trafgen (see trafgen_command); the configuration is traffic.py's, cached next to the pcap, of
    its first `frames` frames when fewer than `packets` (repeated to make up `packets`). Returns the generator
    dict: its report (`reported` frames, seconds on its CPU) and how long it took to load the configuration
    (trafgen 0.6.8's parser takes time quadratic in the number of frames)."""
    frames = frames if frames and frames < packets else None
    cfg = traffic.trafgen_config(pcap, frames)
    core = live.GENERATOR_CORE if core is None else core
    cmd = trafgen_command(bed, cfg, rate, packets, core)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dnsprobe-trafgen-") as cwd:  # it makes a temporary file in its cwd
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                             start_new_session=True)
        try:
            lines = []
            for line in p.stdout:
                lines.append(line)
                if "Running!" in line:
                    break
            load_s = time.monotonic() - t0
            # trafgen pins its sender i to CPU i whatever taskset said: move it to the generator core.
            for pid in descendants(p.pid):
                try:
                    os.sched_setaffinity(pid, {core})
                except OSError:
                    pass
            started()
            lines += p.stdout.readlines()
            p.wait(timeout=(packets / rate * 3 if rate else 60) + 120)
        finally:
            live.stop_process(p, timeout=5)
            p.stdout.close()
    out = "".join(lines)
    sent = re.search(r"(\d+) packets outgoing", out)
    cpu = re.findall(r"(\d+) sec, (\d+) usec on CPU\d+", out)
    if p.returncode or not sent:
        raise RuntimeError(f"trafgen exited {p.returncode}:\n{out[-2000:]}")
    return {"command": " ".join(cmd), "mode": f"{rate:,} pkts/s" if rate else "topspeed", "config": cfg.name,
            "config_frames": frames or packets,
            "config_load_seconds": round(load_s, 3), "reported": int(sent.group(1)),
            "actual_seconds": max((int(a) + int(b) / 1e6 for a, b in cpu), default=None)}


def trafgen_version():
    line = first_line(["trafgen", "-v"]) or ""
    m = re.search(r"trafgen (\S+)", line)
    return m.group(1) if m else line or None


def ensure_trafgen(may_install):
    if not shutil.which("trafgen") and may_install:
        install("netsniff-ng")
    return shutil.which("trafgen") is not None


def measure_generators(bed, pcap, packets, names, rates, trafgen_frames=None):
    """Each generator's rate on the testbed with nothing capturing, as fast as it goes (rate None) and at each
    of `rates`: rows of offered and actual pkts/s."""
    rows = []
    for name in names:
        for rate in rates:
            sent, gen = send(bed, name, pcap, rate, packets, trafgen_frames=trafgen_frames)
            rows.append({"generator": name, "mode": gen["mode"], "offered_pps": rate, "packets": packets,
                         "sent": sent, "actual_pps": round(gen.get("actual_pps") or 0), "failed": gen.get("failed"),
                         "config_frames": gen.get("config_frames"),
                         "config_load_seconds": gen.get("config_load_seconds")})
            load = f", configuration loaded in {gen['config_load_seconds']} s" if name == "trafgen" else ""
            print(f"  {name} {gen['mode']}: {rows[-1]['actual_pps']:,} pkts/s, sent {sent:,}{load}", flush=True)
    return rows


def run_trial(bed, tool, pcap, expected, rate, cores, opts, expected_written=None):
    tmp = Path(tempfile.mkdtemp(prefix="dnsprobe-suite-"))
    logs, procs = [], []
    sampler = None
    try:
        procs, pids, cmds = tool.start(bed, tmp, cores, logs)
        # dnsprobe's supervisor is sampled too: its own CPU time is taken off its rusage, which has the workers'.
        sampler = Sampler(pids + ([procs[0].pid] if isinstance(tool, Dnsprobe) else []))
        sampler.start()
        time.sleep(0.3)
        cpu0_by_pid = {}

        def started():  # CPU time counts from here (trafgen loads its configuration first)
            with sampler.lock:
                cpu0_by_pid.update(sampler.cpu)

        sent, gen = run_generator(bed, pcap, rate, expected, opts, started)
        expected_written = (expected_written or {}).get(gen["name"])
        t_end, _ = sampler.now()
        idle_at = sampler.wait_idle(t_end, timeout=max(30.0, 3 * expected / rate))
        mem = dict(sampler.mem)
        time.sleep(tool.settle_s)
        for p in procs:
            p.send_signal(tool.stop_signal)
        reaped = wait_rusage(procs, 180)
        sampler.done.set()
        sampler.join(5)
        texts = []
        for log in logs:
            log.seek(0)
            texts.append(log.read())
        bad = [(p.args[0], s) for p, (s, *_) in zip(procs, reaped) if s != 0]
        if bad:
            raise RuntimeError(f"{tool.label} exited {bad}:\n{texts[0][-2000:]}")
        rep = tool.collect(tmp, texts)
    finally:
        for p in procs:
            live.stop_process(p, timeout=5)
        if sampler is not None:
            sampler.done.set()
        for log in logs:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)

    if isinstance(tool, Dnsprobe):
        # Per worker: its last /proc sample (up to SAMPLE_S before its exit); in all: the supervisor's rusage, which
        # has its reaped workers' time to the tick, less its own time and the workers' time before the replay.
        per_worker = [round(sampler.cpu.get(p, 0.0) - cpu0_by_pid.get(p, 0.0), 3) for p in pids]
        cpu_total = reaped[0][1] - sampler.cpu.get(procs[0].pid, 0.0) - sum(cpu0_by_pid.get(p, 0.0) for p in pids)
    else:
        per_worker = [round(c - cpu0_by_pid.get(p, 0.0), 3) for p, (_, c, _) in zip(pids, reaped)]
        cpu_total = sum(per_worker)
    captured = rep["captured"]
    catch_up = (idle_at - t_end) if idle_at is not None else None
    actual = gen.get("actual_pps") or 0
    total_drops = sum(v for v in rep["drops"].values() if v)
    zero_loss = (sent == expected and not gen.get("failed") and rep["kernel_drops"] == 0 and captured == sent
                 and (expected_written is None or rep["written"] == expected_written))
    kept_up = catch_up is not None and catch_up <= opts.catch_up_limit
    return {
        "tool": tool.name, "format": tool.fmt, "workers": len(cores), "cores": list(cores),
        "offered_pps": rate, "actual_pps": round(actual), "generator_limited": actual < live.GENERATOR_SHORTFALL * rate,
        "expected": expected, "sent": sent, "received": rep["received"], "kernel_drops": rep["kernel_drops"],
        "captured": captured, "lost": sent - captured, "written": rep["written"], "written_what": rep["written_what"],
        "expected_written": expected_written, "drops": rep["drops"], "total_drops": total_drops,
        "errors": rep.get("errors", []), "part_files_left": rep.get("part_files_left", []),
        "frame_kinds": rep.get("frame_kinds"),
        "catch_up_seconds": round(catch_up, 3) if catch_up is not None else None,
        "zero_loss": zero_loss, "kept_up": kept_up, "passed": zero_loss and kept_up,
        "cpu_seconds_per_worker": per_worker, "cpu_seconds": round(cpu_total, 3),
        "cpu_us_per_packet": round(cpu_total / captured * 1e6, 2) if captured else None,
        "peak_rss_mb_per_worker": [(mem.get(p) or {}).get("hwm_mb") for p in pids],
        # The largest process's peak up to its exit: with the last file's writing (Parquet: its journal's
        # conversion), which every rotation does too.
        "peak_rss_mb_to_exit": max(r[2] for r in reaped),
        "commands": cmds, "generator": gen,
    }


def show(t):
    gl = " (generator-limited)" if t["generator_limited"] else ""
    print(f"  {t['tool']} {t['format']} x{t['workers']} offered {t['offered_pps']:,} ({gen_text(t)}) actual "
          f"{t['actual_pps']:,}{gl} | "
          f"sent {t['sent']:,} captured {t['captured']:,} kernel drops {t['kernel_drops']:,} written {t['written']:,}"
          f" | {t['cpu_us_per_packet']} us/pkt, RSS {t['peak_rss_mb_per_worker']} MB, "
          f"to exit {t.get('peak_rss_mb_to_exit')} MB | {verdict(t)}", flush=True)


def reached(t):
    """The rate a passing trial proves: the offered one, or what the generator reached when it fell short."""
    if t is None:
        return None
    return min(t["offered_pps"], t["actual_pps"]) if t["generator_limited"] else t["offered_pps"]


def best_trial(trials):
    return max((t for t in trials.values() if t["passed"]), key=reached, default=None)


def gen_text(t):
    """The generator of a trial: 'tcpreplay', 'trafgen topspeed', 'trafgen 50,000 pkts/s', 'external'."""
    g = t["generator"]
    return g["name"] + (" topspeed" if g.get("mode") == "topspeed" else "")


def verdict(t):
    if t["passed"]:
        return "pass"
    return "FAIL" + ("" if t["zero_loss"] else " (loss)") + ("" if t["kept_up"] else " (behind)")


# ----------------------------------------------------------------------------------------------
# Offline section


def offline_section(mixes, packets, seed, core, tools_ok, tmp_root):
    rows = []
    for mix in mixes:
        pcap = traffic.generate(mix, packets, seed)
        for fmt in ("parquet", "cdns"):
            m = offline.measure_dnsprobe(pcap, core, tmp_root, fmt=fmt)
            rows.append({"mix": mix, "tool": "dnsprobe read", "format": fmt, **m})
        with tempfile.TemporaryDirectory(dir=tmp_root) as d:
            if tools_ok.get("dnscap"):
                _, m = offline.run_measured(["dnscap", "-N", "-r", str(pcap), "-w", f"{d}/cap", *DNSCAP_OPTIONS], core)
                m["written"] = pcap_frames(Path(d).glob("cap*"))
                rows.append({"mix": mix, "tool": "dnscap -r", "format": "pcap", **m})
            if shutil.which("tshark"):
                _, m = offline.run_measured(["tshark", "-n", "-r", str(pcap), "-Y", "dns", "-w", f"{d}/ts.pcap"], core)
                rows.append({"mix": mix, "tool": "tshark -r -Y dns", "format": "pcap", **m})
    for r in rows:
        r["packets"] = packets
        r["pkts_per_cpu_second"] = round(packets / r["cpu_seconds"]) if r["cpu_seconds"] else None
    return rows


def dnscap_keeps(pcap, tmp_root):
    """Frames `dnscap -r` writes of the file with the live options: what a loss-free live dnscap must write."""
    with tempfile.TemporaryDirectory(dir=tmp_root) as d:
        subprocess.run(["dnscap", "-N", "-r", str(pcap), "-w", f"{d}/cap", *DNSCAP_OPTIONS], check=True,
                       capture_output=True)
        return pcap_frames(Path(d).glob("cap*"))


# ----------------------------------------------------------------------------------------------
# Report


def summary_rows(res):
    """{label: {workers: cell}} with the loss-free rate and, from the fixed-rate trial, CPU us/pkt."""
    rows = {}
    for s in res["series"]:
        cell = {"best_rate": s["best_rate"], "first_fail": s["first_fail"], "best_generator": s.get("best_generator"),
                "cpu_us_per_packet": (s["fixed"] or {}).get("cpu_us_per_packet"), "skipped": s.get("skipped")}
        rows.setdefault(s["label"], {})[s["workers"]] = cell
    return rows


def cell_text(c):
    if c is None:
        return "—"
    if c.get("skipped"):
        return "skipped"
    # ≥: no rate tried failed (the ladder, --max-rate or the generator was the limit)
    rate = (f"{'≥' if c['first_fail'] is None else ''}{c['best_rate']:,}") if c["best_rate"] else "none"
    us = f"{c['cpu_us_per_packet']} µs" if c["cpu_us_per_packet"] is not None else "—"
    by = c.get("best_generator")
    return f"{rate} / {us}" + (f" ({by})" if by and c["best_rate"] and not by.startswith("tcpreplay") else "")


def ratios(res):
    rows = summary_rows(res)
    out = []
    ours = rows.get("dnsprobe parquet", {})
    for other in ("dnscap pcap", "netsniff-ng pcap"):
        for n, c in rows.get(other, {}).items():
            mine = ours.get(n)
            if mine and mine["best_rate"] and c["best_rate"]:
                out.append({"workers": n, "against": other.split()[0], "pps_ratio": round(mine["best_rate"] /
                                                                                           c["best_rate"], 2),
                            "cpu_ratio": round(mine["cpu_us_per_packet"] / c["cpu_us_per_packet"], 2)
                            if mine["cpu_us_per_packet"] and c["cpu_us_per_packet"] else None})
    return out


def table_lines(res):
    rows = summary_rows(res)
    ns = res["worker_counts"]
    skipped = res.get("not_measured", {})
    lines = ["| tool × format | " + " | ".join(f"{n} worker{'s' if n > 1 else ''}" for n in ns) + " |",
             "|---|" + "---|" * len(ns)]
    for label, cells in rows.items():
        texts = [f"not measured: {skipped[str(n)].split(' (')[0]}" if str(n) in skipped else cell_text(cells.get(n))
                 for n in ns]
        lines.append(f"| {label} | " + " | ".join(texts) + " |")
    return lines


SMOKE_NOTE = ("smoke run: each figure comes from a few seconds of traffic and is dominated by start-up (processes, "
              "imports, rings); it shows that the harness works, not how fast anything is, so no ratios are given")


def ratio_lines(res):
    if res.get("smoke"):
        return [SMOKE_NOTE]
    return [f"- dnsprobe parquet / {r['against']} ({r['workers']} worker{'s' if r['workers'] > 1 else ''}): "
            f"loss-free rate ×{r['pps_ratio']}, CPU per packet ×{r['cpu_ratio']}" for r in res["ratios"]]


def generators_text(g):
    """One sentence: which generator sent which trials."""
    if g["requested"] == "external":
        return "Traffic: `--generator-cmd` (sent = the interface's rx_packets growth)."
    if g["requested"] != "auto":
        return f"Traffic: {g['requested']} for every trial" + (
            " (`--rate`: each second's packets back to back, then a pause)." if g["requested"] == "trafgen" else ".")
    top = g.get("tcpreplay_topspeed_pps")
    return (f"Traffic: tcpreplay up to {g['tcpreplay_max_pps']:,} pkts/s"
            + (f" ({TCPREPLAY_REACH:.0%} of its --topspeed on this testbed, {top:,} pkts/s)" if top else "")
            + (", trafgen as fast as it goes above (marked `(trafgen topspeed)`)." if g.get("trafgen") else
               "; no trafgen."))


def markdown(res):
    m = res["machine"]
    lines = [
        "# Benchmark suite", "",
        f"Run {res['date_utc']} by `{res['command']}`.", "",
        "Cells: highest offered rate with 0 loss (pkts/s; `none`: no rate tried passed; `≥`: no rate tried "
        f"failed) / CPU µs per packet at the fixed rate {res['fixed_rate']:,} pkts/s (all workers' CPU time / "
        "packets captured). Each trial: "
        f"{res['input']['packets']:,} packets of the `{res['input']['mix']}` mix; rates tried: "
        f"{res['rates_desc']}. `—`: not run for that worker count (single-process tools). "
        f"{generators_text(res['generators'])}", "",
        *table_lines(res), "", *ratio_lines(res), "",
    ]
    if res["skipped"]:
        lines += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in res["skipped"].items()), ""]
    lines += ["## Beside DNS Probe's table", "",
              "dnsprobe's loss-free rates in the columns of DNS Probe's published table (threads, pkts/s, format), "
              "with the scaling model's prediction for each (docs/performance.md, \"Scaling model\": c_w from the "
              "same row's 1-worker CPU per packet, c_g from the generator's measured top speed; `generators`: the "
              "testbed's generators, not dnsprobe, bound the rate) and the spread of the workers' CPU at the fixed "
              "rate (the model's b(N)).", "", *scaling.comparison_lines(res), ""]
    lines += ["## Fixed-rate trials", "",
              "| tool × format | workers | generator | actual pkts/s | sent | received | kernel drops | captured | "
              "written | other drops | CPU s per worker | µs/pkt | peak RSS MB per worker | to exit | result |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in res["series"]:
        f = s["fixed"]
        if not f:
            continue
        other = ", ".join(f"{k} {v:,}" for k, v in f["drops"].items() if v and k != "kernel_drops") or "0"
        lines.append(f"| {s['label']} | {f['workers']} | {gen_text(f)} | {f['actual_pps']:,} | {f['sent']:,} "
                     f"| {f['received']:,} | {f['kernel_drops']:,} "
                     f"| {f['captured']:,} | {f['written']:,} {f['written_what']} | {other} | "
                     f"{f['cpu_seconds_per_worker']} | {f['cpu_us_per_packet']} | {f['peak_rss_mb_per_worker']} | "
                     f"{f.get('peak_rss_mb_to_exit', '')} | {verdict(f)} |")
    if res["offline"]:
        lines += ["", "## Offline (one pinned core)", "", "| mix | tool | format | CPU s | pkts/s per core |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['mix']} | {r['tool']} | {r['format']} | {r['cpu_seconds']} | {r['pkts_per_cpu_second']:,} |"
                  for r in res["offline"]]
    if res.get("offline_workers"):
        lines += ["", "## Offline with several workers (`dnsprobe read --coremask`, the standard mix, wall clock)", "",
                  *offline.parallel_lines(res["offline_workers"])]
    lines += ["", "## Machine", "",
              f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['usable_cpus']} usable), "
              f"{m['memory_gib']} GiB; kernel {m['kernel']}; {m['python']}",
              "- tools: " + "; ".join(f"{k} {v}" for k, v in res["tool_versions"].items()),
              f"- generator core {res['generator_core']}, worker cores {res['worker_cores']}"]
    if res.get("plot"):
        lines += ["", f"![pkts/s and CPU per packet by worker count]({Path(res['plot']).name})"]
    return "\n".join(lines) + "\n"


def plot(res, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no plot: matplotlib missing ({exc}); pip install -e '.[bench]'"
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, cells in summary_rows(res).items():
        ns = sorted(n for n, c in cells.items() if not c.get("skipped"))
        if not ns:
            continue
        a.plot(ns, [cells[n]["best_rate"] or 0 for n in ns], marker="o", label=label)
        b.plot(ns, [cells[n]["cpu_us_per_packet"] or 0 for n in ns], marker="o", label=label)
    a.set(xlabel="workers", ylabel="loss-free pkts/s", title="highest loss-free offered rate")
    b.set(xlabel="workers", ylabel="CPU µs per packet", title=f"CPU per packet at {res['fixed_rate']:,} pkts/s")
    for ax in (a, b):
        ax.set_xticks(res["worker_counts"])
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


# ----------------------------------------------------------------------------------------------


class ExternalBed:
    """--interface: capture on a real interface, fed by an external generator (no namespace, no veth)."""

    def __init__(self, iface):
        self.iface, self.ns, self.peer = iface, None, None

    def __enter__(self):
        if not Path("/sys/class/net", self.iface).exists():
            raise RuntimeError(f"interface {self.iface} does not exist")
        return self

    def __exit__(self, *exc):
        return False

    rx = live.Testbed.rx


def search_rates(trial, args):
    """(highest loss-free rate, lowest failing rate, {rate: trial}) of one row and worker count: the --rates, or
    live.search up the --ladder. auto with trafgen: the search stays within tcpreplay's reach (--tcpreplay-max
    becomes the ladder's top rung); when nothing failed there, one trial with trafgen as fast as it goes (at
    --max-rate, so generator-limited) gives `≥` its rate when it passes, or its rate as the first failure.
    Rates between the two are out of reach of both generators here, so they are not bisected."""
    if args.rates:
        trials = {r: trial(r) for r in map(live.parse_rate, args.rates.split(","))}
        best = reached(best_trial(trials))
        return best, min((r for r, x in trials.items() if not x["passed"] and r > (best or 0)), default=None), trials
    ladder = [live.parse_rate(x) for x in args.ladder.split(",")]
    cap = args.tcpreplay_max
    beyond = bool(cap) and max(ladder) > cap and args.max_rate > cap
    if beyond:
        ladder = sorted({r for r in ladder if r < cap} | {cap})
    best, fail, _, trials = live.search(trial, ladder, args.resolution, cap if beyond else args.max_rate)
    if beyond and fail is None:
        t = trials[args.max_rate] = trial(args.max_rate)
        best, fail = (max(best or 0, reached(t)), None) if t["passed"] else (best, t["actual_pps"])
    return best, fail, trials


def generators_setup(args, versions, skipped):
    """The generators' part of the results; installs trafgen (netsniff-ng) when it may be used. None: cannot run."""
    if args.generator_cmd:
        return {"requested": "external"}
    want = ["tcpreplay", "trafgen"] if args.generators_only or args.generator == "auto" else [args.generator]
    have_trafgen = "trafgen" in want and ensure_trafgen(may_install=not args.no_install)
    if "trafgen" in want and not have_trafgen:
        if args.generator == "trafgen":
            print("dnsprobe bench: --generator trafgen: trafgen not found (Debian package netsniff-ng)",
                  file=sys.stderr)
            return None
        skipped["trafgen"] = "trafgen not found (Debian package netsniff-ng): tcpreplay sends every trial"
    if have_trafgen:
        versions["trafgen"] = trafgen_version()
    return {"requested": args.generator, "trafgen": have_trafgen, "tcpreplay_max_pps": args.tcpreplay_max}


def calibrate(args, bed, pcap, gens):
    """auto: tcpreplay --topspeed of the trial's file on the testbed, nothing capturing, sets --tcpreplay-max."""
    if gens["requested"] != "auto" or not gens["trafgen"]:
        args.tcpreplay_max = None  # pick_generator: tcpreplay (or trafgen, or the external command) for every rate
        return
    if args.tcpreplay_max:
        return
    print("generator: tcpreplay --topspeed on the testbed", flush=True)
    row = measure_generators(bed, pcap, args.packets, ["tcpreplay"], [None])[0]
    args.tcpreplay_max = gens["tcpreplay_max_pps"] = int(TCPREPLAY_REACH * row["actual_pps"]) // 1000 * 1000
    gens["tcpreplay_topspeed_pps"] = row["actual_pps"]
    print(f"generator: tcpreplay up to {args.tcpreplay_max:,} pkts/s, trafgen as fast as it goes above", flush=True)


def generators_report(args, bed, pcap, gens, mach, versions):
    """--generators-only: both generators on the testbed, as fast as they go and at each rate; generators.*"""
    rates = [live.parse_rate(x) for x in (args.rates or args.ladder).split(",")]
    names = ["tcpreplay"] + (["trafgen"] if gens["trafgen"] else [])
    rows = measure_generators(bed, pcap, args.packets, names, [None, *rates], args.trafgen_frames)
    lines = ["# Traffic generators on the testbed", "",
             f"{args.packets:,} packets of the `{args.mix}` mix sent from the namespace over the veth, nothing "
             f"capturing; generator pinned to core {args.generator_core}. actual = frames that reached the host end "
             "/ the generator's own sending time. "
             f"CPU: {mach['cpu_model']}, kernel {mach['kernel']}; "
             + "; ".join(f"{k} {versions.get(k)}" for k in names), "",
             "| generator | mode | offered pkts/s | actual pkts/s | sent | failed | configuration: frames, load s |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['generator']} | {r['mode']} | {r['offered_pps'] or 0:,} | {r['actual_pps']:,} "
              f"| {r['sent']:,} | {r['failed'] or 0} | "
              + (f"{r['config_frames']:,}, {r['config_load_seconds']} s |" if r["config_frames"] else " |")
              for r in rows]
    args.results.mkdir(parents=True, exist_ok=True)
    doc = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "machine": mach, "tool_versions": versions,
           "input": {"mix": args.mix, "seed": args.seed, "packets": args.packets, "file": pcap.name}, "rows": rows}
    (args.results / "generators.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (args.results / "generators.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]) + f"\n\nwrote {args.results / 'generators.json'}, generators.md")
    return 0


def int_list(text):
    """'1,2,4' or '1-8' (or both: '1-3,8') → a list of ints."""
    out = []
    for part in filter(None, (x.strip() for x in text.split(","))):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="dnsprobe bench", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help=f"seconds: {SMOKE_PACKETS:,} packets at {SMOKE_RATE:,} "
                                                         "pkts/s, no search, 1 worker, offline on the same file: "
                                                         "checks the harness; its figures are start-up dominated "
                                                         "(no ratios)")
    ap.add_argument("--workers", type=int_list, help="worker counts (default: every count whose core plan fits); a "
                    "count needing more cores (N workers + ceil(N/2) generators) is reported as not measured")
    ap.add_argument("--plan", action="store_true", help="print the core plan of each worker count (one generator "
                    "per pair of workers) and the scaling model's rates, run nothing")
    ap.add_argument("--cores", type=int_list, help="worker cores (default: the cores after the generators')")
    ap.add_argument("--generator-core", type=int, default=live.GENERATOR_CORE)
    ap.add_argument("--tools", help="comma-separated tool names (dnsprobe,dnscap,netsniff-ng,tcpdump; default all)")
    ap.add_argument("--formats", default="parquet,cdns,dpdk-parquet", help="dnsprobe rows")
    ap.add_argument("--packets", type=int, help=f"packets per trial (default {DEFAULT_PACKETS:,})")
    ap.add_argument("--mix", choices=traffic.MIXES, default="standard")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rates", help="comma-separated rates to try instead of the search (e.g. 20k,50k)")
    ap.add_argument("--ladder", default="25k,50k,100k,200k,400k", help="search ladder (pkts/s)")
    ap.add_argument("--max-rate", type=live.parse_rate, default=1_000_000)
    ap.add_argument("--resolution", type=live.parse_rate, default=25_000, help="bisection stops this close")
    ap.add_argument("--fixed-rate", type=live.parse_rate, default=50_000, help="rate of the drops/CPU trial (0: none)")
    ap.add_argument("--catch-up-limit", type=float, default=0.5)
    ap.add_argument("--offline-mixes", default=",".join(traffic.MIXES), help="mixes of the offline section ('': none)")
    ap.add_argument("--offline-packets", type=int, default=100_000)
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install a missing tool: skip it")
    ap.add_argument("--interface", help="capture on this real interface instead of the veth testbed (needs "
                                        "--generator-cmd)")
    ap.add_argument("--generator-cmd", help="shell command sending the traffic to --interface; {rate}, {pcap} and "
                                            "{packets} are replaced. sent = the interface's rx_packets delta")
    ap.add_argument("--generator", choices=("auto", "tcpreplay", "trafgen"), default="auto",
                    help="auto (default): tcpreplay at the rates it reaches (--tcpreplay-max), trafgen as fast as it "
                         "goes above them; tcpreplay: every trial at its rate (--pps, --timer=nano); trafgen: every "
                         "trial with trafgen --rate (per-second bursts)")
    reach = f"{TCPREPLAY_REACH:.0%}".replace("%", "%%")  # argparse formats help strings with %
    ap.add_argument("--tcpreplay-max", type=live.parse_rate,
                    help=f"auto: highest rate left to tcpreplay (default {reach} of its --topspeed, measured "
                         "on the testbed at the start)")
    ap.add_argument("--trafgen-frames", type=int, default=TRAFGEN_FRAMES,
                    help=f"trafgen's configuration holds the first N frames of the mix (default {TRAFGEN_FRAMES:,}), "
                         "repeated to make up --packets: trafgen 0.6.8 loads a configuration in time quadratic in its "
                         "frames (here about 4 s for 50,000, 20 s for 100,000, minutes for 200,000)")
    ap.add_argument("--generators-only", action="store_true",
                    help="only measure the generators on the testbed, nothing capturing: tcpreplay and trafgen as "
                         "fast as they go and at each of --rates (or --ladder); writes generators.{json,md}")
    ap.add_argument("--results", type=Path, default=HERE / "results", help="directory of suite.{json,md,png}")
    ap.add_argument("--dpdk-eal", default=DPDK_EAL, help=f"EAL memory arguments of the DPDK row (default {DPDK_EAL!r}; "
                                                         "the device and the cores are the suite's)")
    ap.add_argument("--dpdk-ring", default=DPDK_RING, help="the DPDK row's net_af_packet ring geometry (default "
                    f"{DPDK_RING!r}: 2 KiB slots, so any frame up to 2 KiB fits, in the memory of AF_PACKET's ring)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a configuration key of the dnsprobe rows (repeatable), e.g. dpdk.mempool_size=8191")
    args = ap.parse_args(argv)
    if args.smoke:
        args.packets = args.packets or SMOKE_PACKETS
        args.rates = args.rates or str(SMOKE_RATE)
        args.fixed_rate = SMOKE_RATE
        args.workers = args.workers or [1]
        args.offline_packets = SMOKE_PACKETS
        args.offline_mixes = "standard" if args.offline_mixes == ",".join(traffic.MIXES) else args.offline_mixes
        args.catch_up_limit = max(args.catch_up_limit, 1.0)
    args.packets = args.packets or DEFAULT_PACKETS
    if args.interface and not args.generator_cmd:
        ap.error("--interface needs --generator-cmd (the external generator)")
    if args.generators_only and args.interface:
        ap.error("--generators-only measures the veth testbed's generators: not with --interface")
    return args


def plan_runs(args, usable):
    """{N: scaling.core_plan} for each worker count (default: every N whose plan fits the usable cores), printed;
    None (and why, on stderr) when the cores asked for are not usable."""
    if args.generator_core not in usable or not set(args.cores or ()) <= set(usable) or len(usable) < 2:
        print(f"dnsprobe bench: generator core {args.generator_core} and worker cores {args.cores or 'the others'} "
              f"must be among the usable CPUs {usable} (a 1-CPU machine cannot run it)", file=sys.stderr)
        return None
    gens = 0 if args.generator_cmd else None  # an external generator uses no core of this host
    # With one, the generator core still runs the suite itself (its sampling), not a worker.
    pool = [c for c in usable if c != args.generator_core] if gens == 0 else usable

    def plan(n):
        return scaling.core_plan(n, pool, args.generator_core, args.cores, gens)

    counts = args.workers or [n for n in range(1, len(usable) + 1) if not plan(n)["short"]]
    plans = {n: plan(n) for n in counts}
    print("core plan (one generator per pair of workers):", flush=True)
    for p in plans.values():
        model = ", ".join(f"{f} {r:,} pkts/s ({b}-bound)" for f in ("parquet", "cdns")
                          for r, b in [scaling.predict(p["workers"], scaling.WORKER_US[f], gens)])
        print(f"  {scaling.plan_text(p, len(usable))}; model (reference figures): {model}", flush=True)
    return plans


def main(argv=None):
    args = parse_args(argv)
    if os.geteuid() != 0 and not args.plan:
        print("dnsprobe bench must run as root: it creates a network namespace and a veth pair and opens packet "
              "sockets", file=sys.stderr)
        return 2
    usable = sorted(os.sched_getaffinity(0))
    plans = plan_runs(args, usable)
    if plans is None:
        return 2
    worker_counts = list(plans)
    # Worker counts the cores do not allow are reported, not run: "not measured: needs K cores".
    unmeasured = {n: f"needs {p['needs']} cores ({n} worker{'s' if n > 1 else ''} + {p['generators']} "
                     f"generator{'s' if p['generators'] != 1 else ''}; this machine has {len(usable)})"
                  for n, p in plans.items() if p["short"]}
    if args.plan:
        return 0
    cores = sorted({c for p in plans.values() for c in p["worker_cores"]}) or [
        c for c in usable if c != args.generator_core]
    live.GENERATOR_CORE = args.generator_core
    live.OPTIONS["set"] = args.set
    Dnsprobe.eal = args.dpdk_eal
    Dnsprobe.ring = args.dpdk_ring
    wanted = set(args.tools.split(",")) if args.tools else None
    formats = set(args.formats.split(","))
    tools = [t for t in all_tools() if (wanted is None or t.name in wanted)
             and (not isinstance(t, Dnsprobe) or t.fmt in formats)]
    if args.interface:
        tools = [t for t in tools if not (isinstance(t, Dnsprobe) and t.dpdk)]  # would take the NIC off the kernel
    live.ensure_tcpreplay()
    skipped, versions = {}, {"tcpreplay": live.tcpreplay_version(), "tshark": first_line(["tshark", "-v"])}
    ok = []
    for t in tools:
        why = t.missing(may_install=not args.no_install)
        if why:
            skipped[t.label] = why
            print(f"skipping {t.label}: {why}", flush=True)
        else:
            ok.append(t)
            versions[t.name] = t.version()
    if any(isinstance(t, Netsniff) for t in ok) and not shutil.which("tcpdump"):
        skipped["netsniff-ng pcap"] = "tcpdump (which compiles its BPF filter) not found"
        ok = [t for t in ok if not isinstance(t, Netsniff)]
    gens = generators_setup(args, versions, skipped)
    if gens is None:
        return 2
    mach = offline.machine()
    pcap = traffic.generate(args.mix, args.packets, args.seed)
    print(f"input {pcap} ({args.packets:,} packets)", flush=True)
    tmp_root = Path(tempfile.mkdtemp(prefix="dnsprobe-bench-"))
    dnscap_expected = None
    if any(isinstance(t, Dnscap) for t in ok):  # what dnscap must write of what each generator sends
        dnscap_expected = {"tcpreplay": dnscap_keeps(pcap, tmp_root)}
        dnscap_expected["external"] = dnscap_expected["trafgen"] = dnscap_expected["tcpreplay"]
        if gens.get("trafgen") and args.packets > args.trafgen_frames:
            traffic.repeat_pcap(pcap, args.trafgen_frames, args.packets, tmp_root / "trafgen-stream.pcap")
            dnscap_expected["trafgen"] = dnscap_keeps(tmp_root / "trafgen-stream.pcap", tmp_root)
    os.sched_setaffinity(0, {args.generator_core})
    series = []
    handlers = {s: signal.signal(s, live._on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    bed_cls = (lambda: ExternalBed(args.interface)) if args.interface else live.Testbed
    try:
        with bed_cls() as bed:
            print(f"testbed: capture on {bed.iface}" + (f", generator in namespace {bed.ns} on {bed.peer}, core "
                                                        f"{args.generator_core}" if bed.ns else ""), flush=True)
            if args.generators_only:
                return generators_report(args, bed, pcap, gens, mach, versions)
            calibrate(args, bed, pcap, gens)
            for n in worker_counts:
                if n in unmeasured:
                    print(f"{n} workers: not measured: {unmeasured[n]}", flush=True)
                    continue
                plan = plans[n]
                args.generator_cores = plan["generator_cores"] or [args.generator_core]
                os.sched_setaffinity(0, set(args.generator_cores))  # the suite's sampling: off the worker cores
                for t in ok:
                    label = t.label + (" (baseline)" if isinstance(t, Tcpdump) else "")
                    if t.max_workers is not None and n > t.max_workers:
                        continue
                    exp_w = dnscap_expected if isinstance(t, Dnscap) else None

                    def trial(rate, t=t, exp_w=exp_w, wcores=plan["worker_cores"]):
                        r = run_trial(bed, t, pcap, args.packets, rate, wcores, args, exp_w)
                        show(r)
                        return r

                    print(f"{label}, {n} worker(s)", flush=True)
                    best, fail, trials = search_rates(trial, args)
                    fixed = (trials.get(args.fixed_rate) or trial(args.fixed_rate)) if args.fixed_rate else None
                    bt = best_trial(trials)
                    series.append({"label": label, "tool": t.name, "format": t.fmt, "workers": n, "best_rate": best,
                                   "first_fail": fail, "fixed": fixed, "best_generator": bt and gen_text(bt),
                                   "trials": sorted(trials.values(), key=lambda x: x["offered_pps"])})
    except (KeyboardInterrupt, live.Interrupted, RuntimeError, subprocess.SubprocessError, OSError) as exc:
        stopped = isinstance(exc, (KeyboardInterrupt, live.Interrupted))
        what = f"interrupted ({str(exc) or 'SIGINT'})" if stopped else f"dnsprobe bench: {exc}"
        print(f"\n{what}\n(every capturer and the generator were stopped, the testbed removed)", file=sys.stderr)
        return 130 if stopped else 1
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        os.sched_setaffinity(0, usable)

    mixes = [m for m in args.offline_mixes.split(",") if m]
    print("offline section" if mixes else "", flush=True)
    off = offline_section(mixes, args.offline_packets, args.seed, cores[0],
                          {"dnscap": any(isinstance(t, Dnscap) for t in ok)}, tmp_root)
    # `read` with 1..N workers: every usable core, the generator's included (nothing else runs by then).
    off_workers = None
    if "standard" in mixes:
        read_counts = [n for n in (args.workers or range(1, len(usable) + 1)) if n <= len(usable)]
        off_workers = offline.parallel_table(traffic.generate("standard", args.offline_packets, args.seed),
                                             args.offline_packets, read_counts, tmp_root, repeat=1)
    shutil.rmtree(tmp_root, ignore_errors=True)
    res = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "command": "dnsprobe bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": mach, "tool_versions": versions, "code": offline.code(),
        "generator_core": args.generator_core, "worker_cores": cores, "worker_counts": worker_counts,
        "core_plans": {str(n): p for n, p in plans.items()},
        "not_measured": {str(n): why for n, why in unmeasured.items()},
        "interface": args.interface, "generator_cmd": args.generator_cmd, "generators": gens,
        "input": {"mix": args.mix, "seed": args.seed, "packets": args.packets, "file": pcap.name},
        "rates_desc": args.rates or f"ladder {args.ladder} up to {args.max_rate:,}, bisection to {args.resolution:,}",
        "fixed_rate": args.fixed_rate, "catch_up_limit_s": args.catch_up_limit,
        "dnsprobe_settings": args.set, "dpdk_eal": args.dpdk_eal, "dpdk_ring": args.dpdk_ring,
        "dnscap_expected_written": (dnscap_expected or {}).get("tcpreplay"),
        "dnscap_expected_written_trafgen": (dnscap_expected or {}).get("trafgen"), "skipped": skipped,
        "series": series, "offline": off, "offline_workers": off_workers,
    }
    for s in series:
        s["model"] = scaling.row_prediction(res, s)
    res["smoke"] = bool(args.smoke)
    res["ratios"] = [] if args.smoke else ratios(res)
    args.results.mkdir(parents=True, exist_ok=True)
    png = args.results / "suite.png"
    why = plot(res, png)
    res["plot"] = None if why else str(png)
    res["plot_note"] = why
    print("\n" + "\n".join(table_lines(res)))
    print("\n".join(ratio_lines(res)))
    print("\nBeside DNS Probe's table, with the scaling model's prediction (docs/performance.md):")
    print("\n".join(scaling.comparison_lines(res)))
    for r in off:
        print(f"offline {r['mix']}: {r['tool']} {r['format']}: {r['pkts_per_cpu_second']:,} pkts/s per core")
    if off_workers:
        print("\n".join(offline.parallel_lines(off_workers)))
    (args.results / "suite.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    (args.results / "suite.md").write_text(markdown(res))
    print(f"\nwrote {args.results / 'suite.json'}, suite.md" + (", suite.png" if not why else f" ({why})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
