"""`dnsprobe capture --dpdk`: live capture from a DPDK port, under the same supervisor as AF_PACKET.

DPDK's EAL can be initialised once per process, and a port's queues belong to the process that set it up
(sharing them across processes needs DPDK's multi-process mode, which needs hugepages and so cannot run with
--no-huge). So the supervisor starts ONE worker process, which owns the EAL and the port, and that process runs
one thread per core of capture.coremask, each pinned to its core and reading its own RX queue (symmetric RSS
keeps both directions of a flow on one queue) into its own Pipeline, which writes its own files
(NAME.w<queue>). The C call that polls a queue releases the GIL, so queues are polled in parallel; decoding
runs under the GIL, so on this design the cores add capture capacity (rings drained in parallel) more than
decoding capacity. The supervisor still gives the statistics file, Prometheus, rotation (wall clock and
SIGHUP), SIGINT/SIGTERM stop, and a restart (with a fresh EAL) if the worker process dies.
"""

import dataclasses
import os
import threading
import time
from pathlib import Path

from export.base import check_output_dir
from probe.capture.dpdk import DpdkPort, DpdkQueueSource, eal_args, load
from probe.decode.ipfilter import IpFilter
from probe.errors import ConfigError, DnsprobeError
from probe.run.checks import parse_coremask
from probe.run.durability import FileReport, FlushClock
from probe.run.log import log
from probe.run.pipeline import Pipeline
from probe.run.supervisor import Supervisor
from probe.run.worker import STATS_PUSH_S
from probe.stats import Stats

POLL_US = 200_000  # longest wait of a queue thread in C for frames (it also checks for stop and rotation)
DRAIN_US = 20_000  # on stop: the queue is drained when a poll this long returns nothing
DPDK_COUNTERS = {"ipackets": "dpdk_ipackets", "imissed": "dpdk_imissed", "ierrors": "dpdk_ierrors",
                 "rx_nombuf": "dpdk_rx_nombuf"}


class _QueueThread(threading.Thread):
    """Reads one RX queue into its own Pipeline, on its own core."""

    def __init__(self, source, pipeline, core, batch_size):
        super().__init__(name=f"dnsprobe-{source.name}", daemon=True)
        self.source = source
        self.pipeline = pipeline
        self.core = core
        self.batch_size = batch_size
        self.stopping = threading.Event()
        self.rotations = 0  # asked for by the worker's main thread
        self.rotated = 0
        self.error = None
        self.done = False
        self.flush_clock = FlushClock(pipeline.cfg.export.flush_seconds)

    def _feed(self, timeout_us):
        batch = self.source.read(self.batch_size, timeout_us)
        if len(batch):
            self.pipeline.feed(batch, self.source.name)
        return len(batch)

    def run(self):
        try:
            os.sched_setaffinity(0, {self.core})  # 0: this thread
            while not self.stopping.is_set():
                if self.rotated != self.rotations:
                    self.rotated = self.rotations
                    self.pipeline.rotate()
                self._feed(POLL_US)
                if self.flush_clock.due(self.pipeline, time.monotonic()):
                    self.pipeline.flush()
                    self.flush_clock.flushed()
            while self._feed(DRAIN_US):  # what the queue still holds
                pass
            self.pipeline.finish()
        except DnsprobeError as exc:
            self.error = exc
        except Exception as exc:  # reported by the worker, which then stops
            self.error = DnsprobeError(f"{self.name}: {type(exc).__name__}: {exc}")
        self.done = True


class DpdkWorker:
    """The one worker process of a DPDK capture (probe.run.worker.worker_main runs it)."""

    SOURCE = "dpdk"  # the counters that apply (probe.stats.applicable)

    def __init__(self, spec, conn, stop):
        self.spec, self.conn, self.stop = spec, conn, stop
        cfg = spec.cfg
        mask = int(cfg.capture.coremask, 16)  # checked by the supervisor (this process is pinned to one core now)
        cores = [c for c in range(mask.bit_length()) if mask >> c & 1]
        self.port = DpdkPort(cfg.dpdk, cfg.capture.coremask, len(cores))
        self.last_port_stats = dict.fromkeys(DPDK_COUNTERS, 0)
        try:
            # Time rotation is the supervisor's (wall clock, all workers together), not the pipeline's.
            live_cfg = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, rotate_seconds=0))
            self.threads = [
                _QueueThread(DpdkQueueSource(self.port, q), Pipeline(live_cfg, spec.out_dir, q, live=True), core,
                             cfg.run.batch_size)
                for q, core in enumerate(cores)
            ]
        except BaseException:
            self.port.close()
            raise
        self.files = FileReport([t.pipeline for t in self.threads])
        self.dns = None
        if spec.dns_metrics:
            from export.metrics import DnsMetrics

            self.dns = [DnsMetrics() for _ in self.threads]
            for t, metrics in zip(self.threads, self.dns):
                t.pipeline.count_dns(metrics)
        conn.send(("ready", os.getpid()))

    def _commands(self):
        try:
            while self.conn.poll(0.2):
                cmd = self.conn.recv()
                if cmd == "rotate":
                    for t in self.threads:
                        t.rotations += 1
                elif cmd == "stop":
                    self.stop.set()
                    return
        except (EOFError, OSError):
            self.stop.set()  # the supervisor is gone: stop cleanly

    def _push(self, final=False):
        total = Stats()
        for t in self.threads:
            total.add(t.pipeline.stats)
        port = self.port.stats() if self.port.started else self.last_port_stats
        self.last_port_stats = port
        for name, counter in DPDK_COUNTERS.items():
            setattr(total, counter, port[name])
        queues = {t.source.name: {"frames": t.source.frames, "core": t.core} for t in self.threads}
        interfaces = {self.port.name: {**port, "driver": self.port.info["driver"], "rss_hash_functions": self.port.rss,
                                       "queues": queues}}
        part = [p for p in (t.pipeline.summary()["part_file"] for t in self.threads) if p]
        snapshot = {"counters": total.as_dict(), "interfaces": interfaces, "part_file": ", ".join(part) or None,
                    **self.files.snapshot()}
        if self.dns is not None:
            from export.metrics import DnsMetrics

            dns = DnsMetrics()
            for metrics in self.dns:
                dns.add_dict(metrics.as_dict())
            snapshot["dns"] = dns.as_dict()
        try:
            self.conn.send(("final" if final else "stats", snapshot))
        except (BrokenPipeError, OSError):
            self.stop.set()

    def run(self):
        for t in self.threads:
            t.start()
        next_push = time.monotonic() + STATS_PUSH_S
        status = 0
        while not self.stop.is_set():
            self._commands()
            failed = [t for t in self.threads if t.error]
            if failed:
                log(f"worker {self.spec.worker_id}: {failed[0].error}")
                status = failed[0].error.exit_status
                break
            if time.monotonic() >= next_push:
                self._push()
                next_push = time.monotonic() + STATS_PUSH_S
        for t in self.threads:
            t.stopping.set()
        for t in self.threads:
            t.join()
            if t.error and not status:
                log(f"worker {self.spec.worker_id}: {t.error}")
                status = t.error.exit_status
        self._push()  # the port's final counters, read before it stops
        self.port.close()
        if not status:
            self._push(final=True)
        return status


def dpdk_supervisor(cfg, show_status):
    """The checks of `dnsprobe capture --dpdk`, then the supervisor with its one DPDK worker process."""
    load()  # not built: say so now
    cap = cfg.capture
    if cap.interfaces:
        raise ConfigError(
            "capture.interfaces (-i) cannot be used with DPDK: it captures from the port dpdk.port (a PCI device "
            "bound to DPDK, or a --vdev in dpdk.args)"
        )
    if cap.user:
        raise ConfigError("config key 'capture.user': not supported with DPDK (the worker must keep its privileges)")
    cores = parse_coremask(cap.coremask)
    eal_args(cfg.dpdk, cap.coremask)  # a malformed dpdk.args stops us here
    out_dir = Path(cfg.export.directory)
    check_output_dir(out_dir)
    where = "workers" if IpFilter(cfg.filter) else None
    label = f"DPDK port {cfg.dpdk.port} ({len(cores)} RX queue(s), one thread each on core(s) {cap.coremask})"
    return Supervisor(cfg, out_dir, [label], cores[:1], DpdkWorker, show_status=show_status, ip_filter_where=where)
