"""What every capture worker process shares, whatever its backend: its specification, its entry point, and
the timing constants of its loop. The backends: probe.run.live_worker, probe.run.dpdk_worker."""

import dataclasses
import os
import signal
import sys
import threading
from pathlib import Path

from probe.errors import DnsprobeError

STATS_PUSH_S = 1.0  # how often a worker sends its counters to the supervisor


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
    group: str = ""  # the name the workers of one start of a led group share (DPDK: the EAL's file prefix)


def set_parent_death_signal():
    """Be told (SIGTERM, a clean stop) if the supervisor disappears without stopping us."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_main(spec, conn, inherited, worker_class=None):
    """Entry point of a worker process (forked by the supervisor): pins it, then runs worker_class(spec, conn, stop)
    (probe.run.live_worker.LiveWorker, probe.run.dpdk_worker.DpdkWorker)."""
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
    status = worker.run()
    sys.exit(status)
