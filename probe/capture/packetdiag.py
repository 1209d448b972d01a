"""The packet sockets of this network namespace and their fanout groups, as the kernel lists them
(NETLINK_SOCK_DIAG, packet_diag(7)): which interface each is bound to and which fanout group it is in.

Two captures that join one fanout group on one interface silently split its traffic between them; a capture
looks here first (probe.run.fanout)."""

import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST_DUMP = 0x301
NLMSG_ERROR, NLMSG_DONE = 2, 3
PACKET_SHOW_INFO, PACKET_SHOW_FANOUT = 0x1, 0x8
PACKET_DIAG_INFO, PACKET_DIAG_FANOUT = 0, 4
_NLMSG = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBHIIII")  # packet_diag_req: family, protocol, pad, ino, show, cookie[2]
_MSG = struct.Struct("=BBHIII")  # packet_diag_msg: family, type, num, ino, cookie[2]
_ATTR = struct.Struct("=HH")


def packet_sockets():
    """[(socket inode, interface index or 0 for none, fanout group id or None)] of this network namespace;
    OSError when the kernel cannot list them (no packet_diag)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as sock:
        req = _REQ.pack(socket.AF_PACKET, 0, 0, 0, PACKET_SHOW_INFO | PACKET_SHOW_FANOUT, 0, 0)
        sock.send(_NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, 1, 0) + req)
        found = []
        while True:
            data = sock.recv(1 << 16)
            off = 0
            while off + _NLMSG.size <= len(data):
                length, kind = _NLMSG.unpack_from(data, off)[:2]
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, off + _NLMSG.size)[0]
                    raise OSError(code, f"packet socket list: {os.strerror(code)}")
                ino = _MSG.unpack_from(data, off + _NLMSG.size)[3]
                index, fanout = 0, None
                pos = off + _NLMSG.size + _MSG.size
                while pos + _ATTR.size <= off + length:
                    alen, atype = _ATTR.unpack_from(data, pos)
                    if alen < _ATTR.size:
                        break
                    if atype == PACKET_DIAG_INFO:
                        index = struct.unpack_from("=I", data, pos + 4)[0]
                    elif atype == PACKET_DIAG_FANOUT:
                        fanout = struct.unpack_from("=I", data, pos + 4)[0] & 0xFFFF  # id | type << 16
                    pos += (alen + 3) & ~3
                found.append((ino, index, fanout))
                off += (length + 3) & ~3
            if not data:
                return found


def socket_owner(ino):
    """The process id holding the socket with this inode, or None (looked up in /proc)."""
    target = f"socket:[{ino}]"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return int(pid)
        except OSError:
            continue
    return None
