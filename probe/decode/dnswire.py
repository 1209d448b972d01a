"""Fast DNS message walker: header, question, every RR's framing, and the OPT RR in full.

Why not dpkt for every message: dpkt builds an object per RR (about 40k messages/s) and raises on RR
types it does not know (RRSIG, DNSKEY, HTTPS, SVCB, CAA, unassigned types), which are common in real
responses. This walker reads only what the output needs, never interprets RDATA except OPT (and the
type of the last answer, which closes zone transfers), so unknown types cost nothing. dpkt remains
the parser of record: `probe.decode.dpkt_parser` produces the same tuple with dpkt, and the tests
check that both agree on every message dpkt can parse.

The result is a plain tuple (see DNS_FIELDS) so that a batch of messages transposes into columns.
"""

import struct

from probe.model import EDNS_FIELDS

_HDR = struct.Struct("!HHHHHH").unpack_from
_RR = struct.Struct("!HHIH").unpack_from
_HH = struct.Struct("!HH").unpack_from
_TYPE_RDLEN = struct.Struct("!H6xH").unpack_from
_CLASS_TTL = struct.Struct("!HI").unpack_from

TYPE_OPT = 41
TYPE_SOA = 6
MAX_NAME = 255  # RFC 1035 limit on a name's wire length, also enforced by dpkt

# EDNS option codes read individually (IANA "DNS EDNS0 Option Codes").
OPT_NSID = 3
OPT_DAU = 5
OPT_DHU = 6
OPT_N3U = 7
OPT_ECS = 8
OPT_COOKIE = 10
OPT_EDE = 15
# DNS Probe's edns_other lists the codes of options with a payload, except these.
_NOT_OTHER = frozenset((OPT_NSID, OPT_DAU, OPT_DHU, OPT_N3U))


class Malformed(Exception):
    """Raised inside the walker; the message is then kept with its malformed flag set."""


def name_text(labels):
    """Presentation used by DNS Probe's qname: label bytes joined by '.', no trailing dot.

    Bytes that are not UTF-8 are written as \\xNN escapes (dpkt raises on them instead).
    """
    return b".".join(labels).decode("utf-8", "backslashreplace")


def read_name(buf, off):
    """Read a possibly compressed name. Returns (labels, offset after the name in the message)."""
    labels = []
    end = None
    total = 0
    start = off
    while True:
        n = buf[off]
        if n == 0:
            off += 1
            break
        if n >= 0xC0:
            ptr = ((n & 0x3F) << 8) | buf[off + 1]
            if ptr >= start:  # only backward pointers, so no loops (as dpkt)
                raise Malformed("compression pointer does not point backwards")
            if end is None:
                end = off + 2
            start = off = ptr
            continue
        if n & 0xC0:
            raise Malformed(f"unsupported label type 0x{n:02x}")
        total += n + 1
        if total > MAX_NAME:
            raise Malformed("name longer than 255 bytes")
        label = buf[off + 1 : off + 1 + n]
        if len(label) != n:
            raise Malformed("name runs past the end of the message")
        labels.append(label)
        off += n + 1
    return labels, (off if end is None else end)


def read_rr(buf, off):
    """The RR at off: (its owner's labels, type, class, TTL, where its RDATA starts, where it ends: the next RR)."""
    labels, off = read_name(buf, off)
    rtype, rclass, ttl, rdlen = _RR(buf, off)
    start = off + 10
    return labels, rtype, rclass, ttl, start, start + rdlen


def skip_name(buf, off):
    start = off
    n = buf[off]
    while 0 < n < 64:
        off += n + 1
        n = buf[off]
    if n == 0:
        return off + 1
    if n >= 0xC0:
        # The pointer is not followed, but it must point before this name (as dpkt checks): a forward
        # or self-pointer is a malformed name. A chain of pointers is not walked.
        if ((n & 0x3F) << 8) | buf[off + 1] >= start:
            raise Malformed("compression pointer does not point backwards")
        return off + 2
    raise Malformed(f"unsupported label type 0x{n:02x}")


def _algorithms(value):
    return ",".join(map(str, value))


def _ecs(value):
    """EDNS client subnet option (RFC 7871) as 'address/source-prefix'."""
    if len(value) < 4:
        raise Malformed("short client-subnet option")
    family, source, _scope = struct.unpack_from("!HBB", value)
    addr = value[4:]
    if family == 1 and len(addr) <= 4:
        return ".".join(str(b) for b in addr.ljust(4, b"\0")) + f"/{source}"
    if family == 2 and len(addr) <= 16:
        import ipaddress

        return f"{ipaddress.IPv6Address(addr.ljust(16, bytes(1)))}/{source}"
    raise Malformed(f"bad client-subnet family {family} or address length {len(addr)}")


def parse_opt(buf, rclass, ttl, start, end):
    """Decode an OPT RR (RFC 6891) into the EDNS tuple (see EDNS_FIELDS)."""
    if start == end:  # no options: the common case, no loop
        return (rclass, (ttl >> 16) & 0xFF, bool(ttl & 0x8000), ttl >> 24, "", "", "", "", "", "", (), False, b"")
    nsid = dau = dhu = n3u = ecs = ""
    other = []
    ede = []
    cookie = False
    pos = start
    while pos < end:
        if pos + 4 > end:
            raise Malformed("truncated EDNS option header")
        code, olen = _HH(buf, pos)
        pos += 4
        value = buf[pos : pos + olen]
        pos += olen
        if pos > end:
            raise Malformed(f"EDNS option {code} runs past the OPT record")
        if code == OPT_NSID:
            nsid = value.decode("utf-8", "backslashreplace")
        elif code == OPT_DAU:
            dau = _algorithms(value)
        elif code == OPT_DHU:
            dhu = _algorithms(value)
        elif code == OPT_N3U:
            n3u = _algorithms(value)
        elif code == OPT_ECS:
            ecs = _ecs(value)
        elif code == OPT_EDE:
            if olen < 2:
                raise Malformed("short extended-error option")
            ede.append((value[0] << 8) | value[1])
        elif code == OPT_COOKIE:
            cookie = True
        if olen and code not in _NOT_OTHER:
            other.append(str(code))
    return (
        rclass,  # udp payload size
        (ttl >> 16) & 0xFF,  # version
        bool(ttl & 0x8000),  # DO
        ttl >> 24,  # extended rcode (upper 8 bits)
        nsid,
        dau,
        dhu,
        n3u,
        ecs,
        ",".join(other),
        tuple(ede),
        cookie,
        bytes(buf[start:end]),
    )


assert len(EDNS_FIELDS) == 13


def walk_rrs(buf, off, count, additional):
    """Step over `count` RRs. Returns (offset after them, type of the last RR, EDNS tuple or None).

    Only in the additional section (additional=True) is an OPT RR decoded. The name loop is inlined
    because this is the hottest loop of the decoder; an RR running past the end shows up as
    IndexError/struct.error on the next read or as offset > length at the end.
    """
    rtype = edns = None
    for _ in range(count):
        start = off
        ln = buf[off]
        while 0 < ln < 64:
            off += ln + 1
            ln = buf[off]
        if ln >= 0xC0:
            if ((ln & 0x3F) << 8) | buf[off + 1] >= start:  # forward or self pointer (dpkt's rule)
                raise Malformed("compression pointer does not point backwards")
            off += 2
        elif ln:
            raise Malformed(f"unsupported label type 0x{ln:02x}")
        else:
            off += 1
        rtype, rdlen = _TYPE_RDLEN(buf, off)
        off += 10 + rdlen
        if rtype == TYPE_OPT and additional and edns is None:
            if off > len(buf):
                raise Malformed("OPT record runs past the end of the message")
            rclass, ttl = _CLASS_TTL(buf, off - rdlen - 8)
            edns = parse_opt(buf, rclass, ttl, off - rdlen, off)
    return off, rtype, edns


def parse_message(buf, names=None):
    """Walk one DNS message. Never raises; returns the DNS tuple (see probe.model.DNS_FIELDS).

    names: optional dict used as a cache from a question's wire-format name to (text, labels);
    names repeat heavily in DNS traffic, so a worker passes one (see MessageParser).
    """
    n = len(buf)
    if n < 12:
        return (n, None, None, None, None, None, None, None, None, None, None, None, True, None, buf)
    mid, flags, qd, an, ns, ar = _HDR(buf, 0)
    qname = qtype = qclass = labels = edns = last_an = None
    try:
        off = 12
        if qd:
            # Usual case: an uncompressed first question. Find its end, then its text (cached).
            ln = buf[12]
            while 0 < ln < 64:
                off += ln + 1
                ln = buf[off]
            if ln == 0 and off - 12 < MAX_NAME:
                wire = buf[12 : off + 1]
                off += 1
                cached = names.get(wire) if names is not None else None
                if cached is None:
                    cached = _name_from_wire(wire)
                    if names is not None:
                        names[wire] = cached
                qname, labels = cached
            else:
                parts, off = read_name(buf, 12)
                qname = b".".join(parts).decode("utf-8", "backslashreplace")
                labels = len(parts)
            qtype, qclass = _HH(buf, off)
            off += 4
            if qd > 1:
                for _ in range(qd - 1):
                    off = skip_name(buf, off) + 4
        if off > n:
            raise Malformed("question runs past the end of the message")
        if an:
            off, last_an, _ = walk_rrs(buf, off, an, False)
        if ns:
            off = walk_rrs(buf, off, ns, False)[0]
        if ar:
            off, _, edns = walk_rrs(buf, off, ar, True)
        if off > n:
            raise Malformed("resource record runs past the end of the message")
    except (Malformed, IndexError, struct.error, UnicodeError):
        return (n, mid, flags, qd, an, ns, ar, qname, qtype, qclass, labels, edns, True, last_an, buf)
    return (n, mid, flags, qd, an, ns, ar, qname, qtype, qclass, labels, edns, False, last_an, buf)


def _name_from_wire(wire):
    """(text, label count) of an uncompressed wire-format name that ends with its root label."""
    parts = []
    off = 0
    ln = wire[0]
    while ln:
        parts.append(wire[off + 1 : off + 1 + ln])
        off += ln + 1
        ln = wire[off]
    return b".".join(parts).decode("utf-8", "backslashreplace"), len(parts)


class MessageParser:
    """parse_message with a bounded per-worker cache of question names."""

    def __init__(self, max_names=100_000):
        self.names = {}
        self.max_names = max_names

    def parse(self, buf):
        if len(self.names) > self.max_names:
            self.names.clear()
        return parse_message(buf, self.names)
