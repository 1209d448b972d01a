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
"""

import datetime
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from pathlib import Path

from export.base import stats_json_path
from probe.decode.parsers import effective as effective_parser
from probe.errors import ConfigError, DnsprobeError
from probe.run.log import StatusLine, log
from probe.run.prometheus import serve_prometheus
from probe.run.worker import WorkerSpec, worker_main
from probe.stats import COUNTER_NAMES, Stats

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 120.0  # a worker still running this long after "stop" is killed (logged)
QUICK_DEATH_S = 10.0  # a worker dying sooner than this after its start is restarted with a growing delay


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


class Supervisor:
    def __init__(self, cfg, out_dir, interfaces, cores, worker_class, show_status=False, ip_filter_where=None,
                 dnstap_listeners=(), dnstap=()):
        """worker_class: what a worker process runs (probe.run.live_worker.LiveWorker,
        probe.run.dpdk_worker.DpdkWorker); ip_filter_where: where the filter.* IP lists are applied: "kernel",
        "workers" or None (no lists); dnstap_listeners: the dnstap listening sockets every worker accepts from,
        described by the dnstap lines (for the log and the statistics)."""
        self.worker_class = worker_class
        self.dnstap_listeners = tuple(dnstap_listeners)
        self.dnstap = list(dnstap)
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
        self.stats_path = stats_json_path(cfg.export, self.out_dir, self.started)

    # -- workers --

    def _start(self, slot):
        parent, child = self.ctx.Pipe()
        spec = WorkerSpec(slot.worker_id, slot.core, self.cfg, self.out_dir, self.interfaces, self.fanout_ids,
                          kernel_ip_filter=self.ip_filter_where == "kernel", dnstap_listeners=self.dnstap_listeners)
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
            log(self.errors[-1])
            slot.finished = True
            return True
        if slot.error:
            log(f"worker {slot.worker_id}: {slot.error[1]}")
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
        log(msg)
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
            "dnstap": self.dnstap,
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
            log(f"cannot write {self.stats_path}: {exc}")

    def _status(self, last):
        total = self.totals()
        now = time.monotonic()
        count = total.packets + total.dnstap_frames  # frames of either kind, for the rate
        rate = (count - last[1]) / max(now - last[0], 1e-6) if last else 0.0
        alive = sum(1 for s in self.slots if s.proc is not None)
        parts = [f"{int(time.time() - self.started)}s"]
        if self.interfaces:
            parts.append(f"packets {total.packets:,}")
        if self.dnstap:
            producers = total.dnstap_connections - total.dnstap_disconnections
            parts.append(f"dnstap messages {total.dnstap_frames:,} from {producers} producer(s)")
        parts.append(f"({rate:,.0f}/s)")
        parts.append(f"records {total.records:,}  files {total.files:,}")
        if self.interfaces:
            parts.append(f"kernel drops {total.kernel_drops:,}")
        if self.dnstap:
            errors = total.dnstap_frame_errors + total.dnstap_decode_errors + total.dnstap_truncated
            parts.append(f"dnstap errors {errors:,}")
        parts.append(f"workers {alive}/{len(self.slots)}")
        StatusLine.show("  ".join(parts))
        return (now, count)

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
                        log(self.errors[-1])
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
            StatusLine.clear()

    def _run(self):
        self._startup()
        try:
            serve_prometheus(self)
        except ConfigError:
            self._stop_all()
            raise
        cores = ",".join(map(str, self.cores))
        log(
            f"capturing on {', '.join([*self.interfaces, *self.dnstap])} with {len(self.slots)} worker(s) on core(s)"
            f" {cores}; writing to {self.out_dir}"
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
                log("SIGHUP: rotating the output files")
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
        log(f"{self.stop_requested}: stopping; the workers flush their pending transactions and close their files")
        self._stop_all()
        self.write_stats(running=False)
        return 1 if self.errors else 0
