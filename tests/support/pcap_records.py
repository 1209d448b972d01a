"""The classic pcap files of the oracle data (the pcap record splitters' inputs) as bytes, records rewritten
big-endian, and the two splitters called alike."""

import lzma
import struct

from probe import _records
from probe.capture import _pcaprecords
from probe.capture.pcapfile import split_records
from support.data import COMPACTOR_DATA, DNSPROBE_DATA

CAPTURES = sorted((DNSPROBE_DATA / "test_pcaps").glob("*.pcap")) + [
    COMPACTOR_DATA / "gold.pcap.xz",
    COMPACTOR_DATA / "malformed.pcap.xz",
]


def load(path):
    data = path.read_bytes()
    return lzma.decompress(data) if path.suffix == ".xz" else data


def to_big_endian(body):
    """The same records with big-endian headers (as a pcap written on a big-endian host)."""
    out = bytearray()
    pos = 0
    while pos + 16 <= len(body):
        sec, frac, caplen, wirelen = struct.unpack_from("<IIII", body, pos)
        out += struct.pack(">IIII", sec, frac, caplen, wirelen) + body[pos + 16 : pos + 16 + caplen]
        pos += 16 + caplen
    return bytes(out)


PCAP_MAGICS = (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1")  # classic pcap, µs and ns (the others are pcapng)
CAPTURES = [p for p in CAPTURES if p.exists() and load(p)[:4] in PCAP_MAGICS]


def packed_split(buf, pos, big, ts_mult, limit):
    """The C splitter (split_packed): ((pos, status), (ts_ns, wirelen, data) of the frames it packed)."""
    frames = _records.Frames()
    res = _pcaprecords.split_packed(buf, pos, big, ts_mult, limit, frames)
    return res, frames.lists()


def list_split(buf, pos, big, ts_mult, limit):
    """The same of the Python reference split_records."""
    lists = ([], [], [])
    return split_records(buf, pos, big, ts_mult, limit, *lists), lists
