"""Checks a capture makes before it starts anything, so that a usage or configuration error is exit status 2
with one line naming it; and the privilege drop of a worker once its sockets are open."""

import os
import socket

from probe.errors import ConfigError


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
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
    except PermissionError:
        raise ConfigError(
            "permission denied opening a packet socket: run as root or give the program CAP_NET_RAW"
        ) from None


def lookup_user(name):
    import pwd

    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"config key 'capture.user': no user {name!r} on this machine") from None


def drop_privileges(name, out_dir):
    pw = lookup_user(name)
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {out_dir} is not writable by user {name!r} (capture.user)")
