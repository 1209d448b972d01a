"""The C block builder (export.cdns._cdnsblock) against its Python reference (export.cdns.block Block.add_python).

In the production pipeline Block.add is given message records (a TxBatch) and runs the C loop (add_records) when
there is neither client privacy nor full sections, handing the transactions it does not take (malformed
messages) to add_python one at a time. Given the same transactions, as records to Block.add and as tuples to
add_python, the two must leave the same block: every table with the same entries in the same order (the order
is the index), the same item tuples, earliest-time and statistics. encode()'s C parts (the CBOR of the items and
of the signature table, written directly, and the item maps used with full sections) must give the bytes of
encode(python=True), the reference that uses no C.
"""

import random
import struct
import types

import cbor2
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap
from support.cdns import CAPTURES, CHUNKS, assert_same, exporter
from support.data import ROOT
from support.stages import transactions

from export.cdns import block as cdns
from export.cdns import encode
from export.cdns import format as F
from probe import _records
from probe.config import load_config
from probe.model import M
from probe.stats import Stats


def records(txs):
    """The transactions as a TxBatch of message records."""
    batch = _records.TxBatch()
    for t in txs:
        batch.append(t)
    return batch


def chunks(txs):
    i = k = 0
    while i < len(txs):
        n = CHUNKS[k % len(CHUNKS)]
        yield txs[i : i + n]
        i += n
        k += 1


def both(txs, writer):
    fast, slow = cdns.Block(writer), cdns.Block(writer, python=True)  # the reference: dicts and tuples
    for chunk in chunks(txs):
        fast.add(records(chunk))
        slow.add_python(chunk)
    return fast, slow


def test_extension_is_built():
    """A build without the extension still works (slower, with a warning); CI must not ship one."""
    assert cdns.BACKEND == "c", "export.cdns._cdnsblock was not built: check the compiler and Python headers"


def test_constants_are_the_python_ones():
    c = cdns._cdnsblock
    python = {"NS_PER_TICK": cdns.NS_PER_TICK, "CDNS_TRANSPORT": cdns.CDNS_TRANSPORT}
    assert c.CONSTANTS == {name: python.get(name, getattr(F, name, None)) for name in c.CONSTANTS}


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_c_block_equals_python_block(path, tmp_path):
    check_capture(path, tmp_path)


def check_capture(path, tmp_path):
    txs = transactions(path)
    assert txs
    fast, slow = both(txs, exporter(tmp_path))
    assert_same(fast, slow)  # (that only the malformed ones go to Python: test_cdnsrec.py)
    return fast



def test_cache_answers_what_the_dicts_answer(tmp_path):
    """The Cache in front of the class/type dict and the C tables of addresses, names and signatures: keys the Python
    loop put in them first are found there (not added twice); the keys the Cache remembers are those of the dict; a
    block filled through them equals the reference."""
    txs = transactions(ROOT / "samples" / "sample-mix.pcap.xz")
    half = len(txs) // 2
    writer = exporter(tmp_path)
    fast, slow = cdns.Block(writer), cdns.Block(writer, python=True)
    fast.add_python(txs[:half])  # the dicts get entries the cache never saw
    slow.add_python(txs[:half])
    for chunk in chunks(txs):  # again from the start: every key of the first half is a dict hit
        fast.add(records(chunk))
        slow.add_python(chunk)
    assert_same(fast, slow)
    assert fast.cache.sizes() == len(fast.classtype)
    for table in (fast.ip, fast.names, fast.sigs):
        assert table.placed() == len(table)  # no overflow: all in slots
    assert len(fast.sigs) < len(fast.items) // 2  # most transactions repeat a signature


def test_block_started_at_the_previous_blocks_sizes_equals_python(tmp_path):
    """Block(writer, previous): its C tables and its items start at the previous block's sizes (room made at
    once, and again for more); filled, the block equals the reference, and so does one after a small one."""
    txs = transactions(ROOT / "samples" / "sample-mix.pcap.xz")
    writer = exporter(tmp_path)
    first, _ = both(txs, writer)
    small, _ = both(txs[:3], writer)
    for previous in (first, small):
        fast, slow = cdns.Block(writer, previous), cdns.Block(writer, python=True)
        for chunk in chunks(txs):
            fast.add(records(chunk))
            slow.add_python(chunk)
        assert_same(fast, slow)
        assert fast.cache.sizes() == first.cache.sizes()
        for name in ("ip", "names", "sigs"):
            assert len(getattr(fast, name)) == len(getattr(first, name))
    assert cdns._cdnsblock.Items(expected=5) == [] and cdns._cdnsblock.Items(-1) == []
    with pytest.raises(TypeError):
        cdns._cdnsblock.Cache(like=[])
    with pytest.raises(TypeError):
        cdns._cdnsblock.Keys(like={})
    with pytest.raises(ValueError):
        cdns._cdnsblock.Keys(arity=18)


def test_items_store_reads_as_its_tuples():
    """_cdnsblock.Items gives back every tuple put in it (ints of any sign and size up to 64 bits, None in
    any field), compares equal to the list of them, and refuses what it cannot hold."""
    rng = random.Random(4)
    tuples = []
    for _ in range(500):
        values = [rng.choice([None, 0, 1, 23, 24, 255, 65535, 2**31, 2**63 - 1, -1, -(2**63), rng.getrandbits(40)])
                  for _ in range(10)]
        tuples.append(tuple(values) + (None, None))
    store = cdns._cdnsblock.Items()
    for t in tuples:
        store.append(t)
    assert len(store) == len(tuples) and list(store) == tuples
    assert store == tuples and not store != tuples and store != tuples[:-1]
    assert store[len(tuples) - 1] == tuples[-1]
    with pytest.raises(IndexError):
        store[len(tuples)]
    for bad in [(1,) * 11, (1,) * 10 + ([], None), (1,) * 10 + (None, ()), (2**63,) + (1,) * 9 + (None, None),
                ("1",) + (1,) * 9 + (None, None), (True,) + (1,) * 9 + (None, None)]:
        with pytest.raises(TypeError):
            store.append(bad)
    assert len(store) == len(tuples)


def test_renumbering_equals_python():
    """_cdnsblock.renumbering orders the tables as encode._renumbering's Python does (its reference): uses by the
    items, by the signatures (server address, OPT RDATA) and by the resource records; most used first, ties in
    first-use order; items as an Items or a list, small and large use counts (its two sorts)."""
    rng = random.Random(5)
    for n_items, n_ip, n_names, n_sigs, n_rr in [(0, 0, 0, 0, 0), (1, 2, 1, 1, 0), (3000, 1, 1, 1, 0),
                                                 (3000, 900, 1200, 300, 50), (500, 3, 700, 2, 400)]:
        sigs = {}
        while len(sigs) < n_sigs:
            sig = (rng.randrange(n_ip), len(sigs), *([0] * 13), rng.choice([None, rng.randrange(n_names)]), None)
            sigs[sig] = len(sigs)
        items = [(0, int(rng.paretovariate(1)) % n_ip, 0, 0, rng.randrange(n_sigs), None, None,
                  rng.choice([None, rng.randrange(n_names)]), None, None, None, None) for _ in range(n_items)]
        rr = {(rng.randrange(n_names), 0, i, rng.randrange(n_names)): i for i in range(n_rr)}
        block = types.SimpleNamespace(items=items, sigs=sigs, ip=[0] * n_ip, names=[0] * n_names, rr=rr)
        want = encode._renumbering(block, None)
        assert cdns._cdnsblock.renumbering(items, sigs, n_ip, n_names, rr) == want
        store = cdns._cdnsblock.Items()
        for it in items:
            store.append(it)
        assert cdns._cdnsblock.renumbering(store, sigs, n_ip, n_names, rr) == want
        held = cdns._cdnsblock.Keys(arity=17)  # the signatures as the C loop holds them
        assert [held.index(sig) for sig in sigs] == list(range(n_sigs)) and list(held) == list(sigs)
        assert cdns._cdnsblock.renumbering(store, held, n_ip, n_names, rr) == want
    with pytest.raises(IndexError):
        cdns._cdnsblock.renumbering([(0, 1, 0, 0, 0, None, None, None, None, None, None, None)], {}, 1, 0, {})
    with pytest.raises(TypeError):
        cdns._cdnsblock.renumbering([(0, "1", 0, 0, 0) + (None,) * 7], {}, 2, 0, {})


def header(tid, flags, qd=1, an=0, ns=0, ar=0):
    return struct.pack("!6H", tid, flags, qd, an, ns, ar)


def wire(text):
    return b"".join(bytes((len(label),)) + label.encode() for label in text.split(".")) + b"\0"


QUESTION = wire("a.example") + struct.pack("!HH", 1, 1)
POINTED = b"\xc0\x05" + struct.pack("!HH", 16, 3)  # the name at offset 5 of the header: b"\1\0\0"


def opt(udp=1232, ttl=0, rdata=b""):
    return b"\0" + struct.pack("!HHIH", 41, udp, ttl, len(rdata)) + rdata


def rr(name, rtype, rdata, ttl=300):
    return wire(name) + struct.pack("!HHIH", rtype, 1, ttl, len(rdata)) + rdata


COOKIE = struct.pack("!HH", 10, 8) + b"\1" * 8
SOA = rr("zone.example", 6, wire("ns.zone.example") + wire("h.zone.example") + struct.pack("!5I", 1, 2, 3, 4, 5))
PAIRS = [  # (query, response); None: not sent
    (header(1, 0x0100, qd=0), header(1, 0x8180, qd=0)),
    (header(2, 0x0100) + QUESTION + b"\0\0\0", header(2, 0x8180) + QUESTION),
    (header(3, 0x0110, ar=1) + QUESTION + opt(ttl=0x8000, rdata=COOKIE) + b"\xff",
     header(3, 0x8180, ar=1) + QUESTION + opt(ttl=1 << 24)),
    (header(4, 0x0100) + POINTED, header(4, 0x8183) + POINTED),
    (header(5, 0x0100, qd=2) + QUESTION + wire("b.example") + struct.pack("!HH", 28, 1),
     header(5, 0x8180, qd=2) + QUESTION + wire("b.example") + struct.pack("!HH", 28, 1)),
    (header(6, 0x0100, ar=2) + QUESTION + opt() + rr("x.example", 16, b"\2hi"), None),
    (header(7, 5 << 11, an=1, ns=1) + QUESTION + rr("a.example", 1, b"\xc0\0\2\1") + rr("x", 2, wire("ns.x")),
     header(7, 0x8000 | 5 << 11) + QUESTION),
    (None, header(8, 0x8185, qd=0, ar=1) + opt(ttl=2 << 24)),
    (header(9, 0x0100, ar=1) + QUESTION + opt(udp=512), None),
]
AXFR_QUERY = header(10, 0) + wire("zone.example") + struct.pack("!HH", 252, 1)
AXFR_RESPONSES = [
    header(10, 0x8400, an=2) + AXFR_QUERY[12:] + SOA + rr("a.zone.example", 1, b"\1\2\3\4"),
    header(10, 0x8400, qd=0, an=1) + rr("b.zone.example", 1, b"\1\2\3\5"),
    header(10, 0x8400, qd=0, an=1) + SOA,
]


def odd_capture(path):
    frames = []
    ether = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")  # explicit: scapy would look them up

    def add(t, pkt):
        pkt.time = 1_600_000_000 + t
        frames.append(pkt)

    for i, (query, response) in enumerate(PAIRS):
        v6 = i % 3 == 2
        ip = (lambda **kw: IPv6(**kw)) if v6 else (lambda **kw: IP(ttl=60, **kw))
        client, server = ("2001:db8::1", "2001:db8::53") if v6 else ("192.0.2.1", "198.51.100.53")
        if query is not None:
            add(i * 0.01, ether / ip(src=client, dst=server) / UDP(sport=40000 + i, dport=53) / Raw(query))
        if response is not None:
            add(i * 0.01 + 0.002, ether / ip(src=server, dst=client) / UDP(sport=53, dport=40000 + i) / Raw(response))
    c, s = "2001:db8::2", "2001:db8::53"

    def seg(t, from_client, flags, seq, ack, data=b""):
        src, dst, sport, dport = (c, s, 41000, 53) if from_client else (s, c, 53, 41000)
        tcp = TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack)
        add(t, ether / IPv6(src=src, dst=dst) / tcp / Raw(data))

    seg(0.2, True, "S", 100, 0)
    seg(0.201, False, "SA", 500, 101)
    seg(0.202, True, "A", 101, 501)
    framed = struct.pack("!H", len(AXFR_QUERY)) + AXFR_QUERY
    seg(0.203, True, "PA", 101, 501, framed)
    seq = 501
    for k, msg in enumerate(AXFR_RESPONSES):
        data = struct.pack("!H", len(msg)) + msg
        seg(0.21 + k * 0.001, False, "PA", seq, 101 + len(framed), data)
        seq += len(data)
    wrpcap(str(path), frames)


def test_odd_shapes_give_the_same_block(tmp_path):
    path = tmp_path / "odd.pcap"
    odd_capture(path)
    block = check_capture(path, tmp_path)
    assert len(block.items) == len(PAIRS) + 1
    flags = [(sig[2], sig[4]) for sig in block.sigs]
    assert any(t & F.TRANSPORT_QUERY_TRAILINGDATA for t, _ in flags)
    assert any(f & F.QR_QUERY_HAS_NO_QUESTION for _, f in flags)
    assert any(f & F.QR_RESPONSE_HAS_NO_QUESTION for _, f in flags)
    assert any(t == 3 for t, _ in flags)  # TCP over IPv6
    assert b"\1\0\0" in block.names  # the first name read through a pointer into the header
    assert block.processed == sum((q is not None) + (r is not None) for q, r in PAIRS) + 1 + len(AXFR_RESPONSES)


def test_encode_table_equals_cbor2():
    """_cdnsblock.encode_table writes a bytes table's array as cbor2 does (every length of CBOR head), and leaves to
    Python (None) the tables it cannot write: keys not bytes, indexes not the table's."""
    table = {bytes([n % 256]) * n: i for i, n in enumerate([0, 1, 23, 24, 255, 256, 300, 70000])}
    orders = [list(range(len(table))), [7, 0, 3, 3], [], [-1]]
    for order in orders[:3]:
        assert cdns._cdnsblock.encode_table(table, order) == cbor2.dumps([list(table)[i] for i in order])
    assert cdns._cdnsblock.encode_table(table, orders[3]) is None  # (list(table)[-1] would be the last one)
    assert cdns._cdnsblock.encode_table(table, [len(table)]) is None
    for odd in ({"a": 0}, {b"a": 1}, {b"a": 0, b"b": 0}, {b"a": "0"}, {memoryview(b"a"): 0}):
        assert cdns._cdnsblock.encode_table(odd, [0]) is None
    keys = cdns._cdnsblock.Keys()  # the C table of a block, written from its buffer, reads as the dict
    assert [keys.index(key) for key in table] == list(range(len(table))) and keys.index(memoryview(b"\0" * 256)) == 5
    assert list(keys) == list(table) and keys.items() == list(table.items()) and len(keys) == len(table)
    assert keys.get(b"") == 0 and keys.get(b"?") is None and keys.get(b"?", -1) == -1 and b"\1" in keys
    for order in orders[:3]:
        assert cdns._cdnsblock.encode_table(keys, order) == cbor2.dumps([list(table)[i] for i in order])
    assert cdns._cdnsblock.encode_table(keys, orders[3]) is None and cdns._cdnsblock.encode_table(keys, [8]) is None
    with pytest.raises(TypeError):
        keys.index("a")


def test_keys_hold_none_as_the_dict_did():
    """A dnstap message without an address (Block.add_python) puts None in the block's address table: a Keys holds it
    as the dict it replaced did, an index of its own apart from the empty key, read back as None and written as
    CBOR null (tests/run/test_columnar.py's dnstap among packets fails without it)."""
    table = {b"\x7f\0\0\1": 0, None: 1, b"": 2}
    keys = cdns._cdnsblock.Keys()
    assert keys.get(None) is None and None not in keys
    assert [keys.index(key) for key in table] == [0, 1, 2] and keys.index(None) == 1 and len(keys) == 3
    assert keys.get(None) == 1 and None in keys and list(keys) == list(table) and keys.items() == list(table.items())
    for order in ([0, 1, 2], [1], [2, 1, 0]):
        assert cdns._cdnsblock.encode_table(keys, order) == cbor2.dumps([list(table)[i] for i in order])
    with pytest.raises(TypeError):
        cdns._cdnsblock.Keys(arity=17).index(b"a")


def test_block_map_with_encoded_parts_equals_cbor2():
    """encode._dumps writes a map holding bytes already encoded (at any depth, maps of every head length) as
    cbor2.dumps writes the same map with those values as objects."""
    for n in (1, 23, 24, 255, 256, 300):
        values = [[b"a" * k, {k: None}] for k in range(n)]
        plain = {0: {"a": [1, -2]}, 1: {k: v for k, v in enumerate(values)}, 2: values[: n % 5], 3: {0: {1: values}}}
        made = dict(plain)
        made[1] = {k: encode._Encoded(cbor2.dumps(v)) if k % 2 else v for k, v in enumerate(values)}
        made[3] = {0: {1: encode._Encoded(cbor2.dumps(values))}}
        assert encode._dumps(made) == cbor2.dumps(plain)


def test_qr_type_and_every_item_map(tmp_path):
    txs = transactions(ROOT / "samples" / "sample-mix.pcap.xz")
    fast, slow = both(txs, exporter(tmp_path, **{"export.cdns_qr_type": "resolver"}))
    assert_same(fast, slow)
    assert {sig[3] for sig in fast.sigs} == {F.QR_TYPES["resolver"]}
    # Item maps with renumbering lists that move every index, an earliest-time before every item.
    items = fast.items
    new_ip = list(reversed(range(len(fast.ip))))
    new_sig = list(reversed(range(len(fast.sigs))))
    new_name = [i * 3 + 1 for i in range(len(fast.names))]
    earliest = fast.earliest - 5
    args = (items, earliest, new_ip, new_sig, new_name)
    py_maps = encode.item_maps_python(*args)
    assert cbor2.dumps(py_maps) == cdns._cdnsblock.encode_items(*args)
    # Values of every CBOR int length, negative ones (a response before its query), a bool (Python's).
    odd = [
        (earliest + 1, 0, 0, 0, 0, None, -1, None, 23, 24, None, None),
        (earliest + 255, 1, 256, 65535, 1, 0, -25, 0, 65536, 2**32 - 1, None, None),
        (earliest + 2**32, 2, 2**40, 1, 2, 255, -(2**40), 1, None, None, None, None),
        (earliest - 1, 0, 1, 2, 0, 1, 0, -1, 0, 0, None, None),
    ]
    wanted = cbor2.dumps(encode.item_maps_python(odd, earliest, new_ip, new_sig, new_name))
    assert cdns._cdnsblock.encode_items(odd, earliest, new_ip, new_sig, new_name) == wanted
    odd[0] = odd[0][:8] + (True,) + odd[0][9:]
    assert cdns._cdnsblock.encode_items(odd, earliest, new_ip, new_sig, new_name) is None
    odd[0] = odd[0][:10] + ({0: 1},) + odd[0][11:]
    assert cdns._cdnsblock.encode_items(odd, earliest, new_ip, new_sig, new_name) is None
    assert {len(m) for m in py_maps} >= {8, 10}  # query-only or response-only items, and full ones


def test_full_sections_encode_equals_python(tmp_path):
    """With full sections add() is Python's (on the records' tuples); encode() then makes the item maps in Python
    (items holding their section indexes are not written by encode_items) and must give the reference's bytes."""
    txs = transactions(ROOT / "samples" / "sample-mix.pcap.xz")
    block = cdns.Block(exporter(tmp_path, **{"export.cdns_full_sections": True}))
    for chunk in chunks(txs):
        block.add(records(chunk))
    assert any(it[10] is not None or it[11] is not None for it in block.items)
    assert block.encode() == block.encode(python=True)


def damaged(txs):
    """Transactions whose query bytes were changed after decoding: cut, lengthened, the first name
    compressed (a pointer into the header) or its label lengths broken. Such bytes never come from the
    decoders with malformed False; both paths must still agree, raising the same exception if any."""
    out = []
    for q, r, nresp in txs:
        if q is None or q[M.MALFORMED] or q[M.QNAME] is None:
            continue
        raw = q[M.RAW]
        for new in (raw[:-1], raw[:13], raw + b"\0\0", raw[:12] + b"\xc0\x04" + raw[12:],
                    raw[:12] + b"\x05" + raw[13:], raw[:12] + b"\x41" + raw[13:], raw[:12]):
            out.append((q[: M.RAW] + (new,) + q[M.RAW + 1 :], r, nresp))
        if len(out) > 3000:
            break
    return out


def outcome(add, tx):
    try:
        add([tx])
    except Exception as exc:  # noqa: BLE001 - the exception's type is what is compared
        return type(exc)
    return None


def test_damaged_query_bytes_give_the_same_block(tmp_path):
    txs = damaged(transactions(ROOT / "samples" / "sample-mix.pcap.xz"))
    assert len(txs) > 1000
    writer = exporter(tmp_path)
    fast, slow = cdns.Block(writer), cdns.Block(writer, python=True)
    outcomes = [(outcome(lambda t: fast.add(records(t)), tx), outcome(slow.add_python, tx)) for tx in txs]
    assert [a for a, _ in outcomes] == [b for _, b in outcomes]
    assert {a for a, _ in outcomes} >= {None, IndexError}  # both the taken and the raising shapes occur
    assert_same(fast, slow)


MASK64 = (1 << 64) - 1
HASH_MUL = 0xFF51AFD7ED558CCD


def _mix(h, word):
    """One 8-byte step of _cdnsblock.c's hash_bytes."""
    h = ((h ^ word) * HASH_MUL) & MASK64
    return h ^ (h >> 32)


def _unmix(y):
    """x with _mix(0, x) == y (both steps are invertible)."""
    return ((y ^ (y >> 32)) * pow(HASH_MUL, -1, 1 << 64)) & MASK64


def colliding_names(count):
    """QNAMEs in wire form, one 22-byte label each, whose hashes in _cdnsblock.c's name cache are all equal:
    the first 8 bytes vary, the next 8 are solved for so that the state after them is the same for all."""
    word = lambda b: int.from_bytes(b, "little")  # noqa: E731
    tail = b"example\x00"
    h0 = 0x9E3779B97F4A7C15 ^ 24
    target = _unmix(_unmix(0x0123456789ABCDEF) ^ word(tail))  # the state before the middle word's step
    names = []
    for i in range(count):
        head = b"\x16" + i.to_bytes(7, "little")
        middle = _mix(h0, word(head)) ^ target
        names.append(head + middle.to_bytes(8, "little") + tail)
    return names


def write_queries(path, names):
    """A pcap of one UDP query per QNAME (wire form, equal lengths), from one client to one server."""
    template = bytes(Ether(src="02:00:00:00:00:0c", dst="02:00:00:00:00:05") / IP(src="192.0.2.1", dst="198.51.100.53")
                     / UDP(sport=40000, dport=53, chksum=0) / Raw(bytes(12) + names[0] + b"\x00\x10\x00\x01"))
    at = len(template) - len(names[0]) - 16  # the DNS header
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, name in enumerate(names):
            dns = struct.pack("!HHHHHH", i & 0xFFFF, 0x0100, 1, 0, 0, 0) + name + b"\x00\x10\x00\x01"
            frame = template[:at] + dns
            fh.write(struct.pack("<IIII", 1_600_000_000 + i, 0, len(frame), len(frame)) + frame)


def test_colliding_names_cost_a_bounded_number_of_probes(tmp_path):
    # The name table hashes with a fixed function: names made to collide were all probed in one chain,
    # each add scanning all earlier ones (10,000 names: Block.add 14x slower). Asserted on the slots looked
    # at (Keys.probes()), a count that does not depend on the machine: at most MAX_PROBE (16) per lookup; the
    # names that find no slot go to the table's overflow dict, and are found there.
    names = colliding_names(5000)
    assert len(set(names)) == len(names)
    write_queries(tmp_path / "collide.pcap", names)
    txs = transactions(tmp_path / "collide.pcap")
    assert len(txs) == len(names)
    fast, slow = both(txs, exporter(tmp_path))
    assert_same(fast, slow)
    assert len(fast.names) == len(names)
    assert fast.names.placed() <= 16  # they did collide: only the first ones near their home slot have a slot
    assert fast.names.probes() <= 2 * 16 * len(names), fast.names.probes()  # a lookup, then a place, per new name
    assert [fast.names.get(name) for name in names] == list(range(len(names)))


def test_c_block_equals_python_block_for_dnstap(tmp_path):
    """dnstap transactions (no frame lengths, TTL or checksum; every transport, one without any): the C loop and
    the Python one make the same block."""
    from support.dnstap import dnstap_frame
    from support.frames import T0
    from support.messages import q_dns, r_dns

    from probe.decode.dnstap import DnstapDecoder
    from probe.match import TransactionTable
    from probe.model import DataFrames, DnstapBatch

    frames = []
    for i, protocol in enumerate(("UDP", "TCP", "DOT", "DOH", "DOQ", "DNSCryptUDP", None) * 30):
        v6 = dict(family="INET6", qaddr="2001:db8::1", raddr="2001:db8::53") if i % 3 == 0 else {}
        frames.append(dnstap_frame("CLIENT_QUERY", dns=q_dns(i), protocol=protocol, qport=10000 + i, ts=T0 + i, **v6))
        if i % 7:
            frames.append(dnstap_frame("CLIENT_RESPONSE", dns=r_dns(i), protocol=protocol, qport=10000 + i,
                                       ts=T0 + i + 99, **v6))
    cfg = load_config(overrides={"export.format": "cdns"})
    stats = Stats()
    table = TransactionTable(cfg.match, stats)
    batch = DnstapBatch([("p", DataFrames.of(frames))])
    txs = table.add(DnstapDecoder(cfg.dnstap, cfg.decode, stats).decode(batch))
    txs += table.flush()
    fast, slow = both(txs, exporter(tmp_path))
    assert_same(fast, slow)
    assert len(fast.items) == 210
