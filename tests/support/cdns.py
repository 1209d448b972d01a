"""C-DNS blocks: the captures the block builders are compared on, an exporter to build blocks for, and the
comparison of two blocks (every table, item, counter and the encoded bytes)."""

import cbor2

from export.cdns import block as cdns
from export.cdns import encode
from export.cdns.writer import CdnsExporter
from probe.config import load_config
from probe.stats import Stats
from support.data import COMPACTOR_DATA, DNSPROBE_DATA, ROOT

CAPTURES = sorted((DNSPROBE_DATA / "test_pcaps").glob("*.pcap")) + [
    COMPACTOR_DATA / name
    for name in (
        "gold.pcap.xz", "matching.pcap.xz", "unmatched.pcap.xz", "malformed.pcap.xz",
        "testcontent-ednsflags.pcap.xz", "knot-live.raw.pcap.xz",
    )
] + [ROOT / "samples" / "sample-mix.pcap.xz"]
TABLES = ("ip", "names", "classtype", "sigs", "qrr", "qlist", "rr", "rrlist", "mm_data")
CHUNKS = (1, 7, 500, 10_000)  # add() calls of several sizes, so that earliest-time and counters carry over


def exporter(tmp_path, **overrides):
    """The C-DNS exporter of the production pipeline (given message records)."""
    cfg = load_config(overrides={"export.format": "cdns", **overrides})
    return CdnsExporter(cfg, tmp_path, 0, Stats(), tx_records=True)


def assert_same(fast, slow):
    for name in TABLES:
        assert list(getattr(fast, name).items()) == list(getattr(slow, name).items()), f"table {name} differs"
    assert fast.items == slow.items
    assert fast.malformed == slow.malformed
    for name in ("earliest", "processed", "unmatched_q", "unmatched_r"):
        assert getattr(fast, name) == getattr(slow, name), name
    assert fast.encode() == slow.encode(python=True)  # C tables and C encoding against no C at all
    if fast.items:  # the item maps as encode writes them, against cbor2 over the reference's maps
        args = (fast.items, fast.earliest, list(range(len(fast.ip))), list(range(len(fast.sigs))),
                list(range(len(fast.names))))
        assert cdns._cdnsblock.encode_items(*args) == cbor2.dumps(encode.item_maps_python(*args))
    for table in (fast.ip, fast.names):  # likewise the address and name tables, in an order that moves them all
        order = list(reversed(range(len(table))))
        assert cdns._cdnsblock.encode_table(table, order) == cbor2.dumps([list(table)[i] for i in order])
    if fast.sigs:  # likewise the signature table, from the C table and from the list of the reference's tuples
        order, new_ip = list(reversed(range(len(fast.sigs)))), list(range(len(fast.ip)))
        new_name = list(range(len(fast.names)))
        want = cbor2.dumps([encode.signature_python(sig, new_ip, new_name) for sig in reversed(list(fast.sigs))])
        assert cdns._cdnsblock.encode_signatures(fast.sigs, order, new_ip, new_name) == want
        assert cdns._cdnsblock.encode_signatures(list(fast.sigs), order, new_ip, new_name) == want
