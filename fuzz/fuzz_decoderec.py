"""Frames through the record decoder (probe.decode._decoderec: PacketDecoder.decode_into a MsgBatch, include/
wire.h's frame classifier and DNS walker) and the pure-Python decoder (parser wire): the records read back as
message tuples equal the Python tuples, values and types, with equal counters and address events.

The first byte picks: the link type (low 3 bits, every one supported), frames packed (probe._records.Frames, as
the pcap and ring readers give them) or as lists, the raw message kept or not, IP lists on or off, and whether
the rest is frames (harness.split_frames) or DNS messages each put into a UDP datagram over IPv4 or IPv6 (so
that the walker sees fuzz bytes directly). Packed Ethernet frames with an 802.1Q tag are also given with the
tag taken off and beside the frame, as the kernel's VLAN offload hands them to the ring reader."""

import struct

from harness import check, run, split_frames, typed

from probe import _records
from probe.config import load_config
from probe.decode.ipfilter import IpFilter
from probe.decode.link import LINK_NAMES
from probe.decode.packets import PacketDecoder
from probe.model import FrameBatch
from probe.stats import Stats

LINKTYPES = sorted(LINK_NAMES)
LISTS = {"filter.ipv4_deny": ["10.0.0.0/8", "192.0.2.0/25"], "filter.ipv6_deny": ["2001:db8::/33"]}
CONFIGS = {(parser, lists): load_config(overrides={"decode.parser": parser, **(LISTS if lists else {})})
           for parser in ("fast", "wire") for lists in (False, True)}
T0 = 1_700_000_000_000_000_000


def udp_frame(i, msg):
    """msg as the payload of an Ethernet frame: UDP to port 53 over IPv4 (even i) or IPv6 (odd i)."""
    udp = struct.pack("!HHHH", 40000 + i, 53, 8 + len(msg), 0) + msg
    if i % 2:
        ip = struct.pack("!IHBB16s16s", 6 << 28, len(udp), 17, 64, b"\x20\x01\x0d\xb8" + bytes(11) + b"\x01",
                         b"\x20\x01\x0d\xb9" + bytes(11) + b"\x35")
        return b"\x02" * 6 + b"\x04" * 6 + b"\x86\xdd" + ip + udp
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i, 0, 64, 17, 0, bytes((192, 0, 2, 200)),
                     bytes((198, 51, 100, 53)))
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + udp


def packed(linktype, ts, frames, offload):
    out = _records.Frames()
    for t, f in zip(ts, frames):
        if offload and linktype == 1 and f[12:14] == b"\x81\x00" and len(f) >= 16:
            out.add(f[:12] + f[16:], t, len(f) - 4, int.from_bytes(f[12:16], "big"))
        else:
            out.add(f, t, len(f))
    return out


def one_input(data):
    if not data:
        return
    mode = data[0]
    as_messages, use_packed, keep_raw, lists = mode & 0x80, mode & 0x08, bool(mode & 0x10), bool(mode & 0x20)
    if as_messages:
        linktype, frames = 1, [udp_frame(i, m) for i, m in enumerate(split_frames(data[1:]))]
    else:
        linktype, frames = LINKTYPES[mode & 7], split_frames(data[1:])
    ts = [T0 + 1000 * i for i in range(len(frames))]
    results = []
    for parser in ("fast", "wire"):
        cfg, stats = CONFIGS[parser, lists], Stats()
        decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, stats, IpFilter(cfg.filter), keep_raw=keep_raw)
        if parser == "fast":
            assert decoder.c_frame_loop, "the record decoder is not built"
            batch = FrameBatch(linktype, packed=packed(linktype, ts, frames, mode & 0x40)) if use_packed else \
                FrameBatch(linktype, list(ts), [len(f) for f in frames], list(frames))
            out = _records.MsgBatch()
            decoder.decode_into(batch, out, "fuzz")
            msgs = out.to_tuples()
        else:
            msgs = decoder.decode(FrameBatch(linktype, list(ts), [len(f) for f in frames], list(frames)), "fuzz")
        decoder.flush()
        results.append((typed(msgs), stats.as_dict(), decoder.address_events))
    check(results[0] == results[1], "decoded frames", data, results[0], results[1])


if __name__ == "__main__":
    run(one_input)
