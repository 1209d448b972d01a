"""What every capture worker process shares, whatever its backend: its specification, its entry point, and the
worker shell, the worker's side of the supervisor's protocol written once. The backends, which say how they read
their sources: probe.run.live_worker (AF_PACKET rings, dnstap sockets) and probe.run.dpdk_worker (DPDK, one
process per core or one thread per queue).

The protocol, over the worker's pipe to the supervisor (probe.run.supervisor):
  supervisor -> worker: "rotate" (close the files now), "stop" (read what the sources hold, finish, exit), to
    a led group's leader "close" (the others are gone: release the shared sources), and "top-on" and "top-off"
    (capture.top on-demand: count the figures of `dnsprobe top` from now on, or no longer);
  worker -> supervisor: ("ready", pid) once its sources are open, ("stats", snapshot) every STATS_PUSH_S and soon
    after its traffic pauses, ("drained",) from a leader that read its source and finished its pipeline,
    ("final", snapshot) before it exits, ("error", exit status, message) when it cannot start.
"""

import dataclasses
import os
import signal
import sys
import threading
import time
from pathlib import Path

from probe.errors import DnsprobeError
from probe.run.durability import FileReport
from probe.run.log import log
from probe.run.pipeline import Pipeline
from probe.stats import Stats

STATS_PUSH_S = 1.0  # how often a worker sends its counters to the supervisor
IDLE_PUSH_S = 0.2  # a worker whose traffic paused reports its new counters after this long, not a second later


@dataclasses.dataclass
class WorkerSpec:
    worker_id: int
    core: int
    cfg: object
    out_dir: Path
    interfaces: tuple
    fanout_ids: tuple
    kernel_ip_filter: bool = False  # the filter.* IP lists are in the kernel filter, not applied by the worker
    dnstap_listeners: tuple = ()  # the dnstap listening sockets (probe.capture.dnstap_listen), shared by all workers
    dns_metrics: bool = False  # count what is written by RCODE, QTYPE, transport and delay (export.metrics)
    top: bool = False  # may count the figures of `dnsprobe top` (export.live_top): capture.top is not false
    top_counting: bool = False  # counts them from the start (else from a "top-on")
    group: str = ""  # the name the workers of one start of a led group share (DPDK: the EAL's file prefix)
    origin: object = None  # what the files record of the run: an export.filemeta.FileOrigin (the supervisor's)


def set_parent_death_signal():
    """Be told (SIGTERM, a clean stop) if the supervisor disappears without stopping us."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_main(spec, conn, inherited, worker_class=None):
    """Entry point of a worker process (forked by the supervisor): pins it, opens its sources with
    worker_class(spec, conn, stop) (a WorkerShell: probe.run.live_worker.LiveWorker, probe.run.dpdk_worker's
    DpdkGroup and DpdkThreadsWorker), says it is ready and runs it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C reaches the supervisor, which stops us
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # rotation is the supervisor's to order
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    set_parent_death_signal()
    for c in inherited:  # other workers' pipe ends, copied by fork
        c.close()
    try:
        os.sched_setaffinity(0, {spec.core})
    except OSError as exc:
        conn.send(("error", 2, f"worker {spec.worker_id}: cannot pin to core {spec.core}: {exc.strerror}"))
        sys.exit(2)
    try:
        worker = worker_class(spec, conn, stop)
    except DnsprobeError as exc:
        conn.send(("error", exc.exit_status, str(exc)))
        sys.exit(exc.exit_status)
    conn.send(("ready", os.getpid()))
    sys.exit(worker.run())


class WorkerShell:
    """A worker process: the supervisor's commands, snapshots of its counters and files, their pushes, and the
    order of a stop, for any backend. A backend opens its sources and makes its pipelines with new_pipeline()
    in its constructor, and says how it reads them:
      step(): read what the sources hold, waiting for them at most about 0.2 s (and flush on time);
      interfaces(stats): the sources' own counters into `stats`, and what the snapshot says of each source;
      drain(): on stop, read what the sources still hold, then finish the pipelines;
      close(): release the sources (after drain(), or after an error).
    rotate() and stopped() may be overridden (a pipeline per thread; a led group's leader)."""

    SOURCE = None  # the counters that apply (probe.stats.applicable): "af_packet", "dpdk"

    def __init__(self, spec, conn, stop):
        self.spec, self.conn, self.stop = spec, conn, stop
        self.pipelines = []  # one per process, or one per reading thread
        self.dns = []  # their export.metrics.DnsMetrics, with spec.dns_metrics
        self.top = []  # their export.live_top.TopCounts, with spec.top
        self.top_packets = []  # each pipeline's packets counted in self.top so far
        self.top_counting = spec.top_counting  # they count (capture.top true, or a `dnsprobe top` asks)
        self.files = None  # FileReport, from the start of run()
        self.pushed = None  # the progress of the last snapshot sent

    def new_pipeline(self, cfg, pipeline_id):
        """A pipeline of this worker, writing PREFIX<start>.w<pipeline_id> files. Time rotation is the
        supervisor's (wall clock, all workers together), not the pipeline's."""
        cfg = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, rotate_seconds=0))
        pipeline = Pipeline(cfg, self.spec.out_dir, pipeline_id, live=True, origin=self.spec.origin)
        counters = []
        if self.spec.dns_metrics:
            from export.metrics import DnsMetrics

            self.dns.append(DnsMetrics())
            counters.append(self.dns[-1])
        if self.spec.top:
            from export.live_top import TopCounts

            self.top.append(TopCounts(counting=self.top_counting))
            self.top_packets.append(0)
            counters.append(self.top[-1])
        if len(counters) > 1:
            from export.live_top import Counted

            counters = [Counted(*counters)]
        if counters:
            pipeline.count_dns(counters[0])
        self.pipelines.append(pipeline)
        return pipeline

    def run(self):
        """The loop of a worker: read, obey, report; then drain, finish and say so. Returns the exit status."""
        self.files = FileReport(self.pipelines)
        next_push = time.monotonic() + STATS_PUSH_S
        last = None
        try:
            while not self.stop.is_set():
                self.step()
                self.commands()
                now = time.monotonic()
                progress = self.progress()
                paused, last = progress == last, progress
                if now >= next_push or (paused and progress != self.pushed
                                        and now >= next_push - STATS_PUSH_S + IDLE_PUSH_S):
                    self.push()
                    next_push = now + STATS_PUSH_S
            self.drain()
        except DnsprobeError as exc:
            log(f"worker {self.spec.worker_id}: {exc}")
            self.close()
            return exc.exit_status
        return self.stopped()

    def commands(self, wait=0.0):
        """Obey the supervisor's commands waiting in the pipe (the first one waited for `wait` seconds). True
        when told to "close", or when the supervisor is gone (then stop cleanly too)."""
        try:
            while self.conn.poll(wait):
                wait = 0.0
                cmd = self.conn.recv()
                if cmd == "rotate":
                    self.rotate()
                elif cmd == "stop":
                    self.stop.set()
                elif cmd == "close":
                    return True
                elif cmd in ("top-on", "top-off"):
                    self.count_top(cmd == "top-on")
        except (EOFError, OSError):
            self.stop.set()
            return True
        return False

    def rotate(self):
        for pipeline in self.pipelines:
            pipeline.rotate()

    def count_top(self, on):
        """Start counting the figures of `dnsprobe top` (the packets from those read now on), or stop."""
        if on == self.top_counting or not self.top:
            return
        for i, (pipeline, top) in enumerate(zip(self.pipelines, self.top)):
            self.top_packets[i] = pipeline.stats.packets + pipeline.stats.dnstap_frames
            if on:
                top.start()
            else:
                top.stop()
        self.top_counting = on

    def stopped(self):
        """The pipelines are finished: the sources' last counters, read before they are released, then the final
        snapshot. Returns the exit status."""
        self.push()
        self.close()
        self.push(final=True)
        return 0

    def progress(self):
        """What changes when the worker has news for the supervisor."""
        packets = dnstap = rows = interruptions = 0
        for pipeline in self.pipelines:
            stats = pipeline.stats
            packets += stats.packets
            dnstap += stats.dnstap_frames
            rows += stats.records
            interruptions += stats.capture_interruptions
        return packets, dnstap, rows, interruptions

    def snapshot(self):
        """The worker's counters (its pipelines' and its sources'), sources, files and DNS metrics."""
        if len(self.pipelines) == 1:
            stats = self.pipelines[0].stats  # the sources' counters are kept in it (pipeline.finish returns it)
        else:
            stats = Stats()
            for pipeline in self.pipelines:
                stats.add(pipeline.stats)
        interfaces = self.interfaces(stats)
        parts = [part for part in (p.summary()["part_file"] for p in self.pipelines) if part]
        snapshot = {"counters": stats.as_dict(), "interfaces": interfaces, "part_file": ", ".join(parts) or None,
                    **self.files.snapshot()}
        if self.dns:
            from export.metrics import DnsMetrics

            dns = DnsMetrics()
            for metrics in self.dns:
                dns.add_dict(metrics.as_dict())
            snapshot["dns"] = dns.as_dict()
        if self.top_counting:  # (while it counts, even nothing: the supervisor knows it does)
            snapshot["top"] = self.top_seconds()
        return snapshot

    def top_seconds(self):
        """The seconds of capture time counted since the last snapshot (export.live_top), with the packets read
        since then in the second of each pipeline's newest frame."""
        seconds = []
        for i, (pipeline, top) in enumerate(zip(self.pipelines, self.top)):
            packets = pipeline.stats.packets + pipeline.stats.dnstap_frames
            top.add_packets(packets - self.top_packets[i], pipeline.now_ns)
            self.top_packets[i] = packets
            seconds += top.take()
        return seconds

    def push(self, final=False):
        self.pushed = self.progress()
        self.send("final" if final else "stats", self.snapshot())

    def send(self, *message):
        try:
            self.conn.send(message)
        except (BrokenPipeError, OSError):
            self.stop.set()  # the supervisor is gone: stop cleanly
