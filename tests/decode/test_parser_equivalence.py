"""dpkt is the DNS parser of record: the fast wire walker must agree with it on every message.

Every DNS message of every capture under shared/data (DNS Probe's test pcaps, compactor's captures
including the knot-live and nsd-live server captures) is decoded the way `dnsprobe read` decodes it
(read_capture + PacketDecoder, so TCP and IP fragments are reassembled), then:

- dpkt parses it: probe.decode.dnswire.parse_message(buf) == probe.decode.dpkt_parser.from_dpkt(...).
- dpkt raises: the walker must not crash and must call the message malformed exactly when it really
  is. "Really" is decided by a lenient dpkt (LenientDNS below): dpkt's own header, question and RR
  framing and its name rules (label types, backward-only compression pointers, 255-byte limit), minus
  the two refusals that are not malformation: RR types dpkt does not implement (RRSIG, NSEC, DS,
  DNSKEY, HTTPS, ...; their RDATA is not interpreted, as the walker interprets none but OPT) and label
  bytes that are not UTF-8 (rendered with \\xNN escapes, as the walker does). RDATA running past the
  end of the message is malformed (dpkt 1.9.8 silently cuts it; from_dpkt checks it). Where the
  lenient parse succeeds, its tuple must equal the walker's.

Hand-made edge cases at the end pin each rule, including the one known difference: a label that
contains a '.' byte (dpkt returns the joined text, so from_dpkt can only count dots).
"""

import codecs
import collections
import struct
from pathlib import Path

import dpkt
import pytest
from support.data import COMPACTOR_DATA, DNSPROBE_DATA, needs_shared, shared_params
from support.stages import dns_messages

from probe.decode.dnswire import Malformed, parse_message
from probe.decode.dpkt_parser import from_dpkt
from probe.model import DNS_FIELDS

CAPTURES = sorted(
    p for p in list(DNSPROBE_DATA.rglob("*.pcap*")) + list(COMPACTOR_DATA.rglob("*.pcap*"))
    if not p.name.endswith(".info")
)
MALFORMED_IDX = DNS_FIELDS.index("malformed")
LABELS_IDX = DNS_FIELDS.index("labels")

# What dpkt 1.9.8 refuses that is not malformation.
DPKT_REFUSALS = (dpkt.UnpackError, UnicodeDecodeError, Malformed)


def _unpack_name(buf, off):
    """dpkt 1.9.8's dns.unpack_name, with label bytes decoded as dnsprobe does (backslashreplace)."""
    name = []
    saved_off = 0
    start_off = off
    name_length = 0
    while True:
        if off >= len(buf):
            raise dpkt.NeedData()
        n = buf[off]
        if n == 0:
            off += 1
            break
        elif (n & 0xC0) == 0xC0:
            ptr = struct.unpack(">H", buf[off : off + 2])[0] & 0x3FFF
            if ptr >= start_off:
                raise dpkt.UnpackError("Invalid label compression pointer")
            off += 2
            if not saved_off:
                saved_off = off
            start_off = off = ptr
        elif (n & 0xC0) == 0x00:
            off += 1
            name.append(buf[off : off + n])
            name_length += n + 1
            if name_length > 255:
                raise dpkt.UnpackError("name longer than 255 bytes")
            off += n
        else:
            raise dpkt.UnpackError(f"Invalid label length {n:02x}")
    if not saved_off:
        saved_off = off
    return codecs.decode(b".".join(name), "utf-8", "backslashreplace"), saved_off


class LenientDNS(dpkt.dns.DNS):
    """dpkt's DNS without its two refusals that are not malformation (see the module docstring)."""

    def unpack_q(self, buf, off):
        q = self.Q()
        q.name, off = _unpack_name(buf, off)
        q.type, q.cls = struct.unpack(">HH", buf[off : off + 4])  # struct.error → dpkt's UnpackError
        return q, off + 4

    def unpack_rr(self, buf, off):
        rr = self.RR()
        rr.name, off = _unpack_name(buf, off)
        rr.type, rr.cls, rr.ttl, rdlen = struct.unpack(">HHIH", buf[off : off + 10])
        off += 10
        rr.rdata = buf[off : off + rdlen]
        rr.rlen = rdlen
        return rr, off + rdlen  # RDATA not interpreted; from_dpkt reports RDATA cut short


def lenient_tuple(buf):
    """The DNS tuple by the lenient dpkt, or None when the message really is malformed."""
    try:
        return from_dpkt(LenientDNS(buf), buf)
    except (dpkt.UnpackError, Malformed):  # NeedData is an UnpackError
        return None


def check_message(buf, counts):
    """Compare walker and dpkt on one message; counts the outcome."""
    walker = parse_message(buf)  # never raises
    try:
        ref = from_dpkt(dpkt.dns.DNS(buf), buf)
    except DPKT_REFUSALS as exc:
        lenient = lenient_tuple(buf)
        if lenient is None:
            counts["dpkt raised: malformed"] += 1
            assert walker[MALFORMED_IDX] is True, (buf.hex(), exc, walker)
        else:
            counts["dpkt raised: not malformed (lenient equal)"] += 1
            assert walker == lenient, (buf.hex(), exc, walker, lenient)
        return
    counts["dpkt parsed: equal"] += 1
    assert walker == ref, (buf.hex(), walker, ref)


@needs_shared
def test_captures_found():
    names = {p.name for p in CAPTURES}
    assert {"knot-live.raw.pcap.xz", "nsd-live.raw.pcap.xz", "udp_simple.pcap", "tcp_axfr_zone_transfer.pcap",
            "malformed.pcap.xz", "edns_dnssec_nsid.pcap"} <= names
    assert len(CAPTURES) == 15


# Messages per capture and how many of them are really malformed (checked exactly: the data is fixed).
# knot-live: two queries with QNAMEs over 255 bytes; nsd-live: three (frames 11109, 15402, 17767);
# malformed.pcap: a 6-byte message and one whose question runs past its end.
EXPECTED = {
    "knot-live.raw.pcap.xz": (16531, 2),
    "nsd-live.raw.pcap.xz": (20864, 3),
    "malformed.pcap.xz": (24, 2),
    "udp_simple.pcap": (184, 0),
    "edns_dnssec_nsid.pcap": (10, 0),
}


@pytest.mark.parametrize("path", shared_params(CAPTURES), ids=lambda p: p.name)
def test_walker_agrees_with_dpkt(path):
    counts = collections.Counter()
    bufs = dns_messages(path)
    assert bufs, f"no DNS message in {path}"
    for buf in bufs:
        check_message(buf, counts)
    assert sum(counts.values()) == len(bufs)
    print(f"{path.name}: {len(bufs)} messages compared: {dict(counts)}")
    if path.name in EXPECTED:
        total, malformed = EXPECTED[path.name]
        assert (len(bufs), counts["dpkt raised: malformed"]) == (total, malformed)
    if path.name in ("knot-live.raw.pcap.xz", "nsd-live.raw.pcap.xz"):
        # Real server traffic: most messages parse with dpkt; thousands need the lenient path (DNSSEC
        # types, non-UTF-8 names) and none of those is called malformed.
        assert counts["dpkt parsed: equal"] > 10000
        assert counts["dpkt raised: not malformed (lenient equal)"] > 5000


# --------------------------------------------------------------------------------------------------
# Hand-made edge cases: each rule above, both ways.


def _hdr(flags=0x0100, qd=1, an=0, ns=0, ar=0, mid=0x1234):
    return struct.pack("!HHHHHH", mid, flags, qd, an, ns, ar)


Q = b"\x03www\x07example\x00\x00\x01\x00\x01"  # www.example A IN at offset 12


def _rr(rtype, rdata, name=b"\xc0\x0c"):
    return name + struct.pack("!HHIH", rtype, 1, 300, len(rdata)) + rdata


EDGE_CASES = {
    # name: (message, dpkt parses it, really malformed)
    "plain A answer": (_hdr(0x8180, an=1) + Q + _rr(1, b"\xc0\x00\x02\x01"), True, False),
    "RRSIG answer": (_hdr(0x8180, an=1) + Q + _rr(46, b"\x00\x01" + b"\x00" * 30), False, False),
    "unassigned type 65280": (_hdr(0x8180, an=1) + Q + _rr(65280, b"\x01\x02"), False, False),
    "HTTPS then A": (_hdr(0x8180, an=2) + Q + _rr(65, b"\x00\x01\x00") + _rr(1, b"\xc0\x00\x02\x01"), False, False),
    "non-UTF-8 QNAME": (_hdr() + b"\x02\xff\xfe\x07example\x00\x00\x01\x00\x01", False, False),
    "OPT with options": (
        _hdr(ar=1) + Q + _rr(41, b"\x00\x03\x00\x00\x00\x0a\x00\x08" + b"c" * 8, name=b"\x00"), True, False,
    ),
    "OPT option past RDATA": (_hdr(ar=1) + Q + _rr(41, b"\x00\x0a\x00\x08abc", name=b"\x00"), False, True),
    "RDATA past end (dpkt cuts it)": (_hdr(0x8180, an=1) + Q + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x01\x00\x00\x09"
                                      + b"\x01\x02", False, True),
    "RR header cut": (_hdr(0x8180, an=1) + Q + b"\xc0\x0c\x00\x01", False, True),
    "question cut": (_hdr() + b"\x03www\x07exa", False, True),
    "qtype cut": (_hdr() + Q[:-3], False, True),
    "forward pointer in QNAME": (_hdr() + b"\x01a\xc0\x12\x00\x01\x00\x01\x00", False, True),
    "forward pointer in answer owner": (_hdr(0x8180, an=1) + Q + _rr(1, b"\xc0\x00\x02\x01", name=b"\xc0\x30"),
                                        False, True),
    "self pointer in answer owner": (_hdr(0x8180, an=1) + Q + _rr(1, b"\xc0\x00\x02\x01", name=b"\xc0\x1d"),
                                     False, True),
    "label type 0x40 in answer owner": (_hdr(0x8180, an=1) + Q + _rr(1, b"\xc0\x00\x02\x01", name=b"\x41\x00"),
                                        False, True),
    "header only 11 bytes": (_hdr()[:11], False, True),
    "no question": (_hdr(0x8185, qd=0), True, False),
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_case(name):
    buf, dpkt_parses, malformed = EDGE_CASES[name]
    try:
        from_dpkt(dpkt.dns.DNS(buf), buf)
        parsed = True
    except DPKT_REFUSALS:
        parsed = False
    assert parsed == dpkt_parses
    walker = parse_message(buf)
    assert walker[MALFORMED_IDX] is malformed
    assert (lenient_tuple(buf) is None) == malformed
    check_message(buf, collections.Counter())


def test_label_containing_a_dot():
    # One label "a.b" (3 bytes) then "example": the wire has 2 labels. dpkt only returns the text
    # "a.b.example", so from_dpkt counts 3; the walker counts 2. The only field that differs.
    buf = _hdr() + b"\x03a.b\x07example\x00\x00\x01\x00\x01"
    walker = parse_message(buf)
    ref = from_dpkt(dpkt.dns.DNS(buf), buf)
    assert walker[LABELS_IDX] == 2 and ref[LABELS_IDX] == 3
    assert walker[:LABELS_IDX] + walker[LABELS_IDX + 1 :] == ref[:LABELS_IDX] + ref[LABELS_IDX + 1 :]
    assert walker[DNS_FIELDS.index("qname")] == "a.b.example"


@needs_shared
def test_self_check_of_the_oracle():
    # The lenient oracle agrees with dpkt wherever dpkt parses (on a real capture).
    bufs = dns_messages(Path(DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap"))
    assert len(bufs) == 184
    for buf in bufs:
        assert lenient_tuple(buf) == from_dpkt(dpkt.dns.DNS(buf), buf)
