"""Live capture source: an AF_PACKET socket with a TPACKET_V3 memory-mapped receive ring.

One `AfPacketSource` is one socket on one interface, owned by one worker process:

- PACKET_VERSION TPACKET_V3 and PACKET_RX_RING: the kernel writes frames into blocks of a ring shared
  with us by mmap. A block is handed to user space when it is full or `block_timeout_ms` after its
  first frame. We copy a ready block out in one piece, hand it straight back to the kernel and walk its
  tpacket3_hdr entries with struct: no system call per packet, and the ring is free again as early as
  possible. Timestamps (tp_sec, tp_nsec) and wire lengths (tp_len) come from the ring.
- PACKET_FANOUT with PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_DEFRAG: the sockets of all workers on one
  interface form a group; the kernel spreads flows over them by a symmetric flow hash, so a query and
  its response reach the same worker, and reassembles IPv4 fragments before hashing so a fragmented
  datagram arrives whole at one worker. (IPv6 fragments are hashed on their addresses only, so a
  fragmented IPv6 response can reach another worker than its query: it is then exported unmatched.)
- SO_ATTACH_FILTER: a classic BPF program, assembled below, keeps in the kernel only UDP and TCP on the
  DNS ports (also behind one or two VLAN tags) and fragments of UDP/TCP datagrams. Everything else
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

from probe.errors import ConfigError, DnsprobeError
from probe.frames import LINKTYPE_ETHERNET, FrameBatch

# <linux/if_packet.h>, <linux/if_ether.h>, <asm-generic/socket.h>
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_FANOUT = 18
TPACKET_V3 = 2
PACKET_MR_PROMISC = 1
PACKET_FANOUT_HASH = 0
PACKET_FANOUT_FLAG_DEFRAG = 0x8000
PACKET_OUTGOING = 4
ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26

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
SNAPLEN = 262144  # what the filter keeps of an accepted frame: all of it

# ---------------------------------------------------------------------------------------------
# Classic BPF: opcodes (<linux/filter.h>) and a small assembler with labels.

BPF_LD, BPF_LDX, BPF_ALU, BPF_JMP, BPF_RET = 0x00, 0x01, 0x04, 0x05, 0x06
BPF_AND = 0x50
BPF_W, BPF_H, BPF_B = 0x00, 0x08, 0x10
BPF_IMM, BPF_ABS, BPF_IND, BPF_MSH = 0x00, 0x20, 0x40, 0xA0
BPF_JA, BPF_JEQ, BPF_JSET = 0x00, 0x10, 0x40
BPF_K = 0x00
SKF_AD_OFF = -0x1000
SKF_AD_PKTTYPE = 4
BPF_MAXINSNS = 4096
MAX_FILTER_PORTS = 100  # keeps every conditional jump of the program within its 255 reach

OPCODES = {
    # mnemonic: (code, takes a jump pair)
    "ld": (BPF_LD | BPF_W | BPF_ABS, False),  # A = u32 at [k]
    "ldh": (BPF_LD | BPF_H | BPF_ABS, False),  # A = u16 at [k]
    "ldb": (BPF_LD | BPF_B | BPF_ABS, False),  # A = u8 at [k]
    "ldh_x": (BPF_LD | BPF_H | BPF_IND, False),  # A = u16 at [X + k]
    "ldxb_msh": (BPF_LDX | BPF_B | BPF_MSH, False),  # X = 4 * ([k] & 0xf): IPv4 header length
    "ldx_imm": (BPF_LDX | BPF_W | BPF_IMM, False),
    "and": (BPF_ALU | BPF_AND | BPF_K, False),  # A &= k
    "jeq": (BPF_JMP | BPF_JEQ | BPF_K, True),
    "jset": (BPF_JMP | BPF_JSET | BPF_K, True),
    "ja": (BPF_JMP | BPF_JA, False),  # k = label, 32-bit forward jump
    "ret": (BPF_RET | BPF_K, False),
}


class BpfAssembler:
    """Collects instructions with symbolic forward jumps; assemble() resolves them.

    A conditional jump names its true and false targets as labels, or None for "the next instruction".
    Classic BPF only jumps forward, at most 255 instructions for a conditional jump.
    """

    def __init__(self):
        self.code = []  # [mnemonic, k, jt, jf]
        self.labels = {}

    def label(self, name):
        if name in self.labels:
            raise ValueError(f"BPF label {name} defined twice")
        self.labels[name] = len(self.code)

    def op(self, mnemonic, k=0, jt=None, jf=None):
        self.code.append([mnemonic, k, jt, jf])

    def jeq_far(self, k, label):
        """if A == k goto label, for a label further than a conditional jump reaches."""
        self.op("jeq", k, None, "+1")
        self.op("ja", label)

    def _target(self, pos, target):
        if target is None:
            return 0
        if target == "+1":
            return 1
        if target not in self.labels:
            raise ValueError(f"BPF label {target} undefined")
        return self.labels[target] - pos - 1

    def assemble(self):
        out = []
        for pos, (mnemonic, k, jt, jf) in enumerate(self.code):
            code, conditional = OPCODES[mnemonic]
            if mnemonic == "ja":
                k, jt_off, jf_off = self._target(pos, k), 0, 0
                if k < 0:
                    raise ValueError("BPF jumps go forward only")
            elif conditional:
                jt_off, jf_off = self._target(pos, jt), self._target(pos, jf)
                if not (0 <= jt_off <= 255 and 0 <= jf_off <= 255):
                    raise ValueError(f"BPF conditional jump at {pos} out of range ({jt_off}, {jf_off})")
            else:
                jt_off = jf_off = 0
            out.append((code, jt_off, jf_off, k & 0xFFFFFFFF))
        if len(out) > BPF_MAXINSNS:
            raise ValueError(f"BPF program of {len(out)} instructions is longer than the kernel's {BPF_MAXINSNS}")
        return out


def _ports_check(a, ports, x_relative, offset, accept, otherwise):
    """A = port at offset (relative to X when x_relative); accept when it is one of ports."""
    a.op("ldh_x" if x_relative else "ldh", offset)
    for i, port in enumerate(ports):
        last = i == len(ports) - 1
        a.op("jeq", port, accept, otherwise if last else None)


def _ip_lists_check(a, p, lists, family, base, kept, rejected):
    """The IP allow/deny lists of one family (probe.privacy._FamilyFilter), on the addresses of the IP header
    at base: goes to `kept` or `rejected`. A prefix is matched 32 bits at a time: load, mask, compare."""
    src, dst, words = (base + 12, base + 16, 1) if family == 4 else (base + 8, base + 24, 4)
    listed, unlisted = (kept, rejected) if lists.allow else (rejected, kept)
    n = 0
    for address in (src, dst):
        for net, plen in lists.prefixes:
            miss = f"{p}miss{n}"
            n += 1
            for w in range(words):
                bits = min(32, max(0, plen - 32 * w))
                if not bits:
                    break
                mask = (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF
                a.op("ld", address + 4 * w)
                if mask != 0xFFFFFFFF:
                    a.op("and", mask)
                a.op("jeq", (net >> (32 * (words - 1 - w))) & mask, None, miss)
            a.op("ja", listed)
            a.label(miss)
    a.op("ja", unlisted)


def _verdicts(a, p, snaplen, lists, family, base, invert):
    """The end of a family block: `p`no is reached by what the DNS part of the filter rejects (placed first:
    jumps go forward only and not far), `p`dns by what it keeps. With IP lists the verdict is theirs
    (inverted: keep exactly what the lists reject, for counting them)."""
    a.label(p + "no")
    a.op("ret", 0)
    a.label(p + "dns")
    if lists is not None:
        kept, rejected = (p + "drop", p + "accept") if invert else (p + "accept", p + "drop")
        _ip_lists_check(a, p, lists, family, base, kept, rejected)
    elif invert:
        a.op("ja", p + "drop")
    else:
        a.op("ja", p + "accept")
    a.label(p + "drop")
    a.op("ret", 0)
    a.label(p + "accept")
    a.op("ret", snaplen)


def _ipv4_block(a, base, ports, snaplen, lists=None, invert=False):
    p = f"ip4_{base}_"
    a.label(p + "start")
    a.op("ldb", base + 9)  # protocol
    a.op("jeq", 17, p + "l4", None)
    a.op("jeq", 6, p + "l4", p + "no")
    a.label(p + "l4")
    a.op("ldh", base + 6)  # flags and fragment offset
    if invert:
        # The counting socket is in no fanout group, so nothing reassembles fragments for it: count a
        # fragmented datagram once, by its first fragment, whose ports are there to check.
        a.op("jset", 0x1FFF, p + "no", None)
    else:
        a.op("jset", 0x3FFF, p + "dns", None)  # a fragment (MF set or offset > 0): keep
    a.op("ldxb_msh", base)  # X = IPv4 header length
    _ports_check(a, ports, True, base, p + "dns", None)  # source port
    _ports_check(a, ports, True, base + 2, p + "dns", p + "no")  # destination port
    _verdicts(a, p, snaplen, lists, 4, base, invert)


def _ipv6_block(a, base, ports, snaplen, lists=None, invert=False):
    p = f"ip6_{base}_"
    a.label(p + "start")
    a.op("ldb", base + 6)  # next header
    a.op("jeq", 17, p + "ports", None)
    a.op("jeq", 6, p + "ports", None)
    a.op("jeq", 44, None, p + "no")  # fragment header: keep fragments of UDP and TCP
    a.op("ldb", base + 40)
    a.op("jeq", 17, p + "dns", None)
    a.op("jeq", 6, p + "dns", p + "no")
    a.label(p + "ports")
    _ports_check(a, ports, False, base + 40, p + "dns", None)
    _ports_check(a, ports, False, base + 42, p + "dns", p + "no")
    _verdicts(a, p, snaplen, lists, 6, base, invert)


def dns_filter(ports, skip_outgoing=False, snaplen=SNAPLEN, ip_filter=None, invert_ip_filter=False):
    """The classic BPF program (list of (code, jt, jf, k)) that keeps DNS and IP fragments on Ethernet.

    Kept: IPv4/IPv6 UDP or TCP with a source or destination port in `ports`, and fragments of
    IPv4/IPv6 UDP or TCP datagrams; untagged or behind one or two VLAN tags (802.1Q, 802.1ad, 0x9100).
    IPv6 extension headers other than a fragment header are not walked (as tcpdump's `port 53`).
    skip_outgoing drops frames this host sends (used on loopback, where every frame is seen twice).
    ip_filter (probe.privacy.IpFilter): of those, keep only what its allow/deny lists keep, or with
    invert_ip_filter only what they reject (the program of the socket that counts them). ValueError when
    the program is longer than the kernel takes.
    """
    ports = sorted(set(ports))
    if not ports:
        raise ValueError("no DNS ports")
    if len(ports) > MAX_FILTER_PORTS:
        raise ValueError(f"{len(ports)} ports; the kernel filter takes at most {MAX_FILTER_PORTS}")
    a = BpfAssembler()
    if skip_outgoing:
        a.op("ld", SKF_AD_OFF + SKF_AD_PKTTYPE)
        a.op("jeq", PACKET_OUTGOING, None, "eth")
        a.op("ret", 0)
    a.label("eth")
    tags = (0x8100, 0x88A8, 0x9100)
    # Ethertype at 12 (untagged), 16 (one tag), 20 (two tags); the IP header 2 bytes later.
    for depth, etype_at in enumerate((12, 16, 20)):
        base = etype_at + 2
        a.label(f"ethertype_{etype_at}")
        a.op("ldh", etype_at)
        a.jeq_far(0x0800, f"ip4_{base}_start")
        a.jeq_far(0x86DD, f"ip6_{base}_start")
        if depth < 2:
            for tag in tags:
                a.jeq_far(tag, f"ethertype_{etype_at + 4}")
        a.op("ret", 0)
    v4 = ip_filter.v4 if ip_filter else None
    v6 = ip_filter.v6 if ip_filter else None
    for base in (14, 18, 22):
        _ipv4_block(a, base, ports, snaplen, v4, invert_ip_filter)
        _ipv6_block(a, base, ports, snaplen, v6, invert_ip_filter)
    return a.assemble()


def reject_all_filter():
    return [(BPF_RET | BPF_K, 0, 0, 0)]


def attach_filter(sock, program):
    """SO_ATTACH_FILTER with a struct sock_fprog pointing at the program's instructions."""
    raw = b"".join(struct.pack("HBBI", code, jt, jf, k) for code, jt, jf, k in program)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HxxxxxxP" if struct.calcsize("P") == 8 else "HxxP", len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


# ---------------------------------------------------------------------------------------------


def _bind(sock, name):
    try:
        sock.bind((name, ETH_P_ALL))
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            raise ConfigError(f"interface {name!r} does not exist") from None
        if exc.errno == errno.ENETDOWN:
            raise ConfigError(f"interface {name!r} is down") from None
        raise ConfigError(f"cannot bind a packet socket to {name!r}: {exc.strerror}") from None


def _join_fanout(sock, name, fanout_id):
    """PACKET_FANOUT_HASH with defragmentation: IPv4 fragments are reassembled before the filter runs."""
    arg = (fanout_id & 0xFFFF) | ((PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_DEFRAG) << 16)
    try:
        sock.setsockopt(SOL_PACKET, PACKET_FANOUT, struct.pack("I", arg))
    except OSError as exc:
        raise ConfigError(
            f"interface {name!r}: cannot join packet fanout group {fanout_id} ({exc.strerror}); another "
            "capture may use that group id: set capture.fanout_group"
        ) from None


def ip_lists_fit(dns_ports, ip_filter):
    """True when the IP lists of ip_filter fit in the kernel filter with the DNS ports."""
    try:
        dns_filter(dns_ports, skip_outgoing=True, ip_filter=ip_filter)
        dns_filter(dns_ports, skip_outgoing=True, ip_filter=ip_filter, invert_ip_filter=True)
    except ValueError:
        return False
    return True


class RejectedCounter:
    """Counts in the kernel the frames that the IP lists reject, when the lists are in the kernel filter.

    A packet socket that is never read: its filter keeps exactly the DNS frames the lists reject (the
    capture sockets' filter minus the lists), its receive buffer is the kernel's minimum, and
    PACKET_STATISTICS counts every frame the filter passed, queued or dropped. A fragmented IPv4 datagram
    counts once, by its first fragment, as the capture sockets (whose fanout group reassembles it) see it
    once. It is in no fanout group: a second defragmenting group on the interface would share the kernel's
    reassembly queues with the capture sockets' group and take datagrams from it. So it sees every frame
    of the interface, and one worker only has it.
    """

    def __init__(self, ifname, dns_ports, ip_filter):
        self.ifname = ifname
        self.count = 0
        link = interface_link_type(ifname)
        program = dns_filter(
            dns_ports, skip_outgoing=link == ARPHRD_LOOPBACK, snaplen=64, ip_filter=ip_filter, invert_ip_filter=True
        )
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            attach_filter(self.sock, reject_all_filter())
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 0)  # raised to the kernel's minimum
            _bind(self.sock, ifname)
            attach_filter(self.sock, program)
            self.read()
            self.count = 0
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
        raise ConfigError(f"interface {ifname!r} does not exist (this machine has: {known})") from None
    try:
        link = int(Path(f"/sys/class/net/{ifname}/type").read_text())
        flags = int(Path(f"/sys/class/net/{ifname}/flags").read_text(), 16)
    except (OSError, ValueError):
        return ARPHRD_ETHER
    if not flags & 1:  # IFF_UP
        raise ConfigError(f"interface {ifname!r} is down (ip link set {ifname} up)")
    return link


class AfPacketSource:
    """One AF_PACKET socket with a TPACKET_V3 ring on one interface.

    ready() tells whether the next block is ours; read(max_frames) returns a FrameBatch of the frames of
    the blocks ready now (possibly empty). The owner poll()s fileno() between blocks (POLLIN: a block is
    ready; POLLERR: check_error()). kernel_stats() fetches the kernel's counters into the totals.
    """

    def __init__(self, ifname, capture_cfg, dns_ports, fanout_id=None, ip_filter=None):
        self.ifname = ifname
        self.block_size = capture_cfg.block_size
        self.block_count = capture_cfg.block_count
        self.sock = None
        self.ring = None
        self.next_block = 0
        self.last_seq = 0  # sequence number of the last block read (the kernel numbers blocks from 1)
        self.received = self.drops = self.freezes = 0  # accumulated PACKET_STATISTICS
        self.frames = 0  # frames read out of the ring
        link = interface_link_type(ifname)
        if link not in (ARPHRD_ETHER, ARPHRD_LOOPBACK):
            raise ConfigError(f"interface {ifname!r} has link type {link}; only Ethernet interfaces are supported")
        page = mmap.PAGESIZE
        if self.block_size % page:
            raise ConfigError(
                f"config key 'capture.block_size': {self.block_size} is not a multiple of the page size {page}"
            )
        try:
            self.program = dns_filter(dns_ports, skip_outgoing=link == ARPHRD_LOOPBACK, ip_filter=ip_filter)
        except ValueError as exc:
            raise ConfigError(f"config key 'decode.dns_ports': cannot build the kernel filter: {exc}") from None
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
            raise ConfigError(
                f"cannot open a packet socket on {name!r}: permission denied "
                "(run as root or give the program CAP_NET_RAW)"
            ) from None
        sock = self.sock
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
        # Nothing passes until the socket is in its fanout group, so no frame is seen twice.
        attach_filter(sock, reject_all_filter())
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
        if cfg.promiscuous:
            mreq = struct.pack("iHH8s", socket.if_nametoindex(name), PACKET_MR_PROMISC, 0, b"")
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        if fanout_id is not None:
            _join_fanout(sock, name, fanout_id)
        attach_filter(sock, self.program)
        self.kernel_stats()  # the frames refused while the socket was set up are none of our business
        self.received = self.drops = self.freezes = 0

    def fileno(self):
        return self.sock.fileno()

    def kernel_stats(self):
        """Fetch PACKET_STATISTICS (which resets the kernel's counters) into the running totals."""
        packets, drops, freezes = _STATS_V3.unpack(self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12))
        self.received += packets
        self.drops += drops
        self.freezes += freezes
        return packets, drops, freezes

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
        """The frames of the blocks ready now, up to about max_frames (whole blocks), as one FrameBatch."""
        batch = FrameBatch(LINKTYPE_ETHERNET)
        ts_list, wl_list, data_list = batch.ts_ns, batch.wirelen, batch.data
        ring = self.ring
        bsize = self.block_size
        hdr = _FRAME_HDR.unpack_from
        while len(data_list) < max_frames:
            off = self.next_block * bsize
            status, num, first, blen, seq = _BLOCK_HDR.unpack_from(ring, off + _BLOCK_STATUS)
            if not status & TP_STATUS_USER:
                break
            self.last_seq = seq
            if not first <= blen <= bsize:
                blen = bsize
            block = ring[off : off + blen]  # one copy; the block goes back to the kernel at once
            struct.pack_into("<I", ring, off + _BLOCK_STATUS, TP_STATUS_KERNEL)
            self.next_block = (self.next_block + 1) % self.block_count
            pos = first
            for _ in range(num):
                nxt, sec, nsec, snaplen, wirelen, fstatus, mac, _, _, tci, tpid = hdr(block, pos)
                start = pos + mac
                if fstatus & TP_STATUS_VLAN_VALID:
                    tpid = tpid if fstatus & TP_STATUS_VLAN_TPID_VALID and tpid else 0x8100
                    tag = struct.pack("!HH", tpid, tci)
                    data = block[start : start + 12] + tag + block[start + 12 : start + snaplen]
                    wirelen += 4
                else:
                    data = block[start : start + snaplen]
                ts_list.append(sec * 1_000_000_000 + nsec)
                wl_list.append(wirelen)
                data_list.append(data)
                pos += nxt
            self.frames += num
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
