"""Live capture: `dnsprobe capture`, a supervisor and one pinned worker process per core.

Supervisor (the process that runs the command):
  - checks everything it can before starting anything (interfaces, coremask, permissions, output
    directory, user), so a usage or configuration error is exit status 2 with one line naming it;
  - starts one worker per core of the coremask and waits until every worker has opened its sockets;
  - receives each worker's statistics snapshot once a second over a pipe (never per message), sums them,
    writes the statistics JSON file at start, every capture.stats_interval seconds and at exit, serves
    them to Prometheus, and shows a status line when stderr is a terminal;
  - rotates the files of all workers together on the wall clock, at multiples of export.rotate_seconds,
    and at once on SIGHUP;
  - stops as on SIGTERM once the workers' snapshots sum to capture.count packets (--count; so a file may hold a
    second's worth more) or capture.duration seconds have passed since the workers started (--duration);
  - on SIGINT/SIGTERM tells every worker to stop, and exits 0 once all have flushed and closed their files
    (1 if a worker failed while stopping or data was lost), after a one-line summary;
  - restarts a worker that dies (logged, counted as worker_restarts); the files it had completed are
    untouched, what it had not yet put in a file is counted as lost_in_dead_worker (from its last snapshot),
    and the file it was writing is finished by a recovery process (probe.run.recovery): every transaction it
    had put there is kept. Files that an earlier run left unfinished are recovered at start;
  - runs export.on_close for every file its workers and recoveries finish (probe.run.onclose), and waits for
    those commands at the end.

A led group (a worker class with LEADER, DPDK's multi-process shape): worker 0 leads. It starts first, the
others once it is ready; a stop asks it first, then the others once it says it is "drained", then tells it to
"close" once they are gone; when it dies the others are stopped and the group starts again (a new `group` name
in the workers' spec), and the class's group_ended(cfg, group) is called once every process of a group is gone.

A worker position's state is a WorkerSlot (probe/run/slot.py); the statistics document, status line and closing
summary are made in probe/run/supervisor_report.py.
"""

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from pathlib import Path

from export.base import stats_json_path
from probe.errors import ConfigError, DnsprobeError
from probe.run.log import StatusLine, log
from probe.run.onclose import OnCloseCommands
from probe.run.prometheus import serve_prometheus
from probe.run.recovery import Recoveries
from probe.run.slot import WorkerSlot
from probe.run.supervisor_report import stats_doc, status_line, summary
from probe.run.top import TopWindow, serve_top, stop_serving
from probe.run.worker import WorkerSpec, worker_main
from probe.stats import Stats

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 120.0  # a worker still running this long after "stop" is killed (logged)
QUICK_DEATH_S = 10.0  # a worker dying sooner than this after its start is restarted with a growing delay


class Supervisor:
    def __init__(self, cfg, out_dir, interfaces, cores, worker_class, *, origin, show_status=False,
                 ip_filter_where=None, dnstap_listeners=(), dnstap=(), fanout_ids=None):
        """worker_class: what a worker process runs, a WorkerShell backend (LiveWorker, DpdkGroup,
        DpdkThreadsWorker); origin: what the files record of the run (probe.run.pipeline.file_origin: its source
        kinds, the digest of the configuration as given); ip_filter_where: where the filter.* IP lists are applied:
        "kernel", "workers" or None (no lists); dnstap_listeners: the dnstap listening sockets every worker accepts
        from, described by the dnstap lines (for the log and the statistics); fanout_ids: the fanout group of each
        interface (probe.run.fanout; None: derived from the process id)."""
        self.worker_class = worker_class
        self.source = getattr(worker_class, "SOURCE", "af_packet")  # the counters that apply (stats.applicable)
        self.dnstap_listeners = tuple(dnstap_listeners)
        self.dnstap = list(dnstap)
        self.cfg = cfg
        self.origin = origin
        self.ip_filter_where = ip_filter_where
        self.out_dir = Path(out_dir)
        self.interfaces = tuple(interfaces)
        self.cores = cores
        self.show_status = show_status
        if fanout_ids is None:
            base = cfg.capture.fanout_group if cfg.capture.fanout_group is not None else os.getpid() & 0xFFFF
            fanout_ids = tuple((base + i) & 0xFFFF for i in range(len(self.interfaces)))
        self.fanout_ids = tuple(fanout_ids)
        self.ctx = multiprocessing.get_context("fork")
        self.slots = [WorkerSlot(i, core) for i, core in enumerate(cores)]
        self.started = time.time()
        self.stop_requested = None  # name of the signal, or the --count/--duration reached
        self.stopped = False  # every worker has been stopped (the end of the run)
        self.hup = False
        self.lock = threading.Lock()
        self.errors = []
        self.stats_path = None  # taken at the first write (export.base.stats_json_path)
        self.recoveries = Recoveries(self.ctx, cfg.export)
        self.on_close = OnCloseCommands(cfg.export, cfg.capture.user)  # (before any fork: see probe.run.onclose)
        self.dns_metrics = bool(cfg.capture.prometheus_port)
        self.top = TopWindow(cfg.capture.top, cfg.capture.top_idle_seconds)  # `dnsprobe top` (probe.run.top)
        self.leads = bool(getattr(worker_class, "LEADER", False))
        self.generation = 0  # starts of a led group's leader
        self.ended = set()  # groups whose end was reported (group_ended)

    # -- workers --

    def group(self):
        """The name the processes of the current start of a led group share ("" for other workers)."""
        return f"dnsprobe{os.getpid()}g{self.generation}" if self.leads else ""

    def _start(self, slot):
        parent, child = self.ctx.Pipe()
        slot.group = self.group()
        spec = WorkerSpec(slot.worker_id, slot.core, self.cfg, self.out_dir, self.interfaces, self.fanout_ids,
                          kernel_ip_filter=self.ip_filter_where == "kernel", dnstap_listeners=self.dnstap_listeners,
                          dns_metrics=self.dns_metrics, top=self.top.mode != "false",
                          top_counting=self.top.counting, group=slot.group, origin=self.origin)
        inherited = [s.conn for s in self.slots if s.conn is not None and s is not slot]
        proc = self.ctx.Process(target=worker_main, args=(spec, child, inherited, self.worker_class),
                                name=f"dnsprobe-w{slot.worker_id}")
        proc.start()
        child.close()
        slot.proc, slot.conn, slot.pid = proc, parent, proc.pid
        slot.started = time.monotonic()
        slot.ready = slot.finished = slot.drained = slot.parked = False
        slot.snapshot = None
        slot.restart_at = None

    def _may_start(self, slot):
        """In a led group the leader starts when none of the others runs, and the others when it is ready."""
        if not self.leads:
            return True
        leader = self.slots[0]
        if slot is leader:
            return all(s.proc is None for s in self.slots[1:])
        return leader.proc is not None and leader.ready and leader.group == self.group()

    def _groups_ended(self):
        """Report the led groups none of whose processes runs any more (but the current one while it may)."""
        if not self.leads:
            return
        running = {s.group for s in self.slots if s.proc is not None}
        for generation in range(self.generation + 1):
            group = f"dnsprobe{os.getpid()}g{generation}"
            if group in running or group in self.ended or (generation == self.generation and not self.stopped):
                continue
            self.ended.add(group)
            try:
                self.worker_class.group_ended(self.cfg, group)
            except OSError as exc:
                log(f"cannot remove what the workers of {group} left: {exc}")

    def _broadcast(self, cmd):
        self._tell(self.slots, cmd)

    def _receive(self, slot):
        try:
            while slot.conn is not None and slot.conn.poll():
                kind, *rest = slot.conn.recv()
                if kind == "ready":
                    slot.ready = True
                elif kind in ("stats", "final"):
                    if "top" in rest[0]:
                        self.top.add(rest[0].pop("top"), slot.worker_id)
                    with self.lock:
                        slot.snapshot = rest[0]
                        slot.files.extend(Path(f).name for f in rest[0].get("new_files", ()))
                    if kind == "final":
                        slot.finished = True
                elif kind == "error":
                    slot.error = (rest[0], rest[1])
                elif kind == "drained":
                    slot.drained = True
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
        if slot.parked and slot.finished:  # stopped with its leader: starts again after it
            with self.lock:
                slot.retire()
            slot.restarts += 1
            slot.restart_at = time.monotonic()
            log(f"worker {slot.worker_id} (pid {slot.pid}) stopped with worker 0; it starts again after it")
            return True
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        last = slot.snapshot or {}
        lost = last.get("unwritten", 0) + last.get("pending_queries", 0)
        live = [Path(f) for f in last.get("live_files") or ()]
        with self.lock:
            slot.lost += lost
            slot.retire()
        # What the worker had put in its files is kept: they are finished by a process of their own.
        self.recoveries.start({self.out_dir, *(f.parent for f in live)}, f"of worker {slot.worker_id} (pid {slot.pid})")
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
        if self.leads and slot is self.slots[0]:
            # The others depend on it (DPDK: its memory and port): they stop, and the group starts again.
            self.generation += 1
            for other in self.slots[1:]:
                if other.proc is not None:
                    other.parked = True
                    try:
                        other.conn.send("stop")
                    except (OSError, AttributeError):
                        pass
        msg = f"worker {slot.worker_id} (pid {slot.pid}, core {slot.core}) died ({how}); restarting"
        if delay:
            msg += f" in {delay:.1f} s"
        msg += f"; lost {lost:,} transaction(s) not yet in a file (lost_in_dead_worker)" if lost else \
            "; every transaction it had completed was in a file"
        if live:
            msg += f"; recovering {', '.join(f.name for f in live)}"
        log(msg)
        return True

    # -- statistics --

    def totals(self):
        total = Stats()
        with self.lock:
            for slot in self.slots:
                total.add(slot.counters())
        total.files += len(self.recoveries.files)
        self.on_close.count(total)
        return total

    def write_stats(self, running):
        if not self.cfg.run.stats_json:
            return
        try:
            if self.stats_path is None:
                self.stats_path = stats_json_path(self.cfg.export, self.out_dir, self.started)
            self.totals().write_json(self.stats_path, stats_doc(self, running))
        except OSError as exc:
            log(f"cannot write {self.stats_path or 'the statistics file'}: {exc}")

    # -- the run --

    def _on_signal(self, signum, _frame):
        if signum == signal.SIGHUP:
            self.hup = True
        elif self.stop_requested is None:
            self.stop_requested = signal.Signals(signum).name

    def _wait(self, timeout):
        waitables = self.recoveries.waitables() + self.on_close.waitables()
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
        self.recoveries.poll()
        self.on_close.poll()

    def _tell(self, slots, cmd):
        for slot in slots:
            if slot.conn is not None and slot.proc is not None and slot.proc.is_alive():
                try:
                    slot.conn.send(cmd)
                except OSError:
                    pass  # its death is noticed and handled by _reap

    def _stop_all(self, deadline_s=STOP_TIMEOUT_S):
        """Stop every worker (a led group: the leader first, see the module's docstring), and wait for them."""
        leader, others = (self.slots[0], self.slots[1:]) if self.leads else (None, self.slots)
        phase = "leader" if leader is not None else "others"
        self._tell([leader] if leader is not None else others, "stop")
        deadline = time.monotonic() + deadline_s
        while any(s.proc is not None for s in self.slots):
            self._wait(0.25)
            for slot in self.slots:
                self._reap(slot, stopping=True)
            if phase == "leader" and (leader.drained or leader.proc is None):
                phase = "others"
                self._tell(others, "stop")
            if phase == "others" and leader is not None and all(s.proc is None for s in others):
                phase = "close"
                self._tell([leader], "close")
            if time.monotonic() > deadline:
                for slot in self.slots:
                    if slot.proc is not None:
                        self.errors.append(f"worker {slot.worker_id} did not stop in {deadline_s:.0f} s; killed")
                        log(self.errors[-1])
                        slot.proc.kill()
                deadline = float("inf")
        self.stopped = True
        self._groups_ended()

    def _limit_reached(self, began):
        """The reason to stop that capture.count or capture.duration gives once it is reached, else None."""
        cap = self.cfg.capture
        if cap.duration and time.monotonic() - began >= cap.duration:
            return f"--duration {cap.duration:g}"
        if cap.count:
            with self.lock:
                packets = sum(slot.counters().packets for slot in self.slots)
            if packets >= cap.count:
                return f"--count {cap.count}"
        return None

    def _startup(self):
        # A led group: the leader first, the others once it is ready.
        for batch in ([self.slots[:1], self.slots[1:]] if self.leads else [self.slots]):
            for slot in batch:
                self._start(slot)
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not all(s.ready for s in batch):
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
        self.stopped = True
        self._groups_ended()
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
        # Files an earlier run left unfinished here (it was killed, or the machine stopped) are finished first.
        self.recoveries.start([self.out_dir], "left by an earlier run", recursive=True)  # (hive: partitions)
        self._startup()
        try:
            serve_prometheus(self)
        except ConfigError:
            self._stop_all()
            raise
        top_server = serve_top(self)
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
        began = time.monotonic()
        while self.stop_requested is None:
            self._wait(0.25)
            command = self.top.command(time.monotonic())  # capture.top on-demand: start or stop the counting
            if command:
                self._broadcast(command)
            reason = self._limit_reached(began)
            if reason and self.stop_requested is None:
                self.stop_requested = reason
            for slot in self.slots:
                self._reap(slot, stopping=False)
            self._groups_ended()
            for slot in self.slots:
                if (slot.proc is None and slot.restart_at is not None and time.monotonic() >= slot.restart_at
                        and self._may_start(slot)):
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
                last_status = status_line(self, last_status)
                next_status = now + 1.0
        log(f"{self.stop_requested}: stopping; the workers flush their pending transactions and close their files")
        self._stop_all()
        stop_serving(top_server, self.cfg)
        self.stopped = True
        self._groups_ended()
        self.recoveries.wait()
        self.on_close.wait()
        self.write_stats(running=False)
        total = self.totals()
        log(summary(self, total))
        return 1 if self.errors or self.recoveries.errors or total.lost_in_dead_worker else 0
