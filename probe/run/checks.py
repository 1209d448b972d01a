"""Checks `read` and `capture` make before they start anything, so that a usage or configuration error is exit
status 2 with one line naming it, and `dnsprobe config` makes the same (check_config; capture_sources: what only a
capture needs); and the privilege drop of a worker once its sockets are open."""

import os
from pathlib import Path

from export.anonymise import client_privacy
from export.base import check_output_dir
from probe.config import options
from probe.errors import ConfigError

PR_SET_KEEPCAPS = 8
CAP_NET_RAW = 13
_CAP_VERSION_3 = 0x20080522

FORMAT_NAMES = {"parquet": "Parquet", "cdns": "C-DNS"}


def check_config(cfg, command):
    """What `command` (read, capture; config: both) refuses of a configuration before it starts: an option that
    does not apply, cores this machine lacks, more read workers than cores, an output directory it cannot write, a
    key file it cannot read, a user or an interface list that cannot be."""
    check_format_options(cfg.export)
    check_output_dir(Path(cfg.export.directory))
    client_privacy(cfg.privacy)  # reads the key file: a missing or malformed one stops us here
    if command in ("read", "config"):
        read_workers(cfg.run)
    if command in ("capture", "config"):
        parse_coremask(cfg.capture.coremask)
        if cfg.capture.user:
            lookup_user(cfg.capture.user)
        check_interface_names(cfg.capture.interfaces or ())


def check_format_options(export_cfg):
    """An option of one output format set (to another value than its default) while writing the other."""
    for key, f, _ in options():
        only = f.metadata["only"]
        if only and only != export_cfg.format and getattr(export_cfg, key.split(".")[1]) != f.default:
            value = getattr(export_cfg, key.split(".")[1])
            value = list(value) if isinstance(value, tuple) else value
            raise ConfigError(f"config key '{key}': {value!r} is for {FORMAT_NAMES[only]} output (export.format "
                              f"{only}), and the output is {FORMAT_NAMES[export_cfg.format]}")


def read_workers(run_cfg):
    """(worker count, cores or None) of `dnsprobe read`: run.coremask, one worker per core, or run.workers, at most
    one per core this process may run on (more would only share the cores and write more files)."""
    if run_cfg.coremask:
        if run_cfg.workers != 1:
            raise ConfigError(f"config keys 'run.workers' ({run_cfg.workers}) and 'run.coremask' "
                              f"({run_cfg.coremask}): give one (the coremask runs one worker per core)")
        cores = parse_coremask(run_cfg.coremask, "run.coremask")
        return len(cores), cores
    available = len(os.sched_getaffinity(0))
    if run_cfg.workers > available:
        raise ConfigError(f"config key 'run.workers': {run_cfg.workers} workers, but this process may run on "
                          f"{available} core(s): give at most {available}")
    return run_cfg.workers, None


def check_interface_names(interfaces):
    if len(set(interfaces)) != len(interfaces):
        raise ConfigError(f"config key 'capture.interfaces': an interface is named twice: {list(interfaces)}")
    if "any" in interfaces:
        raise ConfigError(
            "config key 'capture.interfaces': 'any' is not supported: name each interface to capture on "
            "(-i eth0 -i eth1); every worker reads each through a ring of its own"
        )


def capture_sources(cfg):
    """What a capture checks of what it captures from, besides check_config: something to capture, dnstap not with
    DPDK, every interface there unless capture.wait_for_interface (the message names the interfaces there are, as
    tcpdump does). Returns why for each interface that will be waited for (absent, or down)."""
    # (here, as the other checks of a capture only: `read` does without the packet sockets' modules)
    from probe.capture.afpacket import InterfaceUnavailable, interface_link_type
    from probe.run.links import interface_state

    dnstap = cfg.dnstap.socket or cfg.dnstap.listen
    if cfg.dpdk.enabled:
        if dnstap:
            raise ConfigError("dnstap sockets (dnstap.socket, dnstap.listen) cannot be used with DPDK capture: run"
                              " a second dnsprobe capture for them")
        return []
    if not cfg.capture.interfaces and not dnstap:
        raise ConfigError("nothing to capture: give -i IFACE (capture.interfaces), --dnstap-socket PATH"
                          " (dnstap.socket) or --dnstap-listen HOST:PORT (dnstap.listen)")
    waits = []
    for ifname in cfg.capture.interfaces or ():
        try:
            interface_link_type(ifname)
        except InterfaceUnavailable as exc:
            if interface_state(ifname)[0] is None and not cfg.capture.wait_for_interface:
                raise ConfigError(f"{exc}; --wait-for-interface (capture.wait_for_interface: true) waits for it"
                                  ) from None
            waits.append(str(exc))
    return waits


def parse_coremask(text, key="capture.coremask"):
    """'0x3' → [0, 1]; ConfigError naming the config key for a bad mask or a core this machine lacks."""
    raw = str(text).strip()
    try:
        mask = int(raw, 16)
    except ValueError:
        raise ConfigError(f"config key '{key}': {text!r} is not a hexadecimal mask (e.g. 0x3)") from None
    if mask <= 0:
        raise ConfigError(f"config key '{key}': {text!r} names no core")
    cores = [i for i in range(mask.bit_length()) if mask >> i & 1]
    available = sorted(os.sched_getaffinity(0))
    missing = [c for c in cores if c not in available]
    if missing:
        raise ConfigError(
            f"config key '{key}': {text!r} names core(s) {', '.join(map(str, missing))}, which this "
            f"machine does not have (available: {', '.join(map(str, available))})"
        )
    return cores


def check_capture_permission():
    import socket

    from probe.capture.afpacket import NET_RAW_HINT

    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
    except PermissionError:
        raise ConfigError(f"permission denied opening a packet socket: {NET_RAW_HINT}") from None


def lookup_user(name):
    import pwd

    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"config key 'capture.user': no user {name!r} on this machine") from None


def drop_privileges(name, out_dir):
    """Switch to the user, keeping CAP_NET_RAW alone (so that a worker can open a capture socket again when an
    interface comes back: probe.run.links)."""
    import ctypes

    pw = lookup_user(name)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    libc.prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0)
    keep_only_net_raw(libc)
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {out_dir} is not writable by user {name!r} (capture.user)")


def keep_only_net_raw(libc):
    """capset(2): CAP_NET_RAW permitted and effective, nothing else (nothing when it is not permitted)."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(_CAP_VERSION_3, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0 or not data[0].permitted & 1 << CAP_NET_RAW:
        data = (Data * 2)()  # not permitted: keep nothing
    else:
        data = (Data * 2)(Data(1 << CAP_NET_RAW, 1 << CAP_NET_RAW, 0))
    libc.capset(ctypes.byref(header), data)
