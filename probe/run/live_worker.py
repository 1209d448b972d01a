"""Live capture worker: AF_PACKET rings and dnstap sockets, the backend of the worker shell (probe.run.worker,
which handles the supervisor's commands and sends the snapshots).

Worker (one process per core, pinned with sched_setaffinity):
  - opens one AfPacketSource (TPACKET_V3 ring, fanout group, BPF filter) per interface, and a
    DnstapSocketSource on the dnstap listening sockets the supervisor made (every worker accepts from them;
    a producer's connection stays with the worker that accepted it), then drops privileges if capture.user
    is set; an interface that is absent or down is waited for (probe.run.links);
  - reads ready ring blocks and dnstap frames and feeds them to its own Pipeline, which writes its own files
    (.w<id>): packets and dnstap messages go into the same files, with separate counters; it puts its
    completed transactions in its file within export.flush_seconds (probe.run.durability);
  - a capture socket error (link down, interface removed) closes its files and waits for the interface;
  - on "stop": closes the kernel filter and stops accepting producers, drains what the rings and the
    connections still hold, finishes the pipeline (pending queries exported as query-only, files closed), then
    reads the kernel's final counters and closes its sockets.
"""

import dataclasses
import select
import time

from probe.capture.afpacket import AfPacketSource, RejectedCounter
from probe.capture.dnstap_socket import DnstapSocketSource
from probe.capture.pcapfilter import compile_filter
from probe.config import FilterConfig
from probe.decode.ipfilter import IpFilter
from probe.run.checks import drop_privileges
from probe.run.durability import FlushClock
from probe.run.links import CaptureInterface, LinkEvents
from probe.run.log import log
from probe.run.worker import WorkerShell
from probe.stats import SOCKET_COUNTERS

POLL_S = 0.2  # longest wait of a worker for a ring block or a command
DRAIN_SETTLE_S = 0.02  # a stopping worker reads its rings at least this long after closing its filter
DRAIN_GRACE_S = 5.0  # ... and gives up on a block the kernel has not handed over 2 x block timeout + this later


class LiveWorker(WorkerShell):
    """The AF_PACKET and dnstap backend of the worker shell (probe.run.worker)."""

    SOURCE = "af_packet"

    def __init__(self, spec, conn, stop):
        super().__init__(spec, conn, stop)
        cfg = spec.cfg
        self.sources = []  # the AfPacketSource of each interface that has one now
        self.counters = []  # RejectedCounter per interface: worker 0 only, with the IP lists in the kernel
        self.links = []  # CaptureInterface per interface
        self.events = None
        self.dnstap = None
        in_kernel = IpFilter(cfg.filter) if spec.kernel_ip_filter else None
        user = compile_filter(cfg.filter.expression) if cfg.filter.expression else None  # ahead of the DNS filter
        fanout = dict(zip(spec.interfaces, spec.fanout_ids, strict=True))

        def opener(ifname):
            source = AfPacketSource(ifname, cfg.capture, cfg.decode.dns_ports, fanout[ifname], in_kernel, user)
            try:
                counter = None
                if in_kernel and spec.worker_id == 0:
                    counter = RejectedCounter(ifname, cfg.decode.dns_ports, in_kernel, user)
            except BaseException:
                source.close()
                raise
            return source, counter

        try:
            if spec.dnstap_listeners:
                self.dnstap = DnstapSocketSource(spec.dnstap_listeners, cfg.dnstap.max_connections, log,
                                                 tag=f"w{spec.worker_id}")
            # Nothing that reaches the worker is rejected by the lists in the kernel: no need to check again.
            live_cfg = dataclasses.replace(cfg, filter=FilterConfig()) if in_kernel else cfg
            self.pipeline = self.new_pipeline(live_cfg, spec.worker_id)
            self.stats = self.pipeline.stats
            self.events = LinkEvents()
            for ifname in spec.interfaces:
                link = CaptureInterface(ifname, opener, spec.worker_id, self.stats,
                                        wait_line_s=cfg.capture.wait_log_interval)
                self.links.append(link)
                link.open(wait=cfg.capture.wait_for_interface)
            if cfg.capture.user:
                drop_privileges(cfg.capture.user, spec.out_dir)
        except BaseException:
            self.close()
            raise
        self.batch_size = cfg.run.batch_size
        self.drain_s = 2 * cfg.capture.block_timeout_ms / 1000 + DRAIN_GRACE_S
        self.flush_clock = FlushClock(cfg.export.flush_seconds)
        self.poller = select.poll()
        self.poller.register(conn.fileno(), select.POLLIN)
        self.poller.register(self.events.fileno(), select.POLLIN)
        if self.dnstap is not None:
            self.poller.register(self.dnstap.fileno(), select.POLLIN)
        self.by_fd = {}
        self._refresh()

    def _refresh(self):
        """The sources and counters of the interfaces that have a socket now, in the poll set."""
        for fd in self.by_fd:
            self.poller.unregister(fd)
        self.sources = [link.source for link in self.links if link.source is not None]
        self.counters = [link.counter for link in self.links if link.counter is not None]
        self.by_fd = {link.source.fileno(): link for link in self.links if link.source is not None}
        for fd in self.by_fd:
            self.poller.register(fd, select.POLLIN | select.POLLERR)

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

    def step(self):
        if not self._read_ready():
            self._poll(self.flush_clock.timeout(time.monotonic(), POLL_S))
        if self.flush_clock.due(self.pipeline, time.monotonic()):
            self.pipeline.flush()
            self.flush_clock.flushed()

    def interfaces(self, stats):
        """The kernel's counters of every interface (summed into stats), and the dnstap producers."""
        for name in SOCKET_COUNTERS:
            setattr(stats, name, 0)
        interfaces = {}
        for link in self.links:
            counters = interfaces[link.ifname] = link.counters()
            for name in SOCKET_COUNTERS:
                setattr(stats, name, getattr(stats, name) + counters[name])
        if self.spec.kernel_ip_filter and self.spec.worker_id == 0:
            stats.ip_filtered = sum(link.rejected() for link in self.links)
        if self.dnstap is not None:
            for name, value in self.dnstap.counters().items():
                setattr(stats, name, value)
            interfaces[self.dnstap.name] = {"producers": self.dnstap.producers()}
        return interfaces

    def _poll(self, timeout_s):
        """Wait for a ring block, a command or a link notification; handle socket errors and link changes."""
        events = self.poller.poll(timeout_s * 1000)
        faults = [self.by_fd[fd] for fd, ev in events if ev & select.POLLERR and fd in self.by_fd]
        woken = any(fd == self.events.fileno() for fd, _ in events)
        if woken:
            self.events.drain()
        if faults:
            self._read_ready()  # what the rings hold goes with the files being closed
            if any([link.check_fault() for link in faults]):
                self.pipeline.rotate()  # close the files: readable now, whatever the wait brings
        now = time.monotonic()
        changed = [link.retry(now, woken, self.drain_s) for link in self.links]
        if any(changed):
            self._refresh()

    def drain(self):
        self._drain()
        self.pipeline.finish()

    def _drain(self):
        """Stop letting frames in, then read what the rings still hold (a partly filled block is handed
        over by the kernel after block_timeout_ms); the kernel's final counters are read by the last snapshot
        before the sockets close (WorkerShell.stopped).

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

    def close(self):
        for link in self.links:
            link.close()
        for src in self.sources + self.counters:  # (closing twice does nothing)
            src.close()
        if self.events is not None:
            self.events.close()
            self.events = None
        if self.dnstap is not None:
            self.dnstap.close()
