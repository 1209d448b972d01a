"""A filled C-DNS block (export/cdns/block.py Block) → its CBOR bytes (RFC 8618 7.3). Tables are ordered
most-referenced first, so that the indexes used most take the fewest bytes (CBOR: 1 byte below 24, 2 below 256);
every reference is renumbered. The renumbering, the address, name and signature arrays and the items are made by
export.cdns._cdnsblock when built; the Python functions here are its reference (tests/export/test_cdns_block.py)."""

from operator import itemgetter

import cbor2

from export.cdns import format as F
from probe.native import load

_cdnsblock = load("export.cdns._cdnsblock")

TICKS_PER_SECOND = 1_000_000  # ticks of 1 µs
# Signature map keys in the order of the signature tuples Block builds.
SIG_KEYS = tuple(range(F.SERVER_ADDRESS_INDEX, F.RESPONSE_RCODE + 1))


def encode_block(block, python=False):
    """The CBOR bytes of a Block; python=True: the reference, in Python, without _cdnsblock."""
    c = None if python else _cdnsblock
    earliest = block.earliest if block.earliest is not None else block.fallback_ticks or 0
    items = block.items
    (sig_order, new_sig), (ip_order, new_ip), (name_order, new_name) = _renumbering(block, c)
    out = {
        F.BLOCK_PREAMBLE: {F.EARLIEST_TIME: [earliest // TICKS_PER_SECOND, earliest % TICKS_PER_SECOND]},
        F.BLOCK_STATISTICS: {
            F.PROCESSED_MESSAGES: block.processed,
            F.QR_DATA_ITEMS: len(items),
            F.UNMATCHED_QUERIES: block.unmatched_q,
            F.UNMATCHED_RESPONSES: block.unmatched_r,
            F.DISCARDED_OPCODE: 0,
            F.MALFORMED_ITEMS: len(block.malformed),
        },
    }
    tables = _tables(block, c, ip_order, name_order, sig_order, new_ip, new_name)
    if tables:
        out[F.BLOCK_TABLES] = tables
    if items:
        args = (items, earliest, new_ip, new_sig, new_name)
        data = c.encode_items(*args) if c else None
        if data is not None:
            out[F.QUERY_RESPONSES] = _Encoded(data)
        else:
            out[F.QUERY_RESPONSES] = item_maps_python(*args)
    if block.events:
        out[F.ADDRESS_EVENT_COUNTS] = [
            _event(ae_type, code, new_ip[ai], tflags, count)
            for (ae_type, code, ai, tflags), count in block.events.items()
        ]
    if block.malformed:
        out[F.MALFORMED_MESSAGES] = [
            {F.TIME_OFFSET: t - earliest, F.CLIENT_ADDRESS_INDEX: new_ip[ci], F.CLIENT_PORT: p,
             F.MESSAGE_DATA_INDEX: d}
            for t, ci, p, d in block.malformed
        ]
    return cbor2.dumps(out) if c is None else _dumps(out)


def _renumbering(block, c):
    """(old indexes most used first, new index of each old index) of the signatures, addresses and names: items,
    signatures (their server address and OPT RDATA) and resource records use them. In C when built
    (_cdnsblock.renumbering); this is its reference."""
    if c is not None:
        return c.renumbering(block.items, block.sigs, len(block.ip), len(block.names), block.rr)
    items = block.items
    sig_uses = count_uses_python(items, 4, len(block.sigs))
    ip_uses = count_uses_python(items, 1, len(block.ip))
    name_uses = count_uses_python(items, 7, len(block.names))
    for sig, i in block.sigs.items():
        uses = sig_uses[i]
        ip_uses[sig[0]] += uses
        if sig[15] is not None:
            name_uses[sig[15]] += uses
    for n, _, _, d in block.rr:
        name_uses[n] += 1
        name_uses[d] += 1
    return by_use_python(sig_uses), by_use_python(ip_uses), by_use_python(name_uses)


def _tables(block, c, ip_order, name_order, sig_order, new_ip, new_name):
    """The block-tables map, its arrays in the new order and with the new indexes."""
    tables = {}
    if block.ip:
        tables[F.IP_ADDRESS] = _table(block.ip, ip_order, c)
    if block.classtype:
        tables[F.CLASSTYPE] = [{F.TYPE: t, F.CLASS: cls} for t, cls in block.classtype]
    if block.names:
        tables[F.NAME_RDATA] = _table(block.names, name_order, c)
    if block.sigs:
        sigs = list(block.sigs) if isinstance(block.sigs, dict) else block.sigs  # (a _cdnsblock.Keys is read in C)
        data = c.encode_signatures(sigs, sig_order, new_ip, new_name) if c else None
        if data is not None:
            tables[F.QR_SIG] = _Encoded(data)
        else:
            sigs = list(sigs)
            tables[F.QR_SIG] = [signature_python(sigs[i], new_ip, new_name) for i in sig_order]
    if block.qlist:
        tables[F.QLIST] = [list(x) for x in block.qlist]
        tables[F.QRR] = [{F.NAME_INDEX: new_name[n], F.CLASSTYPE_INDEX: ct} for n, ct in block.qrr]
    if block.rrlist:
        tables[F.RRLIST] = [list(x) for x in block.rrlist]
        tables[F.RR] = [
            {F.NAME_INDEX: new_name[n], F.CLASSTYPE_INDEX: ct, F.TTL: t, F.RDATA_INDEX: new_name[d]}
            for n, ct, t, d in block.rr
        ]
    if block.mm_data:
        tables[F.MALFORMED_MESSAGE_DATA] = [
            {F.MM_SERVER_ADDRESS_INDEX: new_ip[s], F.MM_SERVER_PORT: p, F.MM_TRANSPORT_FLAGS: t, F.MM_PAYLOAD: d}
            for s, p, t, d in block.mm_data
        ]
    return tables


def _table(table, order, c):
    """The array of a table of bytes (addresses, names) in the new order; its CBOR from _cdnsblock when built."""
    data = c.encode_table(table, order) if c else None
    if data is not None:
        return _Encoded(data)
    keys = list(table)
    return [keys[i] for i in order]


class _Encoded:
    """CBOR bytes made elsewhere (_cdnsblock.encode_items, encode_signatures, encode_table), written as they are."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def _dumps(value):
    """cbor2.dumps(value) where value's maps may hold _Encoded values: those maps are written here, a head and their
    pairs, the _Encoded bytes joined as they are. (Given to cbor2's encoder through its default hook, the bytes
    were copied through a Python call and a conversion to a sequence: longer than the rest of a block's encoding.)"""
    parts = []
    _put(value, parts)
    return b"".join(parts)


def _put(value, parts):
    if type(value) is _Encoded:
        parts.append(value.data)
    elif type(value) is dict and _holds_encoded(value):
        parts.append(_head(5, len(value)))
        for key, v in value.items():
            parts.append(cbor2.dumps(key))
            _put(v, parts)
    else:
        parts.append(cbor2.dumps(value))


def _holds_encoded(value):
    return any(type(v) is _Encoded or (type(v) is dict and _holds_encoded(v)) for v in value.values())


def _head(major, n):
    """A CBOR head (RFC 8949 3), shortest form, as cbor2 writes it."""
    if n < 24:
        return bytes((major << 5 | n,))
    size = 1 if n < 0x100 else 2 if n < 0x10000 else 4 if n < 0x100000000 else 8
    return bytes((major << 5 | {1: 24, 2: 25, 4: 26, 8: 27}[size],)) + n.to_bytes(size, "big")


def count_uses_python(items, field, n):
    """How many items hold each index 0..n-1 in `field` (None skipped)."""
    uses = [0] * n
    for i in map(itemgetter(field), items):
        if i is not None:
            uses[i] += 1
    return uses


def by_use_python(uses):
    """(old indexes most used first, new index of each old index); ties keep the order of first use
    (sorted is stable, also with reverse=True)."""
    order = sorted(range(len(uses)), key=uses.__getitem__, reverse=True)
    new = [0] * len(uses)
    for j, i in enumerate(order):
        new[i] = j
    return order, new


def signature_python(sig, new_ip, new_name):
    out = {k: v for k, v in zip(SIG_KEYS, sig) if v is not None}
    out[F.SERVER_ADDRESS_INDEX] = new_ip[sig[0]]
    if sig[15] is not None:
        out[F.QUERY_OPT_RDATA_INDEX] = new_name[sig[15]]
    return out


def item_maps_python(items, earliest, new_ip, new_sig, new_name):
    """The QueryResponse maps of the items, indexes renumbered: the reference of _cdnsblock.encode_items, which
    writes their CBOR without making them (and what is encoded where it declines: extended sections)."""
    return [_item(it, earliest, new_ip, new_sig, new_name) for it in items]


def _item(it, earliest, new_ip, new_sig, new_name):
    ticks, ci, cport, tid, sgi, hop, delay, ni, qsize, rsize, qext, rext = it
    item = {0: ticks - earliest, 1: new_ip[ci], 2: cport, 3: tid, 4: new_sig[sgi]}
    if hop is not None:
        item[5] = hop
    if delay is not None:
        item[6] = delay
    if ni is not None:
        item[7] = new_name[ni]
    if qsize is not None:
        item[8] = qsize
    if rsize is not None:
        item[9] = rsize
    if qext is not None:
        item[F.QUERY_EXTENDED] = qext
    if rext is not None:
        item[F.RESPONSE_EXTENDED] = rext
    return item


def _event(ae_type, code, address_index, tflags, count):
    event = {F.AE_TYPE: ae_type}
    if ae_type != F.AE_TCP_RESET:
        event[F.AE_CODE] = code
    else:
        tflags |= F.TRANSPORT_TCP << F.TRANSPORT_SHIFT
    event[F.AE_ADDRESS_INDEX] = address_index
    event[F.AE_TRANSPORT_FLAGS] = tflags
    event[F.AE_COUNT] = count
    return event
