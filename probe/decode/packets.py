"""Packet decoder: a FrameBatch in, DNS messages out (see probe.model).

decode() is the Python reference: message tuples, made by the frame loop below. Per frame the work is a handful
of struct unpacks and slices; the DNS parse reads only what the output needs. Counters are kept in locals and
added to the shared Stats once per batch.

decode_into() is the production path: message records appended to a probe._records.MsgBatch. With the C parser
(decode.parser fast, or auto when built) the common frames (Ethernet, VLAN tags allowed, + IP + UDP or TCP on a
DNS port) are decoded in C (probe/decode/_decoderec.c; for TCP it calls the C stream step,
probe/decode/_tcpstream.c, directly, or _tcp_step below where the Python step runs), which stops at each
frame it does not handle; those go through the Python frame loop, whose tuples join the batch in capture order.
With the wire or dpkt parser every frame takes the Python frame loop, and its tuples join the batch.
"""

import struct

from probe.decode.fragments import FragmentReassembler
from probe.decode.link import ETH_IPV4, ETH_IPV6, LINK_DECODERS, LINK_NAMES
from probe.decode.parsers import make_parser, resolve
from probe.decode.tcpstream import TcpReassembler as PyTcpReassembler
from probe.errors import CaptureFileError
from probe.model import LINKTYPE_ETHERNET, TRANSPORT_TCP, TRANSPORT_UDP, FrameBatch, M
from probe.native import load, say_not_built

_decoderec = load("probe.decode._decoderec")
_tcpstream = load("probe.decode._tcpstream")
_records = load("probe._records")

_IP4 = struct.Struct("!BxHHHBBH").unpack_from  # vihl, total length, id, flags/frag, ttl, proto, csum
_IP6 = struct.Struct("!HBB").unpack_from  # payload length, next header, hop limit (from offset 4)
_UDP = struct.Struct("!HHHH").unpack_from
_TCP = struct.Struct("!HHIIBB").unpack_from  # sport, dport, seq, ack, data offset, flags
# Fast paths for the common frames, one unpack each: Ethernet + IPv4 (no options) + UDP, and
# Ethernet + IPv6 (no extension headers) + UDP.
_ETH_IP4_UDP = struct.Struct("!12xHBxHxxHBBxx4s4sHHHH").unpack_from
_ETH_IP6_UDP = struct.Struct("!12xHB3xHBB16s16sHHHH").unpack_from

_FLAGS, _MALFORMED = M.FLAGS, M.MALFORMED
# A packet's transport is its IP protocol; its match scope is the protocol itself (probe.model NET_FIELDS).
_UDP_T, _TCP_T = TRANSPORT_UDP, TRANSPORT_TCP
PROTO_TCP = 6
PROTO_UDP = 17
PROTO_ICMP = 1
PROTO_ICMPV6 = 58
# IPv6 extension headers walked to reach the transport header.
_IP6_EXT = frozenset((0, 43, 60, 135, 139, 140))
_IP6_FRAG = 44
_IP6_AH = 51
TCP_RST = 0x04
# ICMP errors kept as C-DNS address events (RFC 8618 7.7): (protocol, ICMP type) -> (event type, stats counter).
# The event's address is the destination of the packet quoted in the error (the client the server tried to
# reach), or the sender of the error when the quote is too short, as compactor does.
ICMP_EVENTS = {
    (PROTO_ICMP, 3): (2, "icmp_unreachable"),  # icmp-dest-unreachable
    (PROTO_ICMP, 11): (1, "icmp_other_errors"),  # icmp-time-exceeded
    (PROTO_ICMPV6, 1): (4, "icmp_unreachable"),  # icmpv6-dest-unreachable
    (PROTO_ICMPV6, 2): (5, "icmp_other_errors"),  # icmpv6-packet-too-big
    (PROTO_ICMPV6, 3): (3, "icmp_other_errors"),  # icmpv6-time-exceeded
}
AE_TCP_RESET = 0


def packed(batch):
    """The batch's frames as a probe._records.Frames, what the C frame loop reads: FrameBatch.packed, or its
    three lists packed (the frames then held by the Frames)."""
    if batch.packed is not None and not batch.has_lists:
        return batch.packed
    frames = _records.Frames()
    frames.extend(list(batch.ts_ns), list(batch.wirelen), list(batch.data))
    return frames


class PacketDecoder:
    """Stateful decoder for one worker: fragment and TCP reassembly persist across batches."""

    def __init__(self, decode_cfg, dns_ports, stats, ip_filter=None, keep_raw=True, share=None):
        """keep_raw: fill the raw field of the messages (probe.model.DNS_FIELDS); False leaves it None, which
        saves a copy of every message where the exporter never reads it (only C-DNS does)."""
        self.stats = stats
        self.ports = frozenset(dns_ports)
        # IP allow/deny lists (probe.decode.ipfilter.IpFilter): (src, dst) -> keep?, per family; None: not filtered.
        self.keep4 = ip_filter.keep4 if ip_filter else None
        self.keep6 = ip_filter.keep6 if ip_filter else None
        self.frags = FragmentReassembler(
            int(decode_cfg.fragment_timeout * 1e9), decode_cfg.fragment_max_datagrams, decode_cfg.fragment_max_bytes,
            stats,
        )
        # The parser that runs (fast, wire or dpkt; decode.parser auto resolved), for the statistics.
        self.parser = resolve(decode_cfg.parser)
        # The TCP stream step: its C twin with the C parser (the Python one, tcpstream.py, is the reference that
        # the wire and dpkt parsers keep, as they keep the Python walker).
        reassembler = PyTcpReassembler
        if self.parser == "fast":
            if _tcpstream is None:
                say_not_built("probe.decode._tcpstream")
            else:
                reassembler = _tcpstream.TcpReassembler
        self.tcp = reassembler(
            int(decode_cfg.tcp_idle_timeout * 1e9),
            decode_cfg.tcp_max_streams,
            decode_cfg.tcp_max_ooo_bytes,
            decode_cfg.tcp_max_ooo_segments,
            stats,
            decode_cfg.tcp_max_bytes,
        )
        # The tcp argument of the C frame loop: the C step is called from C directly, with _reset_seen for a
        # RST first, as _tcp_step does (probe/decode/_decoderec.c); the Python step through _tcp_step.
        self._c_tcp = (self.tcp, self._reset_seen) if reassembler is not PyTcpReassembler else self._tcp_step
        self.parse = make_parser(self.parser, stats, keep_raw).parse
        # decode_into runs the C frame loop (probe/decode/_decoderec.c): the C parser, and it is built.
        self.c_frame_loop = self.parser == "fast" and _decoderec is not None and _records is not None
        if self.c_frame_loop:
            portmap = bytearray(8192)  # bit p: port p carries DNS
            for port in self.ports:
                if 0 <= port < 65536:
                    portmap[port >> 3] |= 1 << (port & 7)
            self._portmap = bytes(portmap)
        self.keep_raw = keep_raw
        # (k, n): this decoder is worker k of n and decodes only the flows that hash to k (_share_of); None: all.
        self.share = share
        self.now_ns = 0
        self._next_sweep = 0
        # C-DNS address events since the exporter last took them: (type, code, address, ip version) -> count.
        self.address_events = {}

    def decode(self, batch, source_name="input"):
        """The messages of the batch's frames, as a list of message tuples (probe.model MESSAGE_FIELDS): the
        Python reference."""
        link = self._link(batch, source_name)
        whole, batch = batch, self._share_of(batch)
        out = []
        counts = [0, 0, 0, 0, 0]  # bytes, non_ip, non_dns, truncated_frames, ip_filtered
        self._frames(link, batch.linktype == LINKTYPE_ETHERNET, batch.ts_ns, batch.wirelen, batch.data, out, counts)
        self._count(out)
        self._account(whole, len(batch), counts)
        return out

    def decode_into(self, batch, out, source_name="input"):
        """The messages of the batch's frames appended to `out`, a probe._records.MsgBatch, as records: the
        production pipeline. The C frame loop (probe/decode/_decoderec.c, decode.parser fast) takes the common
        frames; the others, and every frame with the wire or dpkt parser, take the Python frame loop, whose
        tuples join the batch in capture order."""
        link = self._link(batch, source_name)
        whole, batch = batch, self._share_of(batch)
        counts = [0, 0, 0, 0, 0]
        if batch.linktype == LINKTYPE_ETHERNET and self.c_frame_loop:
            self._decode_packed(packed(batch), link, out, counts)
        else:
            msgs = []
            self._frames(link, batch.linktype == LINKTYPE_ETHERNET, batch.ts_ns, batch.wirelen, batch.data, msgs,
                         counts)
            self._count(msgs)
            out.extend(msgs)
        self._account(whole, len(batch), counts)

    def _share_of(self, batch):
        """The frames of the batch that are this worker's (share: (k, n), `dnsprobe read --workers n`): those whose
        IP address pair hashes to k (include/wire.h flow_hash); the whole batch when there is no share. The pcap
        reader may have kept only them already (batch.share)."""
        if batch.share is not None:
            if batch.share != self.share:
                raise ValueError(f"a batch of read worker {batch.share} given to the decoder of worker {self.share}")
            return batch
        if self.share is None or not len(batch):
            return batch
        k, n = self.share
        return FrameBatch(batch.linktype, packed=_decoderec.select_share(packed(batch), batch.linktype, k, n))

    def _link(self, batch, source_name):
        link = LINK_DECODERS.get(batch.linktype)
        if link is None:
            raise CaptureFileError(
                source_name,
                f"unsupported link type {batch.linktype} (supported: "
                + ", ".join(f"{k} {v}" for k, v in sorted(LINK_NAMES.items()))
                + ")",
            )
        return link

    def _account(self, batch, kept, counts):
        """Add a batch's counts to the statistics (its `kept` frames: all but those of other workers); advance the
        capture clock (expiry of fragments and TCP) with every frame of it, so that it runs as in one worker."""
        stats = self.stats
        n = batch.frames_read()
        stats.packets += kept
        stats.bytes += counts[0]
        stats.non_ip += counts[1]
        stats.non_dns += counts[2]
        stats.truncated_frames += counts[3]
        stats.ip_filtered += counts[4]
        if n:
            last = batch.last_ts()
            if last > self.now_ns:
                self.now_ns = last
            if self.now_ns >= self._next_sweep:
                self.frags.expire(self.now_ns)
                self.tcp.expire(self.now_ns)
                self._next_sweep = self.now_ns + 1_000_000_000

    def _decode_packed(self, frames, link, out, counts):
        """The C frame loop of probe.decode._decoderec over the packed frames, the runs it leaves through _frames
        (made objects for the Python code, and only they)."""
        c_counts = [0, 0, 0, 0, 0]
        i, n = 0, len(frames)
        args = (out, self._portmap, self.keep4, self.keep6, c_counts, self._c_tcp, self.keep_raw)
        decode = _decoderec.decode_packed
        while True:
            i, j = decode(frames, i, *args)
            if i >= n:
                break
            msgs = []
            self._frames(link, True, *frames.lists(i, j), msgs, counts)
            self._count(msgs)
            out.extend(msgs)
            i = j
        self._add_c_counts(counts, c_counts)

    def _add_c_counts(self, counts, c_counts):
        counts[0] += c_counts[0]
        counts[4] += c_counts[4]
        stats = self.stats
        stats.dns_messages += c_counts[1]
        stats.responses += c_counts[2]
        stats.queries += c_counts[1] - c_counts[2]
        stats.malformed += c_counts[3]

    def _frames(self, link, fast, ts_list, wl_list, data_list, out, counts):
        """Decode frames in Python, appending their messages to out; adds to counts (see decode)."""
        ports = self.ports
        non_ip = non_dns = damaged = filtered = 0
        keep4, keep6 = self.keep4, self.keep6
        nbytes = 0
        ip4 = self._ipv4
        ip6 = self._ipv6
        parse = self.parse
        append = out.append
        for ts, wirelen, frame in zip(ts_list, wl_list, data_list):
            nbytes += wirelen
            try:
                if fast:
                    # Common case first: untagged Ethernet, IP without options/extensions, UDP, DNS port.
                    # (Shorter frames, e.g. unpadded tiny fragments, take the general path.)
                    if frame[12] == 0x08 and frame[13] == 0x00 and len(frame) >= 42:
                        etype, vihl, total, frag, ttl, proto, src, dst, sport, dport, ulen, csum = _ETH_IP4_UDP(
                            frame
                        )
                        if (
                            vihl == 0x45
                            and proto == PROTO_UDP
                            and not frag & 0x3FFF
                            and (sport in ports or dport in ports)
                            and 8 <= ulen <= total - 20
                            and ulen <= len(frame) - 34
                            and (keep4 is None or keep4(src, dst))
                        ):
                            append(
                                (ts, wirelen, 4, PROTO_UDP, src, sport, dst, dport, ttl, csum,
                                 None, None, _UDP_T, PROTO_UDP, None)
                                + parse(frame[42 : 34 + ulen])
                            )
                            continue
                    elif frame[12] == 0x86 and frame[13] == 0xDD and len(frame) >= 62:
                        etype, vtc, plen, nxt, hlim, src, dst, sport, dport, ulen, csum = _ETH_IP6_UDP(frame)
                        if (
                            vtc >> 4 == 6
                            and nxt == PROTO_UDP
                            and (sport in ports or dport in ports)
                            and 8 <= ulen <= plen
                            and ulen <= len(frame) - 54
                            and (keep6 is None or keep6(src, dst))
                        ):
                            append(
                                (ts, wirelen, 6, PROTO_UDP, src, sport, dst, dport, hlim, csum,
                                 None, None, _UDP_T, PROTO_UDP, None)
                                + parse(frame[62 : 54 + ulen])
                            )
                            continue
                etype, off, vlan = link(frame)
                if etype == ETH_IPV4:
                    r = ip4(frame, off, ts, wirelen, vlan, ports, out)
                elif etype == ETH_IPV6:
                    r = ip6(frame, off, ts, wirelen, vlan, ports, out)
                else:
                    non_ip += 1
                    continue
            except (IndexError, struct.error):
                damaged += 1
                continue
            if r == 1:
                non_dns += 1
            elif r == 2:
                damaged += 1
            elif r == 4:
                filtered += 1
        counts[0] += nbytes
        counts[1] += non_ip
        counts[2] += non_dns
        counts[3] += damaged
        counts[4] += filtered

    def _count(self, msgs):
        stats = self.stats
        stats.dns_messages += len(msgs)
        responses = 0
        malformed = 0
        for m in msgs:
            flags = m[_FLAGS]
            if flags is not None and flags & 0x8000:
                responses += 1
            if m[_MALFORMED]:
                malformed += 1
        stats.responses += responses
        stats.queries += len(msgs) - responses
        stats.malformed += malformed

    # Return codes of the per-packet helpers: 0 DNS (or held for reassembly), 1 not DNS, 2 damaged,
    # 3 counted by the helper itself, 4 dropped by the IP lists (checked first, as DNS Probe does).

    def _ipv4(self, frame, off, ts, wirelen, vlan, ports, out):
        vihl, total, ident, frag, ttl, proto, _ = _IP4(frame, off)
        if vihl >> 4 != 4:
            return 2
        hl = (vihl & 0x0F) * 4
        if hl < 20 or total < hl:
            return 2
        if self.keep4 is not None and not self.keep4(frame[off + 12 : off + 16], frame[off + 16 : off + 20]):
            return 4
        if proto != PROTO_UDP and proto != PROTO_TCP:
            return self._other(proto, frame, off + hl, off + total, 4, frame[off + 12 : off + 16])
        src = frame[off + 12 : off + 16]
        dst = frame[off + 16 : off + 20]
        payload = frame[off + hl : off + total]
        if len(payload) < total - hl:
            return 2  # cut by the snaplen
        if frag & 0x3FFF:
            done = self.frags.add(
                (4, src, dst, proto, ident), ts, wirelen, (frag & 0x1FFF) * 8, frag & 0x2000, payload, ttl, vlan
            )
            if done is None:
                return 0
            payload, ts, wirelen, ttl, vlan = done
        return self._transport(4, proto, src, dst, payload, ts, wirelen, ttl, vlan, ports, out)

    def _ipv6(self, frame, off, ts, wirelen, vlan, ports, out):
        if frame[off] >> 4 != 6:
            return 2
        plen, nxt, hlim = _IP6(frame, off + 4)
        src = frame[off + 8 : off + 24]
        dst = frame[off + 24 : off + 40]
        if self.keep6 is not None and not self.keep6(src, dst):
            return 4
        pos = off + 40
        end = pos + plen if plen else len(frame)
        if end > len(frame):
            return 2
        frag = None
        while True:
            if nxt in _IP6_EXT:
                nxt, hlen = frame[pos], (frame[pos + 1] + 1) * 8
            elif nxt == _IP6_AH:
                nxt, hlen = frame[pos], (frame[pos + 1] + 2) * 4
            elif nxt == _IP6_FRAG:
                fo, ident = struct.unpack_from("!HI", frame, pos + 2)
                frag = (fo & 0xFFF8, fo & 1, ident)
                nxt, hlen = frame[pos], 8
            else:
                break
            pos += hlen
            if pos > end:
                return 2
        if nxt != PROTO_UDP and nxt != PROTO_TCP:
            return self._other(nxt, frame, pos, end, 6, src)
        payload = frame[pos:end]
        if frag is not None:
            offset, more, ident = frag
            done = self.frags.add((6, src, dst, nxt, ident), ts, wirelen, offset, more, payload, hlim, vlan)
            if done is None:
                return 0
            payload, ts, wirelen, hlim, vlan = done
        return self._transport(6, nxt, src, dst, payload, ts, wirelen, hlim, vlan, ports, out)

    def _other(self, proto, frame, pos, end, ipv, src):
        """Not UDP/TCP. ICMP/ICMPv6 errors get their own counters and become C-DNS address events (as
        compactor reports them, rather than as non-DNS packets)."""
        if proto != PROTO_ICMP and proto != PROTO_ICMPV6:
            return 1
        event = ICMP_EVENTS.get((proto, frame[pos]))
        if event is None:
            return 1
        ae_type, counter = event
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        quoted = pos + 8  # the IP header of the packet that caused the error
        end = min(end, len(frame))
        if ipv == 4 and end - quoted >= 20 and frame[quoted] >> 4 == 4:
            src = frame[quoted + 16 : quoted + 20]
        elif ipv == 6 and end - quoted >= 40 and frame[quoted] >> 4 == 6:
            src = frame[quoted + 24 : quoted + 40]
        self._event(ae_type, frame[pos + 1], src, ipv)
        return 3

    def _event(self, ae_type, code, address, ipv):
        key = (ae_type, code, address, ipv)
        events = self.address_events
        events[key] = events.get(key, 0) + 1

    def _transport(self, ipv, proto, src, dst, payload, ts, wirelen, ttl, vlan, ports, out):
        if proto == PROTO_UDP:
            sport, dport, ulen, csum = _UDP(payload, 0)
            if sport not in ports and dport not in ports:
                return 1
            if ulen < 8 or ulen > len(payload):
                return 2
            net = (ts, wirelen, ipv, PROTO_UDP, src, sport, dst, dport, ttl, csum, vlan, None, _UDP_T, PROTO_UDP,
                   None)
            out.append(net + self.parse(payload[8:ulen]))
            return 0
        if proto == PROTO_TCP:
            sport, dport, seq, _, doff, flags = _TCP(payload, 0)
            if sport not in ports and dport not in ports:
                return 1
            hl = (doff >> 4) * 4
            if hl < 20 or hl > len(payload):
                if flags & TCP_RST:
                    self._reset_seen(src, ipv)
                return 2
            msgs = self._tcp_step(ipv, (src, sport, dst, dport), ts, wirelen, ttl, seq, flags, payload[hl:])
            # (The C frame loop does the part above in C, then the step (_c_tcp), and the part below in C.)
            for data, mts, mwl, mttl, rtt in msgs:
                net = (mts, mwl, ipv, PROTO_TCP, src, sport, dst, dport, mttl, 0, vlan, rtt, _TCP_T, PROTO_TCP,
                       None)
                out.append(net + self.parse(data))
            return 0
        return 1

    def _tcp_step(self, ipv, key, ts, wirelen, ttl, seq, flags, payload):
        """A TCP segment whose headers passed the checks (by _transport, or in C by decode_packed in
        _decoderec.c): its RST count and address event, then its stream step. Returns the completed
        messages as the reassembler's segment does (tcpstream.py, or its C twin _tcpstream.c)."""
        if flags & TCP_RST:
            self._reset_seen(key[0], ipv)
        return self.tcp.segment(key, ts, wirelen, ttl, seq, flags, payload)

    def _reset_seen(self, src, ipv):
        """A TCP RST on a DNS port: counted, and a C-DNS address event for its source."""
        self.stats.tcp_resets += 1
        self._event(AE_TCP_RESET, 0, src, ipv)

    def flush(self):
        """End of input: drop incomplete fragments and TCP buffers (counted)."""
        self.frags.flush()
        self.tcp.flush()
