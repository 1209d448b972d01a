"""A live capture run: the checks, then the supervisor and its workers (AF_PACKET, or DPDK when dpdk.enabled)."""

from pathlib import Path

from export.anonymise import client_privacy
from export.base import check_output_dir
from probe.capture.afpacket import interface_link_type, ip_lists_fit
from probe.decode.ipfilter import IpFilter
from probe.errors import ConfigError
from probe.run.afpacket_worker import AfPacketWorker
from probe.run.checks import check_capture_permission, lookup_user, parse_coremask
from probe.run.log import log
from probe.run.supervisor import Supervisor


def capture(cfg, show_status=False):
    """Run a capture until SIGINT/SIGTERM; returns (exit status, the supervisor, for its totals)."""
    client_privacy(cfg.privacy)  # a missing or malformed key file stops us here, before any worker starts
    if cfg.dpdk.enabled:
        from probe.run.dpdk_worker import dpdk_supervisor  # imports nothing of DPDK's unless asked for

        supervisor = dpdk_supervisor(cfg, show_status)
        return supervisor.run(), supervisor
    cap = cfg.capture
    if not cap.interfaces:
        raise ConfigError("no interface to capture on: give -i IFACE or set capture.interfaces")
    if len(set(cap.interfaces)) != len(cap.interfaces):
        raise ConfigError(f"config key 'capture.interfaces': an interface is named twice: {list(cap.interfaces)}")
    cores = parse_coremask(cap.coremask)
    out_dir = Path(cfg.export.directory)
    check_output_dir(out_dir)
    if cap.user:
        lookup_user(cap.user)
    for ifname in cap.interfaces:
        interface_link_type(ifname)
    check_capture_permission()
    ip_filter = IpFilter(cfg.filter)
    where = None
    if ip_filter:
        where = "kernel" if cap.kernel_ip_filter and ip_lists_fit(cfg.decode.dns_ports, ip_filter) else "workers"
        log(f"IP allow/deny lists applied in the {'kernel filter' if where == 'kernel' else 'workers'}")
    supervisor = Supervisor(cfg, out_dir, cap.interfaces, cores, AfPacketWorker, show_status=show_status,
                            ip_filter_where=where)
    return supervisor.run(), supervisor
