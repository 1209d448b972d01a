"""`dnsprobe capture --dpdk`: live capture from a DPDK port, under the same supervisor as AF_PACKET.

One process per core of capture.coremask (DPDK multi-process, probe.capture.dpdk): worker 0 is the primary, which
owns the EAL's memory and the port; workers 1..N-1 are secondaries attached to it. Each reads its share of the
frames (its own RX queue where the device hashes the IP addresses; else the ring the primary fills for it by the
flow hash of the address pair) straight from the mbufs into its own Pipeline, which writes its own files
(NAME.w<id>), and frees the mbufs once the pipeline has taken the batch. No process shares a GIL with another.
Each worker kind is a backend of the worker shell (probe.run.worker: the supervisor's commands, the snapshots).

The supervisor starts the primary first and the secondaries once it is ready (DpdkGroup.LEADER). A stop goes
in order: the primary reads what the port still holds (passing the others' frames to their rings), finishes its
pipeline and says so ("drained"); the secondaries then read their rings empty, finish and exit; the primary,
told to "close", stops and closes the port and cleans up the EAL. A secondary that dies is restarted alone and
attaches again (its ring kept what came meanwhile; the mbufs of the batch it held are lost to the pool). A
primary that dies takes the secondaries with it: they are stopped (their files finished), and the group starts
again with a fresh EAL (a new file prefix; the old one's runtime and hugepage files removed).

Secondary processes attach to the primary's hugepage files, so this shape needs hugepages. With --no-huge (or
--in-memory) and several cores, ONE worker process owns the EAL and the port and runs one thread per queue
(DpdkThreadsWorker): the C poll releases the GIL, decoding does not, so there the cores add receive capacity
more than decoding capacity. With one core, the primary alone runs either way.
"""

import os
import threading
import time
from pathlib import Path

from export.base import check_output_dir
from probe.capture.dpdk import (
    DpdkPort,
    DpdkSecondary,
    DpdkSource,
    eal_args,
    given_prefix,
    load,
    multi_process,
    remove_runtime_files,
)
from probe.decode.ipfilter import IpFilter
from probe.errors import ConfigError, DnsprobeError
from probe.run.checks import parse_coremask
from probe.run.durability import FlushClock
from probe.run.fanout import fanout_ids
from probe.run.supervisor import Supervisor
from probe.run.worker import WorkerShell

POLL_US = 200_000  # longest wait of a poll for frames (the worker then checks for commands, stop and rotation)
DRAIN_US = 20_000  # on stop: a source is drained when a poll this long returns nothing
DRAIN_MAX_S = 1.0  # ... or after this long
DPDK_COUNTERS = {"ipackets": "dpdk_ipackets", "imissed": "dpdk_imissed", "ierrors": "dpdk_ierrors",
                 "rx_nombuf": "dpdk_rx_nombuf"}


def _cores(cfg):
    """The cores of capture.coremask (checked by the supervisor: a worker, pinned to one core, cannot check it)."""
    mask = int(cfg.capture.coremask, 16)
    return [c for c in range(mask.bit_length()) if mask >> c & 1]


def _fanout_id(cfg):
    """The fanout group of the net_af_packet device's sockets when it has several queues (one that no other
    capture on the interface uses)."""
    return lambda ifname: fanout_ids(cfg.capture, [ifname])[0]


def _port_interface(port, port_stats, queues):
    """What a snapshot says of a port: its counters, driver, mode and hashing, and the queues read here."""
    return {**port_stats, "driver": port.info["driver"], "mode": port.mode, "rss_hash_functions": port.rss,
            "frames_as_on_wire": port.frames_as_on_wire, "queues": queues}


def _queue(reader, core):
    """What a snapshot says of a queue (or ring) read here."""
    return {reader.source.name: {"frames": reader.source.frames, "core": core}}


def _count_port(stats, port_stats):
    for name, counter in DPDK_COUNTERS.items():
        setattr(stats, counter, port_stats[name])


class _Reader:
    """One source into one pipeline: read a batch, feed it, free its mbufs; flush on time."""

    def __init__(self, source, pipeline, batch_size):
        self.source = source
        self.pipeline = pipeline
        self.batch_size = batch_size
        self.flush_clock = FlushClock(pipeline.cfg.export.flush_seconds)

    def step(self, timeout_us):
        batch = self.source.read(self.batch_size, timeout_us)
        n = len(batch)
        try:
            if n:
                self.pipeline.feed(batch, self.source.name)
        finally:
            self.source.release(batch)
        if self.flush_clock.due(self.pipeline, time.monotonic()):
            self.pipeline.flush()
            self.flush_clock.flushed()
        return n

    def drain(self):
        """Read what the source still holds: until a poll of DRAIN_US finds nothing, for DRAIN_MAX_S at most (a
        source that never runs dry: the frames then left are counted by the port, not read), then finish the
        pipeline."""
        end = time.monotonic() + DRAIN_MAX_S
        while self.step(DRAIN_US) and time.monotonic() < end:
            pass
        self.pipeline.finish()


# ---------------------------------------------------------------------------------------------
# One process per core


class _ProcessWorker(WorkerShell):
    """A worker process of the multi-process shape: one source, one pipeline, in the main thread."""

    SOURCE = "dpdk"

    def _start(self, source):
        """The pipeline and its reader of `source`, once the EAL is up."""
        cfg = self.spec.cfg
        self.reader = _Reader(source, self.new_pipeline(cfg, self.spec.worker_id), cfg.run.batch_size)

    def _args(self, proc_type):
        cfg = self.spec.cfg
        return eal_args(cfg.dpdk, None, core=self.spec.core, proc_type=proc_type, prefix=self.spec.group)

    def step(self):
        self.reader.step(POLL_US)

    def drain(self):
        self.reader.drain()


class DpdkPrimaryWorker(_ProcessWorker):
    """Worker 0: the EAL's primary process, which owns the port (and, distributing, the workers' rings)."""

    def __init__(self, spec, conn, stop):
        super().__init__(spec, conn, stop)
        cfg = spec.cfg
        self.port = DpdkPort(cfg.dpdk, self._args("primary"), workers=len(_cores(cfg)),
                             fanout_id=_fanout_id(cfg), batch_size=cfg.run.batch_size)
        try:
            poller = self.port.pollers()[0]
            queues = self.port.queues if self.port.mode != "rss" else 1
            name = f"{self.port.name}/q0" if queues == 1 else f"{self.port.name}/q0-{queues - 1}"
            self._start(DpdkSource(poller, name, cfg.dpdk.batch_timeout_ms))
        except BaseException:
            self.port.close()
            raise
        self.last_port = dict.fromkeys(DPDK_COUNTERS, 0)
        self.last_rings = []

    def interfaces(self, stats):
        port = self.port
        if port.started:
            self.last_port, self.last_rings = port.stats(), port.ring_stats()
        _count_port(stats, self.last_port)
        stats.dpdk_ring_full = sum(full for _, full, _ in self.last_rings)
        rings = {f"w{k}": {"passed": passed, "ring_full": full, "waiting": waiting}
                 for k, (passed, full, waiting) in enumerate(self.last_rings, 1)}
        interface = _port_interface(port, self.last_port, _queue(self.reader, self.spec.core))
        return {port.name: {**interface, **({"rings": rings} if rings else {})}}

    def stopped(self):
        """The pipeline is finished: say so, wait until the secondaries are gone ("close"), close the port."""
        self.push()
        self.send("drained")
        while not self.commands(wait=1.0):
            pass
        return super().stopped()

    def close(self):
        self.port.close()


class DpdkSecondaryWorker(_ProcessWorker):
    """Workers 1..N-1: secondary processes reading their ring (or RX queue)."""

    def __init__(self, spec, conn, stop):
        super().__init__(spec, conn, stop)
        cfg = spec.cfg
        self.eal = DpdkSecondary(cfg.dpdk, self._args("secondary"), spec.worker_id)
        try:
            name = f"{self.eal.name}/{'w' if self.eal.mode == 'distributor' else 'q'}{spec.worker_id}"
            self._start(DpdkSource(self.eal.poller, name, cfg.dpdk.batch_timeout_ms))
        except BaseException:
            self.eal.close()
            raise

    def interfaces(self, stats):
        return {self.eal.name: {"mode": self.eal.mode, "queues": _queue(self.reader, self.spec.core)}}

    def close(self):
        self.eal.close()


class DpdkGroup:
    """The supervisor's worker class for the multi-process shape: worker 0 the primary, the others secondaries."""

    SOURCE = "dpdk"  # the counters that apply (probe.stats.applicable)
    LEADER = True  # worker 0 starts first and stops last, and the others stop and start again with it

    def __new__(cls, spec, conn, stop):
        return (DpdkPrimaryWorker if spec.worker_id == 0 else DpdkSecondaryWorker)(spec, conn, stop)

    @staticmethod
    def group_ended(cfg, group):
        """Every process of that start of the group has exited: remove what its EAL left."""
        remove_runtime_files(given_prefix(cfg.dpdk) or group)


# ---------------------------------------------------------------------------------------------
# One process, one thread per queue (no hugepages)


class _QueueThread(threading.Thread):
    """Reads one RX queue into its own Pipeline, on its own core."""

    def __init__(self, reader, core):
        super().__init__(name=f"dnsprobe-{reader.source.name}", daemon=True)
        self.reader = reader
        self.core = core
        self.stopping = threading.Event()
        self.rotations = 0  # asked for by the worker's main thread
        self.rotated = 0
        self.error = None

    def run(self):
        try:
            os.sched_setaffinity(0, {self.core})  # 0: this thread
            while not self.stopping.is_set():
                if self.rotated != self.rotations:
                    self.rotated = self.rotations
                    self.reader.pipeline.rotate()
                self.reader.step(POLL_US)
            self.reader.drain()
        except DnsprobeError as exc:
            self.error = exc
        except Exception as exc:  # reported by the worker, which then stops
            self.error = DnsprobeError(f"{self.name}: {type(exc).__name__}: {exc}")


class DpdkThreadsWorker(WorkerShell):
    """The one worker process of a DPDK capture without hugepages: one thread per queue, each with its own
    pipeline; the main thread obeys the supervisor and reports for all of them."""

    SOURCE = "dpdk"

    def __init__(self, spec, conn, stop):
        super().__init__(spec, conn, stop)
        cfg = spec.cfg
        cores = _cores(cfg)
        self.port = DpdkPort(cfg.dpdk, eal_args(cfg.dpdk, cfg.capture.coremask), queues=len(cores), workers=len(cores),
                             fanout_id=_fanout_id(cfg), batch_size=cfg.run.batch_size)
        try:
            self.threads = [
                _QueueThread(_Reader(DpdkSource(poller, f"{self.port.name}/q{q}", cfg.dpdk.batch_timeout_ms),
                                     self.new_pipeline(cfg, q), cfg.run.batch_size), core)
                for q, (poller, core) in enumerate(zip(self.port.pollers(), cores, strict=True))
            ]
        except BaseException:
            self.port.close()
            raise
        self.last_port = dict.fromkeys(DPDK_COUNTERS, 0)
        for t in self.threads:
            t.start()

    def step(self):
        """The threads read; the main thread waits for a command, and stops when a thread failed."""
        self.conn.poll(POLL_US / 1e6)
        self._raise_failure()

    def _raise_failure(self):
        for t in self.threads:
            if t.error:
                raise t.error

    def rotate(self):
        for t in self.threads:  # each thread rotates its own pipeline, between two of its reads
            t.rotations += 1

    def drain(self):
        """Each thread reads what its queue still holds and finishes its pipeline."""
        self._stop_threads()
        self._raise_failure()

    def _stop_threads(self):
        for t in self.threads:
            t.stopping.set()
        for t in self.threads:
            t.join()

    def interfaces(self, stats):
        if self.port.started:
            self.last_port = self.port.stats()
        _count_port(stats, self.last_port)
        queues = {name: queue for t in self.threads for name, queue in _queue(t.reader, t.core).items()}
        return {self.port.name: _port_interface(self.port, self.last_port, queues)}

    def close(self):
        self._stop_threads()  # (after a failure: the other threads finish their pipelines)
        self.port.close()


def dpdk_supervisor(cfg, show_status):
    """The checks of `dnsprobe capture --dpdk`, then the supervisor with its DPDK worker process(es)."""
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
    if len(cores) > 1 and not multi_process(cfg.dpdk):
        label = (f"DPDK port {cfg.dpdk.port} ({len(cores)} RX queues, one thread each on cores {cap.coremask}, in "
                 "one process: no hugepages for several)")
        return Supervisor(cfg, out_dir, [label], cores[:1], DpdkThreadsWorker, show_status=show_status,
                          ip_filter_where=where)
    label = f"DPDK port {cfg.dpdk.port} ({len(cores)} process(es) on core(s) {cap.coremask})"
    return Supervisor(cfg, out_dir, [label], cores, DpdkGroup, show_status=show_status, ip_filter_where=where)
