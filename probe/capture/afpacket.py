"""Live capture source: an AF_PACKET socket with a TPACKET_V3 memory-mapped receive ring.

One `AfPacketSource` is one socket on one interface, owned by one worker process:

- PACKET_VERSION TPACKET_V3 and PACKET_RX_RING: the kernel writes frames into blocks of a ring shared
  with us by mmap. A block is handed to user space when it is full or `block_timeout_ms` after its
  first frame. We copy a ready block out in one piece, hand it straight back to the kernel and walk its
  tpacket3_hdr entries (in C, probe/capture/_ring.c, into packed frames): no system call per packet, and the
  ring is free again as early as possible. Timestamps (tp_sec, tp_nsec) and wire lengths (tp_len) come from
  the ring.
- PACKET_FANOUT with PACKET_FANOUT_CBPF: the sockets of all workers on one interface form a group, and the
  kernel runs a classic BPF program (probe.capture.bpf.fanout_program) that hashes a frame's IP address pair,
  the one thing every packet of a flow has in common: a query and its response, every fragment of a
  datagram (IPv4 and IPv6: no ports after the first) and a whole TCP connection reach the same worker, which
  reassembles fragments itself, as `dnsprobe read` does (no PACKET_FANOUT_FLAG_DEFRAG: the frames stay as on
  the wire). It is the hash `dnsprobe read --workers` splits by. The price: all traffic between one client
  and one server goes to one worker (even at a resolver with many clients, uneven behind one forwarder).
- SO_ATTACH_FILTER: a classic BPF program (probe.capture.bpf.dns_filter) keeps in the kernel only UDP and
  TCP on the DNS ports (also behind one or two VLAN tags and IPv6 extension headers) and fragments of UDP/TCP
  datagrams. Everything else
  never reaches the ring, so it is not counted anywhere: the filter is the definition of what is
  captured. The IP allow/deny lists (filter.*) can be compiled into it too; what they reject is then
  counted by a RejectedCounter socket whose filter keeps exactly that.
- PACKET_STATISTICS: frames the filter passed (drops included), frames dropped because the ring was
  full, and ring freezes. Reading resets the kernel's counters; we accumulate them.

Frames whose VLAN tag the kernel took off (VLAN offload) get the tag put back, as libpcap does, so
the decoder sees the frame as it was on the wire.
"""

import ctypes
import errno
import mmap
import os
import socket
import struct
from pathlib import Path

from probe.capture.bpf import dns_filter, fanout_program, reject_all_filter
from probe.errors import ConfigError, DnsprobeError
from probe.model import LINKTYPE_ETHERNET, FrameBatch
from probe.native import load

_ring = load("probe.capture._ring")
_records = load("probe._records")
if _records is None:
    _ring = None  # (it could not be imported without it anyway)

# <linux/if_packet.h>, <linux/if_ether.h>, <asm-generic/socket.h>
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_FANOUT = 18
TPACKET_V3 = 2
PACKET_MR_PROMISC = 1
PACKET_FANOUT_CBPF = 6
PACKET_FANOUT_DATA = 22
ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27

TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6

ARPHRD_ETHER = 1
ARPHRD_LOOPBACK = 772

# tpacket_block_desc: version, offset_to_priv, then tpacket_hdr_v1: block_status, num_pkts,
# offset_to_first_pkt, blk_len, seq_num, ts_first_pkt, ts_last_pkt.
_BLOCK_STATUS = 8
_BLOCK_HDR = struct.Struct("<IIIIQ")  # block_status, num_pkts, offset_to_first_pkt, blk_len, seq_num (at 8)
# tpacket3_hdr: tp_next_offset, tp_sec, tp_nsec, tp_snaplen, tp_len, tp_status, tp_mac, tp_net,
# hv1: tp_rxhash, tp_vlan_tci, tp_vlan_tpid.
_FRAME_HDR = struct.Struct("<IIIIIIHHIIH")
_TPACKET_REQ3 = struct.Struct("IIIIIII")
_STATS_V3 = struct.Struct("III")
_FRAME_SIZE = 2048  # only a sanity unit for the kernel in V3: frames are packed, not slotted

# How to give dnsprobe the capability it needs without root. dnsprobe runs in the Python interpreter, and file
# capabilities (setcap) would have to be set on the interpreter, giving them to every Python program.
NET_RAW_HINT = (
    "run as root, or give the process CAP_NET_RAW as an ambient capability: under systemd "
    "AmbientCapabilities=CAP_NET_RAW (contrib/dnsprobe@.service), by hand as root `setpriv --reuid USER --regid "
    "GROUP --init-groups --inh-caps +net_raw --ambient-caps +net_raw dnsprobe capture ...` (not setcap on the "
    "Python interpreter, which would give it to every Python program)"
)


class InterfaceUnavailable(ConfigError):
    """The interface does not exist or is down: a capture may wait for it (capture.wait_for_interface)."""


class SockFprog:
    """A program as the struct sock_fprog the kernel takes (`value`), with the instructions it points at."""

    def __init__(self, program):
        raw = b"".join(struct.pack("HBBI", code, jt, jf, k) for code, jt, jf, k in program)
        self.buf = ctypes.create_string_buffer(raw, len(raw))  # kept alive as long as value is used
        self.value = struct.pack("HxxxxxxP" if struct.calcsize("P") == 8 else "HxxP", len(program),
                                 ctypes.addressof(self.buf))


def attach_filter(sock, program, level=socket.SOL_SOCKET, option=SO_ATTACH_FILTER):
    """SO_ATTACH_FILTER (or another option taking a program) with a struct sock_fprog pointing at the program's
    instructions."""
    fprog = SockFprog(program)  # (held while the kernel copies the instructions it points at)
    sock.setsockopt(level, option, fprog.value)


def detach_filter(sock):
    """SO_DETACH_FILTER: every frame passes (at once: there is no program to compile)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)


# ---------------------------------------------------------------------------------------------


def _bind(sock, name):
    try:
        sock.bind((name, ETH_P_ALL))
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            raise InterfaceUnavailable(f"interface {name!r} does not exist") from None
        if exc.errno == errno.ENETDOWN:
            raise InterfaceUnavailable(f"interface {name!r} is down") from None
        raise ConfigError(f"cannot bind a packet socket to {name!r}: {exc.strerror}") from None


def join_fanout(sock, name, fanout_id, after_join=None):
    """Join the bound socket to the PACKET_FANOUT_CBPF group fanout_id, then set the group's program, the
    address-pair hash (bpf.fanout_program; each member sets it, the same one). Returns what after_join()
    returns (None without it), called right after the join, before the group program's RCU wait.

    From the join on the group hands the socket its share, so its own filter must be in place by then; but
    attaching a filter compiles it (checks, JIT), long enough for frames to come, and a socket that got its
    filter only after the join dropped its share of them, uncounted. So AfPacketSource attaches its
    filter before the bind, and sets aside (counted) what the socket received from the bind to the join,
    which the group's other members had too; after_join counts it in the ring. A group's first member has no
    group program until it sets it: the kernel hands it every frame, which is its share."""
    arg = (fanout_id & 0xFFFF) | (PACKET_FANOUT_CBPF << 16)
    try:
        sock.setsockopt(SOL_PACKET, PACKET_FANOUT, struct.pack("I", arg))
        counted = after_join() if after_join is not None else None
        attach_filter(sock, fanout_program(), SOL_PACKET, PACKET_FANOUT_DATA)
    except OSError as exc:
        raise ConfigError(
            f"interface {name!r}: cannot join packet fanout group {fanout_id} ({exc.strerror}); another "
            "capture may use that group id: set capture.fanout_group"
        ) from None
    return counted


def ip_lists_fit(dns_ports, ip_filter, user_program=None):
    """True when the IP lists of ip_filter fit in the kernel filter with the DNS ports (and the user's program)."""
    try:
        dns_filter(dns_ports, skip_outgoing=True, ip_filter=ip_filter, user_program=user_program)
        dns_filter(dns_ports, skip_outgoing=True, ip_filter=ip_filter, invert_ip_filter=True,
                   user_program=user_program)
    except ValueError:
        return False
    return True


class RejectedCounter:
    """Counts in the kernel the frames that the IP lists reject, when the lists are in the kernel filter.

    A packet socket that is never read: its filter keeps exactly the DNS frames the lists reject (the
    capture sockets' filter minus the lists), its receive buffer is the kernel's minimum, and
    PACKET_STATISTICS counts every frame the filter passed, queued or dropped: every fragment of a datagram,
    as the worker's own lists count the fragments they drop. It is in no fanout group, so it sees every frame
    of the interface, and one worker only has it.
    """

    def __init__(self, ifname, dns_ports, ip_filter, user_program=None):
        self.ifname = ifname
        self.count = 0
        link = interface_link_type(ifname)
        program = dns_filter(
            dns_ports, skip_outgoing=link == ARPHRD_LOOPBACK, snaplen=64, ip_filter=ip_filter, invert_ip_filter=True,
            user_program=user_program,
        )
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            attach_filter(self.sock, program)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 0)  # raised to the kernel's minimum
            _bind(self.sock, ifname)
        except BaseException:
            self.close()
            raise

    def read(self):
        """Add the kernel's count since the last read (tpacket_stats: packets counts the drops too)."""
        if self.sock is not None:
            packets, _ = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
            self.count += packets
        return self.count

    def stop_filtering_in(self):
        attach_filter(self.sock, reject_all_filter())

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def interface_link_type(ifname):
    """ARPHRD type of an interface, from sysfs; ConfigError naming it when it does not exist."""
    try:
        socket.if_nametoindex(ifname)
    except OSError:
        known = ", ".join(sorted(os.listdir("/sys/class/net"))) if os.path.isdir("/sys/class/net") else "?"
        raise InterfaceUnavailable(f"interface {ifname!r} does not exist (this machine has: {known})") from None
    try:
        link = int(Path(f"/sys/class/net/{ifname}/type").read_text())
        flags = int(Path(f"/sys/class/net/{ifname}/flags").read_text(), 16)
    except (OSError, ValueError):
        return ARPHRD_ETHER
    if not flags & 1:  # IFF_UP
        raise InterfaceUnavailable(f"interface {ifname!r} is down (ip link set {ifname} up)")
    return link


class AfPacketSource:
    """One AF_PACKET socket with a TPACKET_V3 ring on one interface: a Source (probe.capture).

    ready() tells whether the next block is ours; read(max_frames) returns a FrameBatch of the frames of
    the blocks ready now (possibly empty). The owner poll()s fileno() between blocks (POLLIN: a block is
    ready; POLLERR: check_error()). counters() fetches the kernel's counters into the totals.
    """

    def __init__(self, ifname, capture_cfg, dns_ports, fanout_id=None, ip_filter=None, user_program=None):
        self.ifname = self.name = ifname
        self.block_size = capture_cfg.block_size
        self.block_count = capture_cfg.block_count
        self.sock = None
        self.ring = None
        self.next_block = 0
        self.last_seq = 0  # sequence number of the last block read (the kernel numbers blocks from 1)
        self.received = self.drops = self.freezes = 0  # accumulated PACKET_STATISTICS
        self.frames = 0  # frames read out of the ring
        self.overlap = 0  # the first frames of the ring, received before the fanout join: set aside
        self.join_overlap = 0  # those set aside so far
        link = interface_link_type(ifname)
        if link not in (ARPHRD_ETHER, ARPHRD_LOOPBACK):
            raise ConfigError(f"interface {ifname!r} has link type {link}; only Ethernet interfaces are supported")
        page = mmap.PAGESIZE
        if self.block_size % page:
            raise ConfigError(
                f"config key 'capture.block_size': {self.block_size} is not a multiple of the page size {page}"
            )
        try:
            self.program = dns_filter(dns_ports, skip_outgoing=link == ARPHRD_LOOPBACK, ip_filter=ip_filter,
                                      user_program=user_program)
        except ValueError as exc:
            raise ConfigError(f"cannot build the kernel filter (decode.dns_ports, filter.expression): {exc}") from None
        try:
            self._open(capture_cfg, fanout_id)
        except BaseException:
            self.close()
            raise

    def _open(self, cfg, fanout_id):
        name = self.ifname
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: nothing yet
        except PermissionError:
            raise ConfigError(f"cannot open a packet socket on {name!r}: permission denied; {NET_RAW_HINT}") from None
        sock = self.sock
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
        attach_filter(sock, self.program)  # before the bind: see join_fanout
        frames_per_block = self.block_size // _FRAME_SIZE
        req = _TPACKET_REQ3.pack(
            self.block_size, self.block_count, _FRAME_SIZE, frames_per_block * self.block_count,
            cfg.block_timeout_ms, 0, 0,
        )
        size = self.block_size * self.block_count
        try:
            sock.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
        except OSError as exc:
            if exc.errno == errno.ENOMEM:
                raise ConfigError(
                    f"interface {name!r}: cannot allocate a capture ring of {size >> 20} MiB; lower "
                    "capture.block_count or capture.block_size"
                ) from None
            raise ConfigError(
                f"interface {name!r}: the kernel refused the ring (capture.block_size {self.block_size}, "
                f"capture.block_count {self.block_count}): {exc.strerror}"
            ) from None
        try:
            self.ring = mmap.mmap(sock.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise ConfigError(f"interface {name!r}: cannot map a capture ring of {size >> 20} MiB: {exc}") from None
        _bind(sock, name)
        if fanout_id is not None:
            self.overlap = join_fanout(sock, name, fanout_id, self.written)
        if cfg.promiscuous:
            mreq = struct.pack("iHH8s", socket.if_nametoindex(name), PACKET_MR_PROMISC, 0, b"")
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)

    def written(self):
        """Frames the kernel has put in the ring so far (before any is read): the blocks it handed over and the
        one it fills, whose count it raises as it reserves each frame's place."""
        total = 0
        for block in range(self.block_count):
            status, num = struct.unpack_from("<II", self.ring, block * self.block_size + _BLOCK_STATUS)
            total += num
            if not status & TP_STATUS_USER:
                break
        return total

    def fileno(self):
        return self.sock.fileno()

    def kernel_stats(self):
        """Fetch PACKET_STATISTICS (which resets the kernel's counters) into the running totals."""
        packets, drops, freezes = _STATS_V3.unpack(self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12))
        self.received += packets
        self.drops += drops
        self.freezes += freezes
        return packets, drops, freezes

    def counters(self):
        """The kernel's counters for this socket so far (fetched now while it is open) and the frames read."""
        if self.sock is not None:
            self.kernel_stats()
        return {"kernel_received": self.received, "kernel_drops": self.drops, "kernel_freezes": self.freezes,
                "join_overlap": self.join_overlap, "frames": self.frames}

    def ready(self):
        """True when the next block of the ring is ours to read."""
        off = self.next_block * self.block_size
        return bool(struct.unpack_from("<I", self.ring, off + _BLOCK_STATUS)[0] & TP_STATUS_USER)

    def unread(self):
        """Frames of the next block not read yet: a block handed over to us, or the one the kernel is filling
        (0 when idle). Status and count are read together, so a block handed over between a ready() and this
        call is not taken for an empty one. A block we gave back keeps its old count until the kernel opens it
        again (it does not at once when the ring was full): its sequence number, not above that of the last
        block read, tells it apart from a block opened since."""
        off = self.next_block * self.block_size
        status, num, _, _, seq = _BLOCK_HDR.unpack_from(self.ring, off + _BLOCK_STATUS)
        return num if status & TP_STATUS_USER or seq > self.last_seq else 0

    def check_error(self):
        """Raise the socket's pending error (interface gone or down), if any; poll() reports it as POLLERR."""
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise DnsprobeError(f"interface {self.ifname!r}: capture socket error: {os.strerror(err)}")

    def read(self, max_frames=4096):
        """The frames of the blocks ready now, up to about max_frames (whole blocks), as one FrameBatch: packed
        (FrameBatch.packed, walked in C by probe.capture._ring) where built, else by read_python."""
        if _ring is None:
            batch = self.read_python(max_frames)
        else:
            frames = _records.Frames()
            self.next_block, seq, n = _ring.read_blocks(
                self.ring, self.next_block, self.block_size, self.block_count, max_frames, frames
            )
            if seq:
                self.last_seq = seq
            self.frames += n
            batch = FrameBatch(LINKTYPE_ETHERNET, packed=frames)
        return self.set_overlap_aside(batch) if self.overlap else batch

    def set_overlap_aside(self, batch):
        """The batch without the frames received from the bind to the fanout join (join_fanout), the first of
        the ring; they are counted in join_overlap, not in frames."""
        ts_ns, wirelen, data = batch.ts_ns, batch.wirelen, batch.data
        n = min(self.overlap, len(data))
        self.overlap -= n
        self.join_overlap += n
        self.frames -= n
        return FrameBatch(batch.linktype, ts_ns[n:], wirelen[n:], data[n:])

    def read_python(self, max_frames=4096):
        """read() in Python: the reference of probe.capture._ring (and the path where it is not built). A frame
        whose header or bytes would lie outside its block, or a next offset shorter than a frame header, ends
        the walk of that block (the kernel writes neither; a damaged ring is not read past a block, nor the
        same frame taken again as often as its count says); a tag the kernel took off is put back
        only into a frame of at least the 12 bytes of its two addresses."""
        batch = FrameBatch(LINKTYPE_ETHERNET)
        ts_list, wl_list, data_list = batch.ts_ns, batch.wirelen, batch.data
        ring = self.ring
        bsize = self.block_size
        hdr = _FRAME_HDR.unpack_from
        seq = 0
        while len(data_list) < max_frames:
            off = self.next_block * bsize
            status, num, first, blen, block_seq = _BLOCK_HDR.unpack_from(ring, off + _BLOCK_STATUS)
            if not status & TP_STATUS_USER:
                break
            seq = block_seq
            if not first <= blen <= bsize:
                blen = bsize
            block = ring[off : off + blen]  # one copy; the block goes back to the kernel at once
            struct.pack_into("<I", ring, off + _BLOCK_STATUS, TP_STATUS_KERNEL)
            self.next_block = (self.next_block + 1) % self.block_count
            pos = first
            for _ in range(num):
                if pos + _FRAME_HDR.size > blen:
                    break
                nxt, sec, nsec, snaplen, wirelen, fstatus, mac, _, _, tci, tpid = hdr(block, pos)
                start = pos + mac
                if start + snaplen > blen:
                    break
                if fstatus & TP_STATUS_VLAN_VALID and snaplen >= 12:
                    tpid = tpid if fstatus & TP_STATUS_VLAN_TPID_VALID and tpid else 0x8100
                    tag = struct.pack("!HH", tpid, tci & 0xFFFF)  # (tp_vlan_tci is 32 bits wide; a TCI is 16)
                    data = block[start : start + 12] + tag + block[start + 12 : start + snaplen]
                    wirelen += 4
                else:
                    data = block[start : start + snaplen]
                ts_list.append(sec * 1_000_000_000 + nsec)
                wl_list.append(wirelen)
                data_list.append(data)
                self.frames += 1
                if nxt < _FRAME_HDR.size:  # (not a whole frame further on: the same bytes again, num times)
                    break
                pos += nxt
        if seq:  # (the last block's, as _ring gives it: 0 leaves the last one read before)
            self.last_seq = seq
        return batch

    def stop_filtering_in(self):
        """Let no new frame in (for a clean stop: what is already in the ring is still read)."""
        attach_filter(self.sock, reject_all_filter())

    def close(self):
        if self.ring is not None:
            try:
                self.ring.close()
            except (BufferError, ValueError):
                pass
            self.ring = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
