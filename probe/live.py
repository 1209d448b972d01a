"""Live capture: `dnsprobe capture`, a supervisor and one pinned worker process per core.

Supervisor (the process that runs the command):
  - checks everything it can before starting anything (interfaces, coremask, permissions, output
    directory, user), so a usage or configuration error is exit status 2 with one line naming it;
  - starts one worker per core of the coremask and waits until every worker has opened its sockets;
  - receives each worker's statistics snapshot once a second over a pipe (never per record), sums them,
    writes the statistics JSON file at start, every capture.stats_interval seconds and at exit, serves
    them to Prometheus, and shows a status line when stderr is a terminal;
  - rotates the files of all workers together on the wall clock, at multiples of export.rotate_seconds,
    and at once on SIGHUP;
  - on SIGINT/SIGTERM tells every worker to stop, and exits 0 once all have flushed and closed their files;
  - restarts a worker that dies (logged, counted as worker_restarts); the files it had completed are
    untouched, the file it was writing stays NAME.parquet.part, visibly incomplete.

Worker (one process per core, pinned with sched_setaffinity):
  - opens one AfPacketSource (TPACKET_V3 ring, fanout group, BPF filter) per interface, then drops
    privileges if capture.user is set;
  - reads ready ring blocks and feeds them to its own Pipeline, which writes its own files (.w<id>);
  - on "stop": closes the kernel filter, drains what the ring still holds, reads the kernel's final
    counters, then finishes the pipeline (pending queries exported as query-only, files closed).
"""

import dataclasses
import datetime
import multiprocessing
import multiprocessing.connection
import os
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from probe.decode.parsers import effective as effective_parser
from probe.errors import ConfigError, DnsprobeError
from probe.stats import COUNTER_NAMES, COUNTERS, Stats

STATS_PUSH_S = 1.0  # how often a worker sends its counters to the supervisor
POLL_MS = 200  # longest wait of a worker for a ring block or a command
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 120.0  # a worker still running this long after "stop" is killed (logged)
DRAIN_SETTLE_S = 0.02  # a stopping worker reads its rings at least this long after closing its filter
DRAIN_GRACE_S = 5.0  # ... and gives up on a block the kernel has not handed over 2 x block timeout + this later
QUICK_DEATH_S = 10.0  # a worker dying sooner than this after its start is restarted with a growing delay


def _log(message):
    _StatusLine.clear()
    print(f"dnsprobe: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Checks done before anything starts


def parse_coremask(text):
    """'0x3' → [0, 1]; ConfigError naming capture.coremask for a bad mask or a core this machine lacks."""
    raw = str(text).strip()
    try:
        mask = int(raw, 16)
    except ValueError:
        raise ConfigError(f"config key 'capture.coremask': {text!r} is not a hexadecimal mask (e.g. 0x3)") from None
    if mask <= 0:
        raise ConfigError(f"config key 'capture.coremask': {text!r} names no core")
    cores = [i for i in range(mask.bit_length()) if mask >> i & 1]
    available = sorted(os.sched_getaffinity(0))
    missing = [c for c in cores if c not in available]
    if missing:
        raise ConfigError(
            f"config key 'capture.coremask': {text!r} names core(s) {', '.join(map(str, missing))}, which this "
            f"machine does not have (available: {', '.join(map(str, available))})"
        )
    return cores


def check_capture_permission():
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
    except PermissionError:
        raise ConfigError(
            "permission denied opening a packet socket: run as root or give the program CAP_NET_RAW"
        ) from None


def lookup_user(name):
    import pwd

    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"config key 'capture.user': no user {name!r} on this machine") from None


def drop_privileges(name, out_dir):
    pw = lookup_user(name)
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {out_dir} is not writable by user {name!r} (capture.user)")


# ---------------------------------------------------------------------------------------------
# Worker


@dataclasses.dataclass
class WorkerSpec:
    worker_id: int
    core: int
    cfg: object
    out_dir: Path
    interfaces: tuple
    fanout_ids: tuple
    kernel_ip_filter: bool = False  # the filter.* IP lists are in the kernel filter, not applied by the worker


def _set_parent_death_signal():
    """Be told (SIGTERM, a clean stop) if the supervisor disappears without stopping us."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_main(spec, conn, inherited, worker_class=None):
    """Entry point of a worker process (forked by the supervisor); worker_class: _Worker unless given
    (probe.dpdk_live.DpdkWorker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C reaches the supervisor, which stops us
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # rotation is the supervisor's to order
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _set_parent_death_signal()
    for c in inherited:  # other workers' pipe ends, copied by fork
        c.close()
    try:
        os.sched_setaffinity(0, {spec.core})
    except OSError as exc:
        conn.send(("error", 2, f"worker {spec.worker_id}: cannot pin to core {spec.core}: {exc.strerror}"))
        sys.exit(2)
    try:
        worker = (worker_class or _Worker)(spec, conn, stop)
    except DnsprobeError as exc:
        conn.send(("error", exc.exit_status, str(exc)))
        sys.exit(exc.exit_status)
    status = worker.run()
    sys.exit(status)


class _Worker:
    def __init__(self, spec, conn, stop):
        from probe.config import FilterConfig
        from probe.pipeline import Pipeline
        from probe.privacy import IpFilter
        from probe.sources.afpacket import AfPacketSource, RejectedCounter

        self.spec = spec
        self.conn = conn
        self.stop = stop
        cfg = spec.cfg
        self.sources = []
        self.counters = []  # RejectedCounter per interface: worker 0 only, with the IP lists in the kernel
        in_kernel = IpFilter(cfg.filter) if spec.kernel_ip_filter else None
        try:
            for ifname, fanout_id in zip(spec.interfaces, spec.fanout_ids, strict=True):
                self.sources.append(AfPacketSource(ifname, cfg.capture, cfg.decode.dns_ports, fanout_id, in_kernel))
                if in_kernel and spec.worker_id == 0:
                    self.counters.append(RejectedCounter(ifname, cfg.decode.dns_ports, in_kernel))
            # Time rotation is the supervisor's (wall clock, all workers together), not the pipeline's.
            live_cfg = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, rotate_seconds=0))
            if in_kernel:  # nothing that reaches the worker is rejected by the lists: no need to check again
                live_cfg = dataclasses.replace(live_cfg, filter=FilterConfig())
            self.pipeline = Pipeline(live_cfg, spec.out_dir, spec.worker_id, live=True)
            if cfg.capture.user:
                drop_privileges(cfg.capture.user, spec.out_dir)
        except BaseException:
            self._close_sources()
            raise
        self.stats = self.pipeline.stats
        self.batch_size = cfg.run.batch_size
        self.drain_s = 2 * cfg.capture.block_timeout_ms / 1000 + DRAIN_GRACE_S
        self.poller = select.poll()
        self.by_fd = {src.fileno(): src for src in self.sources}
        for src in self.sources:
            self.poller.register(src.fileno(), select.POLLIN | select.POLLERR)
        self.poller.register(conn.fileno(), select.POLLIN)
        conn.send(("ready", os.getpid()))

    def _read_ready(self):
        """Feed every ready block of every ring to the pipeline; True when there was any."""
        got = False
        for src in self.sources:
            if src.ready():
                batch = src.read(self.batch_size)
                if batch.data:
                    self.pipeline.feed(batch, src.ifname)
                got = True
        return got

    def _commands(self):
        try:
            while self.conn.poll():
                cmd = self.conn.recv()
                if cmd == "rotate":
                    self.pipeline.rotate()
                elif cmd == "stop":
                    self.stop.set()
        except (EOFError, OSError):
            self.stop.set()  # the supervisor is gone: stop cleanly

    def _push(self, final=False):
        stats = self.stats
        for name in ("kernel_received", "kernel_drops", "kernel_freezes"):
            setattr(stats, name, 0)
        interfaces = {}
        for src in self.sources:
            if src.sock is not None:
                src.kernel_stats()
            stats.kernel_received += src.received
            stats.kernel_drops += src.drops
            stats.kernel_freezes += src.freezes
            interfaces[src.ifname] = {
                "kernel_received": src.received, "kernel_drops": src.drops, "kernel_freezes": src.freezes,
                "frames": src.frames,
            }
        if self.counters:
            stats.ip_filtered = sum(c.read() for c in self.counters)
        exporter = self.pipeline.exporter
        part = getattr(exporter, "part_path", None) if exporter.is_open() else None
        snapshot = {"counters": stats.as_dict(), "interfaces": interfaces, "part_file": part and str(part)}
        try:
            self.conn.send(("final" if final else "stats", snapshot))
        except (BrokenPipeError, OSError):
            self.stop.set()

    def run(self):
        next_push = time.monotonic() + STATS_PUSH_S
        try:
            while not self.stop.is_set():
                if not self._read_ready():
                    for fd, ev in self.poller.poll(POLL_MS):
                        if ev & select.POLLERR and fd in self.by_fd:
                            self.by_fd[fd].check_error()
                self._commands()
                now = time.monotonic()
                if now >= next_push:
                    self._push()
                    next_push = now + STATS_PUSH_S
            self._drain()
            self.pipeline.finish()
        except DnsprobeError as exc:
            _log(f"worker {self.spec.worker_id}: {exc}")
            self._close_sources()
            return exc.exit_status
        self._push(final=True)
        return 0

    def _drain(self):
        """Stop letting frames in, then read what the rings still hold (a partly filled block is handed
        over by the kernel after block_timeout_ms), then read the kernel's final counters.

        The rings are read once more after every wait, also after the deadline: a worker that got no CPU
        for a while (a loaded machine) finds the last block handed over meanwhile, and reads it before it
        gives up. It stops when no ring holds an unread frame, but not before DRAIN_SETTLE_S after the
        filter closed, so that a frame that passed the old filter just before is in the ring and counted."""
        for src in self.sources + self.counters:
            src.stop_filtering_in()
        closed = time.monotonic()
        while True:
            if self._read_ready():
                continue
            left = sum(src.unread() for src in self.sources)
            waited = time.monotonic() - closed
            if not left and waited >= DRAIN_SETTLE_S:
                break
            if left and waited >= self.drain_s:
                _log(f"worker {self.spec.worker_id}: {left} frame(s) left in a capture ring the kernel did not "
                     f"hand over within {self.drain_s:.1f} s of the stop (counted in kernel_received, not read)")
                break
            time.sleep(0.01)
        self._push()  # final kernel counters, read before the sockets close
        self._close_sources()

    def _close_sources(self):
        for src in self.sources + self.counters:
            src.close()


# ---------------------------------------------------------------------------------------------
# Supervisor


class _Slot:
    """One worker position (worker id, core); its process changes when it is restarted."""

    def __init__(self, worker_id, core):
        self.worker_id = worker_id
        self.core = core
        self.proc = None
        self.conn = None
        self.pid = None
        self.started = 0.0
        self.ready = False
        self.finished = False  # sent its final snapshot after a stop
        self.snapshot = None  # latest snapshot of the current process
        self.retired = Stats()  # counters of earlier processes of this slot
        self.restarts = 0
        self.quick_deaths = 0
        self.restart_at = None
        self.error = None

    def counters(self):
        total = Stats()
        total.add(self.retired)
        if self.snapshot:
            for name, value in self.snapshot["counters"].items():
                if name in COUNTER_NAMES:
                    setattr(total, name, getattr(total, name) + value)
        total.worker_restarts = self.restarts
        return total


class _StatusLine:
    active = False

    @classmethod
    def show(cls, text):
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()
        cls.active = True

    @classmethod
    def clear(cls):
        if cls.active:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            cls.active = False


class Supervisor:
    worker_class = None  # the class a worker process runs (None: _Worker, AF_PACKET)

    def __init__(self, cfg, out_dir, interfaces, cores, show_status=False, ip_filter_where=None):
        """ip_filter_where: where the filter.* IP lists are applied: "kernel", "workers" or None (no lists)."""
        self.cfg = cfg
        self.ip_filter_where = ip_filter_where
        self.out_dir = Path(out_dir)
        self.interfaces = tuple(interfaces)
        self.cores = cores
        self.show_status = show_status
        base = cfg.capture.fanout_group if cfg.capture.fanout_group is not None else os.getpid() & 0xFFFF
        self.fanout_ids = tuple((base + i) & 0xFFFF for i in range(len(self.interfaces)))
        self.ctx = multiprocessing.get_context("fork")
        self.slots = [_Slot(i, core) for i, core in enumerate(cores)]
        self.started = time.time()
        self.stop_requested = None  # name of the signal
        self.hup = False
        self.lock = threading.Lock()
        self.errors = []
        from export import stats_json_path

        self.stats_path = stats_json_path(cfg.export, self.out_dir, self.started)

    # -- workers --

    def _start(self, slot):
        parent, child = self.ctx.Pipe()
        spec = WorkerSpec(slot.worker_id, slot.core, self.cfg, self.out_dir, self.interfaces, self.fanout_ids,
                          kernel_ip_filter=self.ip_filter_where == "kernel")
        inherited = [s.conn for s in self.slots if s.conn is not None and s is not slot]
        proc = self.ctx.Process(target=worker_main, args=(spec, child, inherited, self.worker_class),
                                name=f"dnsprobe-w{slot.worker_id}")
        proc.start()
        child.close()
        slot.proc, slot.conn, slot.pid = proc, parent, proc.pid
        slot.started = time.monotonic()
        slot.ready = slot.finished = False
        slot.snapshot = None
        slot.restart_at = None

    def _broadcast(self, cmd):
        for slot in self.slots:
            if slot.conn is not None and slot.proc is not None and slot.proc.is_alive():
                try:
                    slot.conn.send(cmd)
                except OSError:
                    pass  # its death is noticed and handled by _reap

    def _receive(self, slot):
        try:
            while slot.conn is not None and slot.conn.poll():
                kind, *rest = slot.conn.recv()
                if kind == "ready":
                    slot.ready = True
                elif kind in ("stats", "final"):
                    with self.lock:
                        slot.snapshot = rest[0]
                    if kind == "final":
                        slot.finished = True
                elif kind == "error":
                    slot.error = (rest[0], rest[1])
        except (EOFError, OSError):
            slot.conn.close()
            slot.conn = None

    def _reap(self, slot, stopping):
        """Handle a worker process that has exited; returns True if it had."""
        proc = slot.proc
        if proc is None or proc.exitcode is None:
            return False
        if slot.conn is not None:
            self._receive(slot)
        code = proc.exitcode
        proc.join()
        slot.proc = None
        if slot.conn is not None:
            slot.conn.close()
            slot.conn = None
        if stopping and slot.finished:
            return True
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        part = (slot.snapshot or {}).get("part_file")
        with self.lock:
            slot.retired = slot.counters()
            slot.retired.worker_restarts = 0
            slot.snapshot = None
        if stopping:
            self.errors.append(f"worker {slot.worker_id} ended with {how} while stopping")
            _log(self.errors[-1])
            slot.finished = True
            return True
        if slot.error:
            _log(f"worker {slot.worker_id}: {slot.error[1]}")
            slot.error = None
        quick = time.monotonic() - slot.started < QUICK_DEATH_S
        slot.quick_deaths = slot.quick_deaths + 1 if quick else 0
        delay = 0.0 if slot.quick_deaths <= 1 else min(30.0, 0.5 * 2 ** (slot.quick_deaths - 1))
        slot.restarts += 1
        slot.restart_at = time.monotonic() + delay
        msg = f"worker {slot.worker_id} (pid {slot.pid}, core {slot.core}) died ({how}); restarting"
        if delay:
            msg += f" in {delay:.1f} s"
        if part:
            msg += f"; its unfinished file {Path(part).name} is left as it was"
        _log(msg)
        return True

    # -- statistics --

    def totals(self):
        total = Stats()
        with self.lock:
            for slot in self.slots:
                total.add(slot.counters())
        return total

    def stats_doc(self, running):
        with self.lock:
            workers = {
                str(s.worker_id): {
                    "core": s.core,
                    "pid": s.pid,
                    "alive": s.proc is not None,
                    "restarts": s.restarts,
                    "counters": s.counters().as_dict(),
                    "interfaces": (s.snapshot or {}).get("interfaces", {}),
                    "part_file": (s.snapshot or {}).get("part_file"),
                }
                for s in self.slots
            }
        now = datetime.datetime.now(datetime.timezone.utc)
        return {
            "running": running,
            "started": datetime.datetime.fromtimestamp(self.started, datetime.timezone.utc).isoformat(),
            "updated": now.isoformat(),
            "interfaces": list(self.interfaces),
            "coremask": self.cfg.capture.coremask,
            "fanout_groups": dict(zip(self.interfaces, self.fanout_ids, strict=True)),
            "ip_filter": self.ip_filter_where,
            "decode_parser": effective_parser(self.cfg.decode.parser),  # auto resolved: fast or wire
            "workers": workers,
            "errors": list(self.errors),
        }

    def write_stats(self, running):
        if not self.cfg.run.stats_json:
            return
        try:
            self.totals().write_json(self.stats_path, self.stats_doc(running))
        except OSError as exc:
            _log(f"cannot write {self.stats_path}: {exc}")

    def _status(self, last):
        total = self.totals()
        now = time.monotonic()
        rate = (total.packets - last[1]) / max(now - last[0], 1e-6) if last else 0.0
        alive = sum(1 for s in self.slots if s.proc is not None)
        _StatusLine.show(
            f"{int(time.time() - self.started)}s  packets {total.packets:,} ({rate:,.0f}/s)  "
            f"records {total.records:,}  files {total.files:,}  kernel drops {total.kernel_drops:,}  "
            f"workers {alive}/{len(self.slots)}"
        )
        return (now, total.packets)

    def _start_prometheus(self):
        port = self.cfg.capture.prometheus_port
        if not port:
            return
        from prometheus_client import start_http_server
        from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

        supervisor = self

        class Collector:
            def collect(self):
                with supervisor.lock:
                    per_worker = [(s.worker_id, s.counters(), s.proc is not None) for s in supervisor.slots]
                for name, meaning in COUNTERS:
                    fam = CounterMetricFamily(f"dnsprobe_{name}", meaning, labels=["worker"])
                    for wid, counters, _ in per_worker:
                        fam.add_metric([str(wid)], getattr(counters, name))
                    yield fam
                alive = GaugeMetricFamily("dnsprobe_worker_up", "1 when the capture worker runs", labels=["worker"])
                for wid, _, up in per_worker:
                    alive.add_metric([str(wid)], 1 if up else 0)
                yield alive

        registry = CollectorRegistry(auto_describe=True)
        registry.register(Collector())
        try:
            start_http_server(port, addr=self.cfg.capture.prometheus_address, registry=registry)
        except OSError as exc:
            raise ConfigError(
                f"config key 'capture.prometheus_port': cannot listen on "
                f"{self.cfg.capture.prometheus_address}:{port}: {exc.strerror}"
            ) from None

    # -- the run --

    def _on_signal(self, signum, _frame):
        if signum == signal.SIGHUP:
            self.hup = True
        elif self.stop_requested is None:
            self.stop_requested = signal.Signals(signum).name

    def _wait(self, timeout):
        waitables = []
        for slot in self.slots:
            if slot.conn is not None:
                waitables.append(slot.conn)
            if slot.proc is not None:
                waitables.append(slot.proc.sentinel)
        if waitables:
            multiprocessing.connection.wait(waitables, timeout)
        else:
            time.sleep(timeout)
        for slot in self.slots:
            if slot.conn is not None:
                self._receive(slot)

    def _stop_all(self, deadline_s=STOP_TIMEOUT_S):
        self._broadcast("stop")
        deadline = time.monotonic() + deadline_s
        while any(s.proc is not None for s in self.slots):
            self._wait(0.25)
            for slot in self.slots:
                self._reap(slot, stopping=True)
            if time.monotonic() > deadline:
                for slot in self.slots:
                    if slot.proc is not None:
                        self.errors.append(f"worker {slot.worker_id} did not stop in {deadline_s:.0f} s; killed")
                        _log(self.errors[-1])
                        slot.proc.kill()
                deadline = float("inf")

    def _startup(self):
        for slot in self.slots:
            self._start(slot)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all(s.ready for s in self.slots):
            self._wait(0.1)
            failed = [s for s in self.slots if s.error or (s.proc is not None and s.proc.exitcode is not None)]
            if failed or time.monotonic() > deadline:
                self._abort_startup(failed[0] if failed else None)

    def _abort_startup(self, slot):
        """A worker could not start (or none in time): stop the others and raise its error."""
        if slot is not None and slot.conn is not None:
            self._receive(slot)
        error = slot.error if slot is not None else None
        code = slot.proc.exitcode if slot is not None and slot.proc is not None else None
        for s in self.slots:
            if s.proc is not None and s.proc.exitcode is None:
                s.proc.terminate()
        for s in self.slots:
            if s.proc is not None:
                s.proc.join(10)
                if s.proc.exitcode is None:
                    s.proc.kill()
                    s.proc.join()
                s.proc = None
        if error:
            raise ConfigError(error[1]) if error[0] == 2 else DnsprobeError(error[1])
        if slot is not None:
            raise DnsprobeError(f"worker {slot.worker_id} failed to start (exit status {code}); see above")
        raise DnsprobeError(f"the workers did not start within {STARTUP_TIMEOUT_S:.0f} s")

    def run(self):
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            return self._run()
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            _StatusLine.clear()

    def _run(self):
        self._startup()
        try:
            self._start_prometheus()
        except ConfigError:
            self._stop_all()
            raise
        cores = ",".join(map(str, self.cores))
        _log(
            f"capturing on {', '.join(self.interfaces)} with {len(self.slots)} worker(s) on core(s) {cores}; "
            f"writing to {self.out_dir}"
        )
        self.write_stats(running=True)
        rotate_s = self.cfg.export.rotate_seconds
        next_rotate = (int(time.time() / rotate_s) + 1) * rotate_s if rotate_s else None
        stats_s = self.cfg.capture.stats_interval
        next_stats = time.monotonic() + stats_s if stats_s else None
        next_status = time.monotonic() + 1.0
        last_status = None
        while self.stop_requested is None:
            self._wait(0.25)
            for slot in self.slots:
                self._reap(slot, stopping=False)
                if slot.proc is None and slot.restart_at is not None and time.monotonic() >= slot.restart_at:
                    self._start(slot)
            if self.hup:
                self.hup = False
                _log("SIGHUP: rotating the output files")
                self._broadcast("rotate")
            if next_rotate is not None and time.time() >= next_rotate:
                self._broadcast("rotate")
                next_rotate = (int(time.time() / rotate_s) + 1) * rotate_s
            now = time.monotonic()
            if next_stats is not None and now >= next_stats:
                self.write_stats(running=True)
                next_stats = now + stats_s
            if self.show_status and now >= next_status:
                last_status = self._status(last_status)
                next_status = now + 1.0
        _log(f"{self.stop_requested}: stopping; the workers flush their pending transactions and close their files")
        self._stop_all()
        self.write_stats(running=False)
        return 1 if self.errors else 0


# ---------------------------------------------------------------------------------------------
# The command

CAPTURE_EPILOG = """\
Captures on one or more interfaces with one worker process per core of the coremask. Each worker
reads every interface through its own AF_PACKET TPACKET_V3 ring, in a fanout group that sends both
directions of a flow to the same worker; a kernel filter keeps only DNS (and IP fragments). Each
worker writes its own files (NAME.w<worker>.parquet, .part while open). Files rotate on the wall clock
every export.rotate_seconds for all workers together, after export.rotate_records records, and on
SIGHUP. SIGINT or SIGTERM stops: pending transactions are written, files closed, exit status 0.
A worker that dies is restarted (logged; counted as worker_restarts). Statistics: a JSON file in the
output directory (at start, every capture.stats_interval seconds, at exit), a Prometheus endpoint
(capture.prometheus_port), and a status line when stderr is a terminal.

Needs root or CAP_NET_RAW; --user NAME makes the workers switch to NAME once their sockets are open.

exit status: 0 stopped cleanly by SIGINT/SIGTERM; 1 a worker failed while stopping (its files may be
left as .part); 2 usage or configuration error (unknown interface, bad coremask, no permission, ...).

examples:
  dnsprobe capture -i eth0 -o /var/lib/dnsprobe
  dnsprobe capture -i eth0 -i eth1 --coremask 0x3 -o out/ --prometheus-port 9153
  dnsprobe capture -c /etc/dnsprobe/resolver.yml --user dnsprobe
"""

CAPTURE_FLAGS = (
    # (flags, key, type, help); type None: a switch
    (("-i", "--interface"), "capture.interfaces", str, "interface to capture on (repeatable)"),
    (("--coremask",), "capture.coremask", str, "hex mask of the cores to run workers on, e.g. 0x3"),
    (("--promiscuous",), "capture.promiscuous", None, "put the interfaces in promiscuous mode"),
    (("--user",), "capture.user", str, "user the workers switch to after opening their sockets"),
    (("--block-size",), "capture.block_size", int, "bytes per ring block"),
    (("--block-count",), "capture.block_count", int, "blocks per ring"),
    (("--block-timeout",), "capture.block_timeout_ms", int, "ms before a partly filled block is handed over"),
    (("--stats-interval",), "capture.stats_interval", float, "seconds between statistics JSON writes"),
    (("--prometheus-port",), "capture.prometheus_port", int, "local port of the Prometheus endpoint (0: off)"),
    (("--dpdk",), "dpdk.enabled", None, "capture with DPDK instead of AF_PACKET (README, DPDK)"),
    (("--dpdk-args",), "dpdk.args", str, "EAL arguments, e.g. --dpdk-args='--no-huge --vdev=net_pcap0,rx_pcap=F'"),
    (("--dpdk-port",), "dpdk.port", int, "DPDK port to capture on"),
)


def add_capture_parser(sub, config_flags):
    """The `capture` subcommand (called from probe.cli.build_parser)."""
    import argparse

    cap = sub.add_parser(
        "capture",
        help="capture live traffic from network interfaces",
        description="Capture DNS from network interfaces, match queries with responses, write records.",
        epilog=CAPTURE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flags, key, typ, help_ in CAPTURE_FLAGS:
        if typ is None:
            cap.add_argument(*flags, dest=key, action="store_const", const=True, help=help_)
        elif key == "capture.interfaces":
            cap.add_argument(*flags, dest=key, action="append", metavar="IFACE", help=help_)
        else:
            cap.add_argument(*flags, dest=key, type=typ, metavar=key.split(".")[1].upper(), help=help_)
    from probe.cli import add_pipeline_options

    add_pipeline_options(cap, config_flags, "capture.block_count=64", "the status line", "the statistics table")
    return cap


def cmd_capture(args):
    from rich.console import Console

    from export import check_output_dir
    from probe.cli import _overrides
    from probe.config import load_config
    from probe.privacy import IpFilter, client_privacy
    from probe.sources.afpacket import interface_link_type, ip_lists_fit

    overrides = _overrides(args)
    for _, key, _, _ in CAPTURE_FLAGS:
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    cfg = load_config(args.config, overrides)
    client_privacy(cfg.privacy)  # a missing or malformed key file stops us here, before any worker starts
    cap = cfg.capture
    if cfg.dpdk.enabled:
        from probe.dpdk_live import cmd_capture_dpdk

        return cmd_capture_dpdk(cfg, args)
    if not cap.interfaces:
        raise ConfigError("no interface to capture on: give -i IFACE or set capture.interfaces")
    if len(set(cap.interfaces)) != len(cap.interfaces):
        raise ConfigError(f"config key 'capture.interfaces': an interface is named twice: {list(cap.interfaces)}")
    cores = parse_coremask(cap.coremask)
    out_dir = Path(cfg.export.directory)
    check_output_dir(out_dir)
    if cap.user:
        lookup_user(cap.user)
    for ifname in cap.interfaces:
        interface_link_type(ifname)
    check_capture_permission()
    ip_filter = IpFilter(cfg.filter)
    where = None
    if ip_filter:
        where = "kernel" if cap.kernel_ip_filter and ip_lists_fit(cfg.decode.dns_ports, ip_filter) else "workers"
        _log(f"IP allow/deny lists applied in the {'kernel filter' if where == 'kernel' else 'workers'}")
    show = cfg.run.progress == "always" or (cfg.run.progress == "auto" and sys.stderr.isatty())
    supervisor = Supervisor(cfg, out_dir, cap.interfaces, cores, show_status=show, ip_filter_where=where)
    status = supervisor.run()
    if not args.quiet:
        supervisor.totals().render_table(Console(file=sys.stdout))
    return status
