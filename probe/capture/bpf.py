"""The classic BPF programs of live capture, assembled here: the kernel filter and the fanout program.

The filter keeps UDP and TCP on the DNS ports (also behind one or two VLAN tags, and behind IPv6 extension
headers), fragments of UDP/TCP datagrams and the ICMP/ICMPv6 errors the decoder counts when they quote such a
packet; the IP allow/deny lists (filter.*) can be compiled into it too.
The fanout program (PACKET_FANOUT_CBPF) sends a frame to the worker its IP address pair hashes to, as
`dnsprobe read --workers` splits files. Opcodes are those of <linux/filter.h>; BpfAssembler resolves symbolic
forward jumps.
"""

from probe.decode.packets import ICMP_EVENTS, PROTO_ICMP, PROTO_ICMPV6
from probe.model import SNAPLEN

PACKET_OUTGOING = 4  # <linux/if_packet.h>: the packet type of a frame this host sends
BPF_LD, BPF_LDX, BPF_ST, BPF_ALU, BPF_JMP, BPF_RET, BPF_MISC = 0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x07
BPF_ADD, BPF_MUL, BPF_AND, BPF_LSH, BPF_RSH, BPF_XOR = 0x00, 0x20, 0x50, 0x60, 0x70, 0xA0
BPF_W, BPF_H, BPF_B = 0x00, 0x08, 0x10
BPF_IMM, BPF_ABS, BPF_IND, BPF_MEM, BPF_MSH = 0x00, 0x20, 0x40, 0x60, 0xA0
BPF_JA, BPF_JEQ, BPF_JSET = 0x00, 0x10, 0x40
BPF_K, BPF_X, BPF_A = 0x00, 0x08, 0x10
BPF_TAX = 0x00
SKF_AD_OFF = -0x1000
SKF_AD_PROTOCOL = 0
SKF_AD_PKTTYPE = 4
SKF_NET_OFF = -0x100000  # loads relative to the network header
BPF_MAXINSNS = 4096
MAX_FILTER_PORTS = 100  # keeps every conditional jump of the program within its 255 reach

OPCODES = {
    # mnemonic: (code, takes a jump pair)
    "ld": (BPF_LD | BPF_W | BPF_ABS, False),  # A = u32 at [k]
    "ldh": (BPF_LD | BPF_H | BPF_ABS, False),  # A = u16 at [k]
    "ldb": (BPF_LD | BPF_B | BPF_ABS, False),  # A = u8 at [k]
    "ldh_x": (BPF_LD | BPF_H | BPF_IND, False),  # A = u16 at [X + k]
    "ldb_x": (BPF_LD | BPF_B | BPF_IND, False),  # A = u8 at [X + k]
    "ld_imm": (BPF_LD | BPF_IMM, False),  # A = k
    "ld_mem": (BPF_LD | BPF_MEM, False),  # A = M[k]
    "st": (BPF_ST, False),  # M[k] = A
    "tax": (BPF_MISC | BPF_TAX, False),  # X = A
    "add": (BPF_ALU | BPF_ADD | BPF_K, False),  # A += k
    "add_x": (BPF_ALU | BPF_ADD | BPF_X, False),  # A += X
    "lsh": (BPF_ALU | BPF_LSH | BPF_K, False),  # A <<= k
    "rsh": (BPF_ALU | BPF_RSH | BPF_K, False),  # A >>= k
    "mul": (BPF_ALU | BPF_MUL | BPF_K, False),  # A *= k
    "xor_x": (BPF_ALU | BPF_XOR | BPF_X, False),  # A ^= X
    "ldxb_msh": (BPF_LDX | BPF_B | BPF_MSH, False),  # X = 4 * ([k] & 0xf): IPv4 header length
    "ldx_imm": (BPF_LDX | BPF_W | BPF_IMM, False),
    "and": (BPF_ALU | BPF_AND | BPF_K, False),  # A &= k
    "jeq": (BPF_JMP | BPF_JEQ | BPF_K, True),
    "jset": (BPF_JMP | BPF_JSET | BPF_K, True),
    "ja": (BPF_JMP | BPF_JA, False),  # k = label, 32-bit forward jump
    "ret": (BPF_RET | BPF_K, False),
    "ret_a": (BPF_RET | BPF_A, False),  # return A
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
    """The IP allow/deny lists of one family (probe.decode.ipfilter._FamilyFilter), on the addresses of the IP header
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


# The ICMP/ICMPv6 types the decoder counts and keeps as C-DNS address events (probe/decode/packets.py): the filter
# keeps those that quote a DNS packet.
ICMP_ERRORS = tuple(sorted(t for proto, t in ICMP_EVENTS if proto == PROTO_ICMP))
ICMPV6_ERRORS = tuple(sorted(t for proto, t in ICMP_EVENTS if proto == PROTO_ICMPV6))


def _ipv4_block(a, base, ports, snaplen, lists=None, invert=False):
    """IPv4 at base. UDP/TCP: a fragment is kept, else its ports are checked at X + base (X: the header length).
    An ICMP error (_icmp_quote) leads to the same port check, X then at the quoted packet's transport header."""
    p = f"ip4_{base}_"
    a.label(p + "start")
    a.op("ldb", base + 9)  # protocol
    a.op("jeq", 17, p + "l4", None)
    a.op("jeq", 6, p + "l4", None)
    a.op("jeq", PROTO_ICMP, None, p + "icmp_no")
    _icmp_quote(a, p, base)
    a.label(p + "l4")
    a.op("ldh", base + 6)  # flags and fragment offset
    a.op("jset", 0x3FFF, p + "dns", None)  # a fragment (MF set or offset > 0): keep
    a.op("ldxb_msh", base)  # X = IPv4 header length
    a.label(p + "ports")
    _ports_check(a, ports, True, base, p + "dns", None)  # source port
    _ports_check(a, ports, True, base + 2, p + "dns", p + "no")  # destination port
    _verdicts(a, p, snaplen, lists, 4, base, invert)


def _icmp_quote(a, p, base):
    """An ICMP error the decoder counts, whose quote (the IP header of the packet that caused it, 8 bytes after
    the ICMP header) is IPv4 UDP or TCP: a quoted fragment with an offset (no ports in the quote) is kept,
    else X is set for the port check (p"ports") of the quoted transport header. The IP lists then apply to the
    error's own addresses, as the decoder applies them. A quote cut before its ports ends the program (0)."""
    a.op("ldxb_msh", base)  # X = the error's IPv4 header length
    a.op("ldb_x", base)  # ICMP type
    for i, icmp_type in enumerate(ICMP_ERRORS):
        a.op("jeq", icmp_type, p + "quote", p + "icmp_no" if i == len(ICMP_ERRORS) - 1 else None)
    a.label(p + "quote")
    quoted = base + 8
    a.op("ldb_x", quoted)  # the quoted version and header length
    a.op("and", 0xF0)
    a.op("jeq", 0x40, None, p + "icmp_no")
    a.op("ldb_x", quoted + 9)  # the quoted protocol
    a.op("jeq", 17, p + "quoted_l4", None)
    a.op("jeq", 6, p + "quoted_l4", p + "icmp_no")
    a.label(p + "quoted_l4")
    a.op("ldh_x", quoted + 6)
    a.op("jset", 0x1FFF, p + "quoted_fragment", None)
    a.op("ldb_x", quoted)
    a.op("and", 0x0F)
    a.op("lsh", 2)
    a.op("add_x")
    a.op("add", 8)
    a.op("tax")  # X = the error's header, the ICMP header and the quoted IP header: ports at X + base
    a.op("ja", p + "ports")
    a.label(p + "quoted_fragment")
    a.op("ja", p + "dns")
    a.label(p + "icmp_no")
    a.op("ret", 0)


# IPv6 extension headers walked to the transport header, as the decoder walks them (probe/decode/packets.py):
# those whose length is (hdr ext len + 1) * 8 octets, and AH with (payload len + 2) * 4.
IPV6_EXT = (0, 43, 60, 135, 139, 140)
IPV6_AH = 51
IPV6_FRAGMENT = 44
MAX_IPV6_EXT = 8  # headers walked; a packet with more is kept (the decoder judges it)
MAX_QUOTED_IPV6_EXT = 3  # headers walked in the packet an ICMPv6 error quotes; a quote with more is kept


def _next_header(a, r, headers, l4, icmp, other):
    """Dispatches on the next header type in A: UDP or TCP to label l4, ICMPv6 to icmp (None: not looked for),
    the types of `headers` ((type, label) pairs) to their labels, any other to `other`. l4 and icmp may lie beyond
    a conditional jump's reach (255 instructions): they are reached through the unconditional jumps at the local
    labels r + "l4" and r + "icmp"."""
    a.op("jeq", 17, r + "l4", None)
    a.op("jeq", 6, r + "l4", None)
    if icmp:
        a.op("jeq", PROTO_ICMPV6, r + "icmp", None)
    for nh, label in headers:
        a.op("jeq", nh, label, None)
    a.op("ja", other)
    a.label(r + "l4")
    a.op("ja", l4)
    if icmp:
        a.label(r + "icmp")
        a.op("ja", icmp)


def _ipv6_chain(a, q, depth, l4, icmp, kept, other):
    """Walks an IPv6 header chain as the decoder walks it: on entry X is at the first header after the fixed one and
    A holds its type; X at the current header and its type in A (scratch M[0], M[1] while the length is added),
    unrolled `depth` times. A fragment header is walked as an 8-byte header and remembered (M[2] = 1). Ends
    at label l4 (UDP or TCP at X), icmp (ICMPv6 at X; None: not looked for), kept (more headers than walked) or
    other."""
    for i in range(depth):
        r = f"{q}{i}_"
        headers = [(IPV6_FRAGMENT, r + "frag"), (IPV6_AH, r + "ah")] + [(nh, r + "ext") for nh in IPV6_EXT]
        _next_header(a, r, headers, l4, icmp, other)
        a.label(r + "frag")
        a.op("ld_imm", 1)
        a.op("st", 2)
        a.op("ld_imm", 8)
        a.op("ja", r + "length")
        for kind, add, shift in (("ah", 2, 2), ("ext", 1, 3)):
            a.label(r + kind)
            a.op("ldb_x", 1)  # the header's length field
            a.op("add", add)
            a.op("lsh", shift)
            if kind == "ah":
                a.op("ja", r + "length")
        a.label(r + "length")  # A: the header's length
        a.op("st", 1)
        a.op("ldb_x", 0)  # its next header
        a.op("st", 0)
        a.op("ld_mem", 1)
        a.op("add_x")
        a.op("tax")  # X: the next header's offset
        a.op("ld_mem", 0)
    # `depth` headers walked: UDP, TCP or ICMPv6 next is checked, another header kept
    r = q + "deep_"
    _next_header(a, r, [(nh, r + "kept") for nh in (IPV6_FRAGMENT, IPV6_AH) + IPV6_EXT], l4, icmp, other)
    a.label(r + "kept")
    a.op("ja", kept)


def _ipv6_block(a, base, ports, snaplen, lists=None, invert=False):
    """IPv6 at base, its header chain walked (_ipv6_chain). UDP or TCP at the end: a fragment is kept (the decoder
    reassembles and judges the datagram), else its ports are checked, relative to X. An ICMPv6 error the decoder
    counts, quoting IPv6: the quoted packet's chain is walked the same way, up to MAX_QUOTED_IPV6_EXT headers, to
    the same check (a quoted fragment kept; a quote cut before its ports ends the program with 0), and the IP lists
    then apply to the error's own addresses, as the decoder applies them."""
    p = f"ip6_{base}_"
    a.label(p + "start")
    a.op("ld_imm", 0)
    a.op("st", 2)  # no fragment header yet
    a.op("ldx_imm", base + 40)
    a.op("ldb", base + 6)  # next header
    _ipv6_chain(a, p + "w", MAX_IPV6_EXT, p + "l4", p + "icmp", p + "dns", p + "no")
    a.label(p + "icmp")
    a.op("ldb_x", 0)  # ICMPv6 type
    for i, icmp_type in enumerate(ICMPV6_ERRORS):
        a.op("jeq", icmp_type, p + "error", p + "icmp_no" if i == len(ICMPV6_ERRORS) - 1 else None)
    a.label(p + "error")
    a.op("ldb_x", 8)  # the quoted packet's version
    a.op("and", 0xF0)
    a.op("jeq", 0x60, p + "quote", None)
    a.label(p + "icmp_no")
    a.op("ret", 0)
    a.label(p + "quote")
    a.op("ld_imm", 0)
    a.op("st", 2)  # the quote's own fragment header counts, not the error's
    a.op("ldb_x", 8 + 6)  # the quoted next header
    a.op("st", 0)
    a.op("ld_imm", 8 + 40)
    a.op("add_x")
    a.op("tax")  # X: after the quoted fixed header
    a.op("ld_mem", 0)
    _ipv6_chain(a, p + "q", MAX_QUOTED_IPV6_EXT, p + "l4", None, p + "dns", p + "no")
    a.label(p + "l4")
    a.op("ld_mem", 2)
    a.op("jeq", 0, None, p + "dns")  # a fragment: kept
    _ports_check(a, ports, True, 0, p + "dns", None)
    _ports_check(a, ports, True, 2, p + "dns", p + "no")
    _verdicts(a, p, snaplen, lists, 6, base, invert)


def dns_filter(ports, skip_outgoing=False, snaplen=SNAPLEN, ip_filter=None, invert_ip_filter=False, user_program=None):
    """The classic BPF program (list of (code, jt, jf, k)) that keeps DNS and IP fragments on Ethernet.

    Kept: IPv4/IPv6 UDP or TCP with a source or destination port in `ports`, and fragments of
    IPv4/IPv6 UDP or TCP datagrams; untagged or behind one or two VLAN tags (802.1Q, 802.1ad, 0x9100);
    IPv6 behind extension headers (hop-by-hop, routing, destination options, mobility, HIP, shim6, AH,
    fragment), as the decoder walks them, up to MAX_IPV6_EXT of them (a longer chain is kept). Also kept: the
    ICMP errors (destination unreachable, time exceeded) and ICMPv6 errors (those and packet too big) that the
    decoder counts and turns into C-DNS address events, when the packet they quote is UDP or TCP on a DNS port
    or a fragment of either, so live capture counts them as `dnsprobe read` does.
    skip_outgoing drops frames this host sends (used on loopback, where every frame is seen twice).
    ip_filter (probe.decode.ipfilter.IpFilter): of those, keep only what its allow/deny lists keep, or with
    invert_ip_filter only what they reject (the program of the socket that counts them). user_program (the
    filter.expression compiled by libpcap, probe.capture.pcapfilter) runs first: a frame it rejects is dropped,
    one it accepts goes on to the rest (chain_programs). ValueError when the program is longer than the kernel
    takes (BPF_MAXINSNS).
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
    # Ethertype at 12 (untagged), 16 (one tag), 20 (two tags); the IP header 2 bytes later.
    for depth, etype_at in enumerate((12, 16, 20)):
        base = etype_at + 2
        a.label(f"ethertype_{etype_at}")
        a.op("ldh", etype_at)
        _by_ethertype(a, f"ip4_{base}_start", f"ip6_{base}_start", f"ethertype_{etype_at + 4}" if depth < 2 else None)
    v4 = ip_filter.v4 if ip_filter else None
    v6 = ip_filter.v6 if ip_filter else None
    for base in (14, 18, 22):
        _ipv4_block(a, base, ports, snaplen, v4, invert_ip_filter)
        _ipv6_block(a, base, ports, snaplen, v6, invert_ip_filter)
    program = a.assemble()
    if user_program:
        program = chain_programs(user_program, program)
        if len(program) > BPF_MAXINSNS:
            raise ValueError(f"the filter expression ({len(user_program)} instructions) and the DNS filter make"
                             f" {len(program)}, more than the kernel's {BPF_MAXINSNS}")
    return program


def chain_programs(first, then):
    """One program: `first` (classic BPF, as libpcap compiles it), where it accepts going on to `then` (its returns
    of a non-zero constant become jumps to then's start), where it rejects returning 0. A return of A goes on when
    A is not 0 (to a `ret 0` placed between the two). Jump offsets are relative, so neither program's own jumps
    change."""
    ret_a = any(code == BPF_RET | BPF_A for code, _, _, _ in first)
    end = len(first) + ret_a  # then's start
    out = []
    for pos, (code, jt, jf, k) in enumerate(first):
        if code & 0x07 != BPF_RET or (code == BPF_RET | BPF_K and k == 0):
            out.append((code, jt, jf, k))
        elif code == BPF_RET | BPF_K:
            out.append((BPF_JMP | BPF_JA, 0, 0, end - pos - 1))
        elif code == BPF_RET | BPF_A:
            reject, accept = end - pos - 2, end - pos - 1
            if accept > 255:
                raise ValueError("the filter expression's program is too long to chain with the DNS filter")
            out.append((BPF_JMP | BPF_JEQ | BPF_K, reject, accept, 0))
        else:
            raise ValueError(f"the filter expression's program returns in an unexpected way ({code:#x})")
    if ret_a:
        out.append((BPF_RET | BPF_K, 0, 0, 0))
    return out + list(then)


def _by_ethertype(a, v4, v6, tagged):
    """Jumps on the ethertype in A: to label v4 for IPv4, v6 for IPv6, tagged for a VLAN tag (802.1Q, 802.1ad or
    the old 0x9100; None: no more tags allowed); any other frame is rejected."""
    a.jeq_far(0x0800, v4)
    a.jeq_far(0x86DD, v6)
    if tagged is not None:
        for tag in (0x8100, 0x88A8, 0x9100):
            a.jeq_far(tag, tagged)
    a.op("ret", 0)


def reject_all_filter():
    return [(BPF_RET | BPF_K, 0, 0, 0)]


def fanout_program():
    """The PACKET_FANOUT_CBPF program: the symmetric hash of the frame's IP address pair, which the kernel takes
    modulo the number of sockets in the group. It computes include/wire.h's flow_hash (the XOR of the address
    words, times 0x9E3779B1, xor its upper half; 0 for a frame that is not IP or too short): every packet of a
    flow, both directions and every fragment, goes to one worker, as `dnsprobe read --workers` splits files.
    The kernel runs it where the receive path holds the packet: the outer VLAN tag already taken off, the data
    possibly starting at the IP header; so it reads skb->protocol and loads relative to the network header
    (SKF_NET_OFF), passing at most two tags still in the data."""
    a = BpfAssembler()
    a.op("ld", SKF_AD_OFF + SKF_AD_PROTOCOL)  # the ethertype, after the tag the kernel took off
    for depth, etype_at in enumerate((None, 2, 6)):
        ip_at = 0 if etype_at is None else etype_at + 2
        if etype_at is not None:
            a.label(f"tag_{depth}")
            a.op("ldh", SKF_NET_OFF + etype_at)
        _by_ethertype(a, f"v4_{ip_at}", f"v6_{ip_at}", f"tag_{depth + 1}" if depth < 2 else None)
    for ip_at in (0, 4, 8):
        net = SKF_NET_OFF + ip_at
        a.label(f"v4_{ip_at}")
        a.op("ld", net + 12)
        a.op("tax")
        a.op("ld", net + 16)
        a.op("xor_x")
        a.op("ja", "mix")
        a.label(f"v6_{ip_at}")
        a.op("ld", net + 8)
        for word in range(1, 8):
            a.op("tax")
            a.op("ld", net + 8 + 4 * word)
            a.op("xor_x")
        a.op("ja", "mix")
    a.label("mix")
    a.op("mul", 0x9E3779B1)
    a.op("tax")
    a.op("rsh", 16)
    a.op("xor_x")
    a.op("ret_a")
    return a.assemble()
