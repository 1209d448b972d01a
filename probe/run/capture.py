"""A live capture run: the checks, then the supervisor and its workers (AF_PACKET rings and dnstap sockets, or DPDK
when dpdk.enabled).

dnstap sockets are served by the same worker processes as the rings: the supervisor makes the listening sockets
before it starts the workers (a server that finds no socket may never connect) and keeps them open while
workers restart; every worker accepts from them, and a producer's connection stays with the worker that took
it. Its messages go into that worker's files, beside the packets, with counters of their own (dnstap_*)."""

from pathlib import Path

from export.anonymise import client_privacy
from export.base import check_output_dir
from probe.capture.afpacket import InterfaceUnavailable, interface_link_type, ip_lists_fit
from probe.capture.dnstap_listen import close_listeners, open_listeners
from probe.decode.ipfilter import IpFilter
from probe.errors import ConfigError
from probe.run.checks import check_capture_permission, lookup_user, parse_coremask
from probe.run.fanout import fanout_ids
from probe.run.live_worker import LiveWorker
from probe.run.log import log
from probe.run.supervisor import Supervisor


def capture(cfg, show_status=False):
    """Run a capture until SIGINT/SIGTERM; returns (exit status, the supervisor, for its totals)."""
    client_privacy(cfg.privacy)  # a missing or malformed key file stops us here, before any worker starts
    dnstap = [f"dnstap socket {p}" for p in (cfg.dnstap.socket,) if p]
    dnstap += [f"dnstap TCP {a}" for a in (cfg.dnstap.listen,) if a]
    if cfg.dpdk.enabled:
        if dnstap:
            raise ConfigError("dnstap sockets (dnstap.socket, dnstap.listen) cannot be used with DPDK capture: run"
                              " a second dnsprobe capture for them")
        from probe.run.dpdk_worker import dpdk_supervisor  # imports nothing of DPDK's unless asked for

        supervisor = dpdk_supervisor(cfg, show_status)
        return supervisor.run(), supervisor
    cap = cfg.capture
    if not cap.interfaces and not dnstap:
        raise ConfigError("nothing to capture: give -i IFACE (capture.interfaces), --dnstap-socket PATH"
                          " (dnstap.socket) or --dnstap-listen HOST:PORT (dnstap.listen)")
    interfaces = cap.interfaces or ()
    if len(set(interfaces)) != len(interfaces):
        raise ConfigError(f"config key 'capture.interfaces': an interface is named twice: {list(interfaces)}")
    if "any" in interfaces:
        raise ConfigError(
            "config key 'capture.interfaces': 'any' is not supported: name each interface to capture on "
            "(-i eth0 -i eth1); every worker reads each through a ring of its own"
        )
    cores = parse_coremask(cap.coremask)
    out_dir = Path(cfg.export.directory)
    check_output_dir(out_dir)
    if cap.user:
        lookup_user(cap.user)
    for ifname in interfaces:
        try:
            interface_link_type(ifname)
        except InterfaceUnavailable as exc:
            if not cap.wait_for_interface:
                raise
            log(f"{exc}; the workers wait for it (capture.wait_for_interface)")
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
