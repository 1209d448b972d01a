"""DPDK's net_af_packet device with frames as on the wire: its packet sockets replaced by ours.

The net_af_packet PMD (DPDK's driver for a kernel interface, the veth testbed's) opens one TPACKET_V2 socket per
queue pair and joins them to a PACKET_FANOUT_HASH group with PACKET_FANOUT_FLAG_DEFRAG, whatever the number of
queues: the kernel then hands IPv4 datagrams over reassembled (their lengths differ from what `dnsprobe read`
computes from the fragments) and hashes ports, so a non-first IPv6 fragment, which has none, can reach another
queue than its flow. Nothing in the device's arguments changes that.

The PMD reads its ring from memory only (its receive function never touches the socket), so the process can put
another ring where it reads: for each of the PMD's sockets, a TPACKET_V2 socket of ours with the same ring
geometry, its RX ring mapped over the PMD's mapping (its TX half made inaccessible: nothing is sent), bound to the
interface, in a PACKET_FANOUT_CBPF group hashing the IP address pair (as the AF_PACKET capture's sockets, when
there are several queues) and never with DEFRAG, then moved onto the PMD's descriptor number (dup2), which closes
the PMD's socket. This is done once the port is set up and before its queues are first read, while the PMD's
next frame is the ring's first.

The PMD's sockets are found through /proc/self: the packet sockets of this process bound to the interface, each
with a mapping of the size the device's arguments give (blocksz, framesz, framecnt, as the PMD computes it).
Anything else found (another version, another size) leaves the device as it is, with a warning.
"""

import os
import re
import socket
import stat
import struct

from probe.capture.afpacket import (
    ETH_P_ALL,
    PACKET_RX_RING,
    PACKET_STATISTICS,
    PACKET_VERSION,
    SOL_PACKET,
    attach_filter,
    detach_filter,
    join_fanout,
)
from probe.capture.bpf import reject_all_filter

TPACKET_V2 = 1
SO_DOMAIN = 39
DRIVERS = ("net_af_packet", "eth_af_packet")
_SOCKET_MAP = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) .* socket:\[(\d+)\]$")


def device_args(eal_args, name):
    """The key=value arguments of the --vdev that made device `name`, or None."""
    for i, arg in enumerate(eal_args):
        value = None
        if arg.startswith("--vdev="):
            value = arg[len("--vdev="):]
        elif arg == "--vdev" and i + 1 < len(eal_args):
            value = eal_args[i + 1]
        if value is not None:
            dev, _, rest = value.partition(",")
            if dev == name:
                return dict(kv.partition("=")[::2] for kv in rest.split(",") if kv)
    return None


def ring_geometry(args):
    """(block size, block count, frame size, frame count) as the PMD computes them from its arguments."""
    block = int(args.get("blocksz") or os.sysconf("SC_PAGE_SIZE"))
    frame = int(args.get("framesz") or 2048)
    frames = int(args.get("framecnt") or 512)
    return block, frames // (block // frame), frame, frames


def _socket_mappings():
    """{socket inode: (start, length)} of this process's mappings of sockets (packet rings)."""
    out = {}
    with open("/proc/self/maps") as fh:
        for line in fh:
            m = _SOCKET_MAP.match(line.rstrip())
            if m:
                start, end = int(m.group(1), 16), int(m.group(2), 16)
                out[int(m.group(3))] = (start, end - start)
    return out


def pmd_sockets(ifname, total):
    """[(fd, mapping address)] of the packet sockets of this process bound to ifname whose ring of `total` bytes
    is mapped, in descriptor order (the PMD's queue order)."""
    index = socket.if_nametoindex(ifname)
    maps = _socket_mappings()
    found = []
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or st.st_ino not in maps or maps[st.st_ino][1] != total:
            continue
        s = socket.socket(fileno=os.dup(fd))
        try:
            if s.getsockopt(socket.SOL_SOCKET, SO_DOMAIN) != socket.AF_PACKET:
                continue
            if s.getsockopt(SOL_PACKET, PACKET_VERSION) != TPACKET_V2:
                continue
            if socket.if_nametoindex(s.getsockname()[0]) != index:
                continue
        except OSError:
            continue
        finally:
            s.close()
        found.append((fd, maps[st.st_ino][0]))
    return found


def replace_sockets(lib, eal_args, port_name, fanout_id):
    """Replace the sockets of net_af_packet device `port_name` (see above); fanout_id: the group of its sockets
    when it has several queues (None: one queue). Returns (None, the descriptors of our sockets), or (why the
    device was left as it is, [])."""
    args = device_args(eal_args, port_name)
    if args is None or "iface" not in args:
        return f"no --vdev={port_name},iface=... among the EAL arguments", []
    ifname = args["iface"]
    block, blocks, frame, frames = ring_geometry(args)
    rx_bytes = block * blocks
    found = pmd_sockets(ifname, 2 * rx_bytes)
    want = int(args.get("qpairs") or 1)
    if len(found) != want:
        return f"found {len(found)} of its {want} packet socket(s) on {ifname}", []
    for fd, addr in found:
        ours = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: nothing until bound
        try:
            ours.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
            attach_filter(ours, reject_all_filter())  # nothing passes until it is in its fanout group
            ours.setsockopt(SOL_PACKET, PACKET_RX_RING, struct.pack("IIII", block, blocks, frame, frames))
            lib.af_packet_map(ours.fileno(), addr, rx_bytes, 2 * rx_bytes)
            ours.bind((ifname, ETH_P_ALL))
            # The PMD reads the ring from its first frame: nothing may come before the join, so the socket
            # rejects all until then, and lets all in (no filter, which takes no compiling) right after it.
            if fanout_id is None:
                detach_filter(ours)
            else:
                join_fanout(ours, ifname, fanout_id, lambda sock=ours: detach_filter(sock))
            os.dup2(ours.fileno(), fd)
        finally:
            ours.close()
    return None, [fd for fd, _ in found]


def ring_drops(fds):
    """Frames the kernel dropped since the last call because the rings of these sockets were full (the PMD's
    descriptors, now ours). The PMD counts none of them: a frame it finds no mbuf for stays in the ring, and what
    comes next is dropped there. PACKET_STATISTICS resets the kernel's counters, so each drop is counted once."""
    drops = 0
    for fd in fds:
        s = socket.socket(fileno=os.dup(fd))
        try:
            drops += struct.unpack("II", s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))[1]
        finally:
            s.close()
    return drops
