"""A classic BPF interpreter: what the kernel does with the programs of probe.capture.bpf."""

import operator

_CBPF_ALU = {0x00: operator.add, 0x10: operator.sub, 0x20: operator.mul, 0x30: operator.floordiv, 0x40: operator.or_,
             0x50: operator.and_, 0x60: operator.lshift, 0x70: operator.rshift, 0x90: operator.mod, 0xA0: operator.xor}


def received(frame):
    """An Ethernet frame as the kernel's receive path holds it when AF_PACKET's fanout runs: an outer 802.1Q or
    802.1ad tag taken off (VLAN untagging), skb->protocol the ethertype after it, the network header just after
    the Ethernet header. Returns (frame without that tag, protocol, network header offset)."""
    etype = int.from_bytes(frame[12:14], "big")
    if etype in (0x8100, 0x88A8) and len(frame) >= 18:
        frame = frame[:12] + frame[16:]
        etype = int.from_bytes(frame[12:14], "big")
    return frame, etype, 14


def run_cbpf(program, packet, protocol=0, net=0, pkttype=0):
    """The return value of the classic BPF program (a list of (code, jt, jf, k)) on the packet bytes, as the
    kernel's interpreter computes it: a load outside the packet ends the program with 0. pkttype, protocol: the
    SKF_AD_PKTTYPE and SKF_AD_PROTOCOL ancillary loads; net: where loads relative to SKF_NET_OFF start."""
    a = x = 0
    mem = [0] * 16
    pc = 0
    mask = 0xFFFFFFFF

    def load(size, at):
        signed = at - (1 << 32) if at & 0x80000000 else at
        if -0x1000 <= signed < 0:  # ancillary data
            return {0: protocol, 4: pkttype}[signed + 0x1000]
        if -0x100000 <= signed < -0x1000:  # SKF_NET_OFF: from the network header
            at = net + signed + 0x100000
        if at < 0 or at + size > len(packet):
            raise IndexError
        return int.from_bytes(packet[at : at + size], "big")

    try:
        while True:
            code, jt, jf, k = program[pc]
            pc += 1
            cls = code & 0x07
            if cls == 0x00:  # BPF_LD
                size = {0x00: 4, 0x08: 2, 0x10: 1}[code & 0x18]
                mode = code & 0xE0
                if mode == 0x20:  # ABS
                    a = load(size, k)
                elif mode == 0x40:  # IND
                    a = load(size, (x + k) & mask)
                elif mode == 0x60:  # MEM
                    a = mem[k]
                elif mode == 0x00:  # IMM
                    a = k
                else:
                    raise ValueError(f"unknown load {code:#x}")
            elif cls == 0x01:  # BPF_LDX
                mode = code & 0xE0
                if mode == 0xA0:  # MSH
                    x = 4 * (load(1, k) & 0x0F)
                elif mode == 0x00:
                    x = k
                elif mode == 0x60:
                    x = mem[k]
                else:
                    raise ValueError(f"unknown ldx {code:#x}")
            elif cls == 0x02:  # BPF_ST
                mem[k] = a
            elif cls == 0x03:  # BPF_STX
                mem[k] = x
            elif cls == 0x04:  # BPF_ALU
                op, src = code & 0xF0, (x if code & 0x08 else k)
                a = (-a if op == 0x80 else _CBPF_ALU[op](a, src)) & mask
            elif cls == 0x05:  # BPF_JMP
                op = code & 0xF0
                src = x if code & 0x08 else k
                if op == 0x00:
                    pc += k
                    continue
                cond = {0x10: a == src, 0x20: a > src, 0x30: a >= src, 0x40: bool(a & src)}[op]
                pc += jt if cond else jf
            elif cls == 0x06:  # BPF_RET
                return a if (code & 0x18) == 0x10 else k
            elif cls == 0x07:  # BPF_MISC
                if (code & 0xF8) == 0x00:  # TAX
                    x = a
                else:
                    a = x
    except IndexError:
        return 0
