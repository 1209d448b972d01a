"""Rebuild a pcap of the DNS messages recorded in C-DNS files (as compactor's inspector does).

Needs the full sections (the storage hints of every block parameters must declare the extra questions
and the answer, authority and additional sections of queries and responses); otherwise it is an error
that names the missing sections. Each Q/R item gives its query and/or response:

- DNS: header from the transaction id, the query OPCODE, the DNS flags and the RCODE (low 4 bits; the
  extended bits go in the OPT); the first question from the item's name and the signature's class/type
  (unless the signature says there was none); then the recorded extra questions and RR sections,
  owner names compressed against earlier names, RDATA as recorded (names inside it uncompressed). The
  query's OPT comes from the signature (UDP size, EDNS version, DO, extended RCODE, OPT RDATA) unless the
  query's additional section already holds one; a response that had an OPT which was not recorded gets
  one made up as compactor does (no RDATA, the query's UDP size and version, DO echoed).
- Transport: UDP, or TCP (also for DoT/DoH, as compactor) with a handshake the first time a connection
  (client, port, server, port) is seen and continuing sequence numbers after it; over IPv4 or IPv6 with
  the recorded addresses, ports and client hop limit (64 where not recorded); Ethernet frames with zero
  MAC addresses, in a nanosecond pcap. Malformed messages are written with their recorded bytes.
- Packets are written in time order within each block (a block is bounded by max-block-items), except
  that a response never goes before its query: with a negative response delay (packets captured out of
  order) the response follows its query, as it did in the original capture.
"""

import struct
from pathlib import Path

from export.cdns import format as F
from export.cdns.blockdecode import TYPE_OPT
from export.cdns.reader import CdnsFile
from probe.errors import CaptureFileError, OutputError
from probe.model import M

_PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1)  # nanosecond pcap, Ethernet
_ETH4 = bytes(12) + b"\x08\x00"
_ETH6 = bytes(12) + b"\x86\xdd"
_MAX_TCP_PAYLOAD = 65000
_MAX_CONNECTIONS = 100_000
_DEFAULT_HOP = 64


def _checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ip_frame(src, dst, proto, transport, hop):
    """Ethernet + IPv4/IPv6 frame around a transport segment whose checksum field (at 6 for UDP, 16 for TCP)
    is zero; the checksum is filled in here."""
    length = len(transport)
    if len(src) == 16:
        pseudo = src + dst + struct.pack("!IxxxB", length, proto)
        ip = struct.pack("!IHBB", 0x60000000, length, proto, hop) + src + dst
        eth = _ETH6
    else:
        pseudo = src + dst + struct.pack("!xBH", proto, length)
        head = struct.pack("!BBHHHBBH", 0x45, 0, 20 + length, 0, 0x4000, hop, proto, 0) + src + dst
        ip = head[:10] + struct.pack("!H", _checksum(head)) + head[12:]
        eth = _ETH4
    at = 6 if proto == 17 else 16
    csum = _checksum(pseudo + transport) or (0xFFFF if proto == 17 else 0)
    return eth + ip + transport[:at] + struct.pack("!H", csum) + transport[at + 2 :]


def _put_name(out, wire, seen):
    """Append a wire-format name to the message, compressed against the names already in it."""
    pos = 0
    while pos < len(wire) and wire[pos]:
        suffix = wire[pos:]
        at = seen.get(suffix)
        if at is not None:
            out += struct.pack("!H", 0xC000 | at)
            return
        if len(out) < 0x4000:
            seen[suffix] = len(out)
        if wire[pos] >= 64:  # not a plain label: no compression for the rest
            break
        end = pos + wire[pos] + 1
        out += wire[pos:end]
        pos = end
    out += wire[pos:] if pos < len(wire) else b"\0"


def dns_message(mid, flags, questions, answers, authority, additional):
    """Wire form of a DNS message; questions are (name, type, class), RRs (name, type, class, ttl, rdata)."""
    out = bytearray(struct.pack("!6H", (mid or 0) & 0xFFFF, flags & 0xFFFF, len(questions), len(answers),
                                len(authority), len(additional)))
    seen = {}
    for name, qtype, qclass in questions:
        _put_name(out, name, seen)
        out += struct.pack("!HH", qtype or 0, qclass or 0)
    for section in (answers, authority, additional):
        for name, rtype, rclass, ttl, rdata in section:
            _put_name(out, name, seen)
            layout = _COMPRESSIBLE.get(rtype)
            if layout is None:
                out += struct.pack("!HHIH", rtype or 0, rclass or 0, (ttl or 0) & 0xFFFFFFFF, len(rdata)) + rdata
                continue
            out += struct.pack("!HHIH", rtype, rclass or 0, (ttl or 0) & 0xFFFFFFFF, 0)
            start = len(out)
            _put_rdata(out, rdata, layout, seen)
            out[start - 2 : start] = struct.pack("!H", len(out) - start)
    return bytes(out)


# The RR types whose RDATA names a server may compress (RFC 1035's, RFC 3597 section 4); their layout is in
# export.cdns.format.RDATA_NAME_LAYOUT. The names in the RDATA of other types stay as recorded (uncompressed).
_COMPRESSIBLE = {t: F.RDATA_NAME_LAYOUT[t] for t in (2, 3, 4, 5, 6, 7, 8, 9, 12, 14, 15)}


def _put_rdata(out, rdata, layout, seen):
    """RDATA with its names compressed like owner names (what does not fit the layout copied as is)."""
    pos = 0
    for part in layout:
        if isinstance(part, int):
            out += rdata[pos : pos + part]
            pos += part
            continue
        end = pos
        while end < len(rdata) and 0 < rdata[end] < 64:
            end += rdata[end] + 1
        if part != "N" or end >= len(rdata) or rdata[end]:  # only names here; else copy the rest unchanged
            break
        _put_name(out, rdata[pos : end + 1], seen)
        pos = end + 1
    out += rdata[pos:]


def _messages(q, r, extra):
    """(message tuple, DNS bytes) of the query and the response of one item."""
    if extra.payload is not None:  # a malformed message: its recorded bytes
        return [(q or r, extra.payload)]
    out = []
    sflags = extra.sig_flags
    for msg, sec, no_question, response in ((q, extra.query, F.QR_QUERY_HAS_NO_QUESTION, False),
                                            (r, extra.response, F.QR_RESPONSE_HAS_NO_QUESTION, True)):
        if msg is None:
            continue
        extra_q, answers, authority, additional = (s or [] for s in sec)
        questions = [] if sflags & no_question or extra.first_question is None else [extra.first_question]
        additional = list(additional)
        has_opt = any(rr[1] == TYPE_OPT for rr in additional)
        if not response and extra.query_opt is not None and not has_opt:
            udp, ttl, rdata = extra.query_opt
            additional.append((b"\0", TYPE_OPT, udp, ttl, rdata))
        elif response and sflags & F.QR_RESPONSE_HAS_OPT and not has_opt:
            ttl = (extra.sig.get(F.RESPONSE_RCODE, 0) >> 4 & 0xFF) << 24
            ttl |= (extra.sig.get(F.QUERY_EDNS_VERSION, 0) & 0xFF) << 16
            ttl |= 0x8000 if extra.dns_flags & F.QUERY_DO else 0
            additional.append((b"\0", TYPE_OPT, extra.sig.get(F.QUERY_UDP_SIZE, 0), ttl, b""))
        flags = msg[M.FLAGS] if msg[M.FLAGS] is not None else (0x8000 if response else 0)
        out.append((msg, dns_message(msg[M.ID], flags, questions + extra_q, answers, authority, additional)))
    return out


class _PcapWriter:
    def __init__(self, fh):
        self.fh = fh
        self.seq = {}  # (src, sport, dst, dport) -> next sequence number; a key present = connection open
        self.packets = 0
        fh.write(_PCAP_HEADER)

    def _tcp(self, src, sport, dst, dport, flags, payload=b""):
        key = (src, sport, dst, dport)
        seq = self.seq.get(key, 0)
        ack = self.seq.get((dst, dport, src, sport), 0)
        self.seq[key] = (seq + len(payload) + (1 if flags & 0x02 else 0)) & 0xFFFFFFFF
        return struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload

    def frames(self, msg, dns, response):
        """Frames carrying one DNS message, in order."""
        src, dst = msg[M.SRC], msg[M.DST]
        v6 = msg[M.IPV] == 6
        zero = bytes(16 if v6 else 4)
        src, dst = src or zero, dst or zero
        sport = msg[M.SPORT] if msg[M.SPORT] is not None else (53 if response else 0)
        dport = msg[M.DPORT] if msg[M.DPORT] is not None else (0 if response else 53)
        hop = msg[M.TTL] if msg[M.TTL] is not None else _DEFAULT_HOP
        if msg[M.PROTO] != 6:
            udp = struct.pack("!HHHH", sport, dport, 8 + len(dns), 0) + dns
            return [_ip_frame(src, dst, 17, udp, hop)]
        if len(self.seq) > _MAX_CONNECTIONS:
            self.seq.clear()
        out = []
        client = (dst, dport, src, sport) if response else (src, sport, dst, dport)
        server = client[2:] + client[:2]
        if client not in self.seq:  # handshake: SYN, SYN/ACK, ACK
            self.seq[client] = self.seq[server] = 0
            out.append(_ip_frame(client[0], client[2], 6, self._tcp(*client, 0x02), hop))
            out.append(_ip_frame(server[0], server[2], 6, self._tcp(*server, 0x12), hop))
            out.append(_ip_frame(client[0], client[2], 6, self._tcp(*client, 0x10), hop))
        data = struct.pack("!H", len(dns)) + dns
        for at in range(0, len(data), _MAX_TCP_PAYLOAD):
            out.append(_ip_frame(src, dst, 6, self._tcp(src, sport, dst, dport, 0x18, data[at : at + _MAX_TCP_PAYLOAD]),
                                 hop))
        return out

    def write(self, ts_ns, frame):
        self.fh.write(struct.pack("<IIII", ts_ns // 1_000_000_000, ts_ns % 1_000_000_000, len(frame), len(frame)))
        self.fh.write(frame)
        self.packets += 1


def check_sections(cdns):
    for i, params in enumerate(cdns.block_parameters):
        missing = params.missing_sections()
        if missing:
            raise CaptureFileError(
                cdns.path, f"cannot rebuild DNS messages: the full sections were not recorded (block parameters {i}: "
                f"storage hints lack {', '.join(missing)})"
            )


def _block_frames(writer, items):
    """(sort time, order, message, frame) of every frame of a block's items, sorted by time; and the number
    of DNS messages."""
    frames = []
    messages = 0
    for q, r, extra in items:
        for msg, dns in _messages(q, r, extra):
            messages += 1
            response = msg is not q
            # A response never goes before its own query, even with a negative delay.
            when = max(msg[M.TS_NS], q[M.TS_NS]) if response and q is not None else msg[M.TS_NS]
            for frame in writer.frames(msg, dns, response):
                frames.append((when, len(frames), msg, frame))
    frames.sort()
    return frames, messages


def rebuild_pcap(paths, out_path):
    """Write the DNS messages of C-DNS files as one pcap. Returns (packets, messages).

    Raises CaptureFileError for a file that cannot be read (what was rebuilt before it stays written)."""
    out_path = Path(out_path)
    for path in paths:  # every file must have its sections before anything is written
        with CdnsFile(path) as cdns:
            check_sections(cdns)
    try:
        fh = open(out_path, "wb")
    except OSError as exc:
        raise OutputError(f"{out_path}: cannot write: {exc.strerror}") from None
    try:
        with fh:
            return _write_all(fh, paths)
    except OSError as exc:
        raise OutputError(f"{out_path}: cannot write: {exc.strerror or exc}") from None


def _write_all(fh, paths):
    messages = 0
    writer = _PcapWriter(fh)
    for path in paths:
        with CdnsFile(path) as cdns:
            for items in cdns.transactions(sections=True):
                try:
                    frames, count = _block_frames(writer, items)
                except (struct.error, TypeError, ValueError, OverflowError) as exc:
                    problem = f"block {cdns.blocks_read - 1}: a field has a value of the wrong type or size ({exc})"
                    raise CaptureFileError(path, problem) from None
                messages += count
                for _, _, msg, frame in frames:
                    writer.write(msg[M.TS_NS], frame)
    return writer.packets, messages
