"""Checks a capture makes before it starts anything, so that a usage or configuration error is exit status 2
with one line naming it; and the privilege drop of a worker once its sockets are open."""

import ctypes
import os
import socket

from probe.capture.afpacket import NET_RAW_HINT
from probe.errors import ConfigError

PR_SET_KEEPCAPS = 8
CAP_NET_RAW = 13
_CAP_VERSION_3 = 0x20080522


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
