"""Live capture worker: AF_PACKET rings and dnstap sockets.

Worker (one process per core, pinned with sched_setaffinity):
  - opens one AfPacketSource (TPACKET_V3 ring, fanout group, BPF filter) per interface, and a
    DnstapSocketSource on the dnstap listening sockets the supervisor made (every worker accepts from them;
    a producer's connection stays with the worker that accepted it), then drops privileges if capture.user
    is set;
  - reads ready ring blocks and dnstap frames and feeds them to its own Pipeline, which writes its own files
    (.w<id>): packets and dnstap messages go into the same files, with separate counters;
  - on "stop": closes the kernel filter and stops accepting producers, drains what the rings and the
    connections still hold, reads the kernel's final counters, then finishes the pipeline (pending queries
    exported as query-only, files closed).
"""

import dataclasses
import os
import select
import time

from probe.capture.afpacket import AfPacketSource, RejectedCounter
from probe.capture.dnstap_socket import DnstapSocketSource
from probe.config import FilterConfig
from probe.decode.ipfilter import IpFilter
from probe.errors import DnsprobeError
from probe.run.checks import drop_privileges
from probe.run.log import log
from probe.run.pipeline import Pipeline
from probe.run.worker import STATS_PUSH_S

POLL_MS = 200  # longest wait of a worker for a ring block or a command
DRAIN_SETTLE_S = 0.02  # a stopping worker reads its rings at least this long after closing its filter
DRAIN_GRACE_S = 5.0  # ... and gives up on a block the kernel has not handed over 2 x block timeout + this later


class LiveWorker:
    def __init__(self, spec, conn, stop):
        self.spec = spec
        self.conn = conn
        self.stop = stop
        cfg = spec.cfg
        self.sources = []
        self.counters = []  # RejectedCounter per interface: worker 0 only, with the IP lists in the kernel
        in_kernel = IpFilter(cfg.filter) if spec.kernel_ip_filter else None
        self.dnstap = None
        try:
            if spec.dnstap_listeners:
                self.dnstap = DnstapSocketSource(spec.dnstap_listeners, cfg.dnstap.max_connections, log,
                                                 tag=f"w{spec.worker_id}")
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
        if self.dnstap is not None:
            self.poller.register(self.dnstap.fileno(), select.POLLIN)
        self.poller.register(conn.fileno(), select.POLLIN)
        conn.send(("ready", os.getpid()))

    def _read_ready(self):
        """Feed every ready block of every ring, and the dnstap frames that arrived, to the pipeline; True when
        there was any."""
        got = False
        for src in self.sources:
            if src.ready():
                batch = src.read(self.batch_size)
                if len(batch):
                    self.pipeline.feed(batch, src.ifname)
                got = True
        if self.dnstap is not None:
            batch = self.dnstap.read(self.batch_size)
            if batch.runs:
                self.pipeline.feed(batch, self.dnstap.name)
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
            counters = interfaces[src.name] = src.counters()
            for name in ("kernel_received", "kernel_drops", "kernel_freezes"):
                setattr(stats, name, getattr(stats, name) + counters[name])
        if self.counters:
            stats.ip_filtered = sum(c.read() for c in self.counters)
        if self.dnstap is not None:
            for name, value in self.dnstap.counters().items():
                setattr(stats, name, value)
            interfaces[self.dnstap.name] = {"producers": [c.name + ": " + c.peer for c in self.dnstap.conns.values()]}
        part = self.pipeline.summary()["part_file"]
        snapshot = {"counters": stats.as_dict(), "interfaces": interfaces, "part_file": part}
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
            log(f"worker {self.spec.worker_id}: {exc}")
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
        if self.dnstap is not None:
            batch = self.dnstap.drain()
            if batch.runs:
                self.pipeline.feed(batch, self.dnstap.name)
        closed = time.monotonic()
        while True:
            if self._read_ready():
                continue
            left = sum(src.unread() for src in self.sources)
            waited = time.monotonic() - closed
            if not left and waited >= DRAIN_SETTLE_S:
                break
            if left and waited >= self.drain_s:
                log(f"worker {self.spec.worker_id}: {left} frame(s) left in a capture ring the kernel did not "
                     f"hand over within {self.drain_s:.1f} s of the stop (counted in kernel_received, not read)")
                break
            time.sleep(0.01)
        self._push()  # final kernel counters, read before the sockets close
        self._close_sources()

    def _close_sources(self):
        for src in self.sources + self.counters:
            src.close()
        if self.dnstap is not None:
            self.dnstap.close()
