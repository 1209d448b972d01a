"""The classic pcap files of the shared data (the pcap record splitters' inputs) as bytes, and records rewritten
big-endian."""

import lzma
import struct

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
