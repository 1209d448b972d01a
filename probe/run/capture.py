"""A live capture run: the checks, then the supervisor and its workers (AF_PACKET rings and dnstap sockets, or DPDK
when dpdk.enabled).

dnstap sockets are served by the same worker processes as the rings: the supervisor makes the listening sockets
before it starts the workers (a server that finds no socket may never connect) and keeps them open while
workers restart; every worker accepts from them, and a producer's connection stays with the worker that took
it. Its messages go into that worker's files, beside the packets, with counters of their own (dnstap_*)."""

import dataclasses
from pathlib import Path

from probe.capture.afpacket import ip_lists_fit
from probe.capture.dnstap_listen import close_listeners, open_listeners
from probe.decode.ipfilter import IpFilter
from probe.run.checks import capture_sources, check_capture_permission, check_config, parse_coremask
from probe.run.fanout import fanout_ids
from probe.run.live_worker import LiveWorker
from probe.run.log import log
from probe.run.supervisor import Supervisor


def capture(cfg, show_status=False):
    """Run a capture until SIGINT/SIGTERM; returns (exit status, the supervisor, for its totals)."""
    check_config(cfg, "capture")
    waits = capture_sources(cfg)
    if cfg.dpdk.enabled:
        from probe.run.dpdk_worker import dpdk_supervisor  # imports nothing of DPDK's unless asked for

        supervisor = dpdk_supervisor(cfg, show_status)
        return supervisor.run(), supervisor
    dnstap = [f"dnstap socket {p}" for p in (cfg.dnstap.socket,) if p]
    dnstap += [f"dnstap TCP {a}" for a in (cfg.dnstap.listen,) if a]
    cap = cfg.capture
    interfaces = cap.interfaces or ()
    cores = parse_coremask(cap.coremask)
    out_dir = Path(cfg.export.directory)
    for why in waits:
        log(f"{why}; the workers wait for it")
    # Whether an interface absent at start is waited for is decided above, once; a worker (started, or restarted
    # while an interface is away) waits for any interface that is not there or down, as for a link fault.
    cfg = dataclasses.replace(cfg, capture=dataclasses.replace(cap, wait_for_interface=True))
    if interfaces:
        check_capture_permission()
    ip_filter = IpFilter(cfg.filter)
    where = None
    if ip_filter:
        in_kernel = cap.kernel_ip_filter and interfaces and ip_lists_fit(cfg.decode.dns_ports, ip_filter)
        where = "kernel" if in_kernel and not dnstap else "workers"  # dnstap messages are filtered in the workers
        log(f"IP allow/deny lists applied in the {'kernel filter' if where == 'kernel' else 'workers'}")
    listeners = open_listeners(cfg.dnstap)
    try:
        supervisor = Supervisor(cfg, out_dir, interfaces, cores, LiveWorker, show_status=show_status,
                                ip_filter_where=where, dnstap_listeners=listeners, dnstap=dnstap,
                                fanout_ids=fanout_ids(cap, interfaces))
        return supervisor.run(), supervisor
    finally:
        close_listeners(listeners)
