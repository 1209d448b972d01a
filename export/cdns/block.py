"""One C-DNS block (RFC 8618 7.3): transactions → deduplicated tables, Q/R items, address events, statistics
→ the block's CBOR. What is recorded, and how, is described in export/cdns/writer.py.

Block.add_python is the reference, on transaction tuples: the reference pipeline's, and that of the C loop on
message records (export.cdns._cdnsblock.add_records), which Block.add runs in the production pipeline for the
common transactions, giving the others to add_python (tests/export/test_cdns_block.py, test_cdnsrec.py).
"""


import struct
from operator import itemgetter

import cbor2

from export.cdns import format as F
from probe.decode.dnswire import Malformed, read_name, skip_name, walk_rrs
from probe.model import CDNS_TRANSPORT_UNKNOWN, TRANSPORTS, E, M
from probe.native import load

_cdnsblock = load("export.cdns._cdnsblock")
BACKEND = "c" if _cdnsblock is not None else "python"

TICKS_PER_SECOND = 1_000_000  # ticks of 1 µs; timestamps in ns are divided by NS_PER_TICK
NS_PER_TICK = 1_000_000_000 // TICKS_PER_SECOND
TYPE_OPT = 41
OPT_ECS = 8

# Q/R item fields always recorded (the hint bit of each equals its map key), and with full sections.
QR_FIELDS = (
    "time-offset", "client-address-index", "client-port", "transaction-id", "qr-signature-index",
    "client-hoplimit", "response-delay", "query-name-index", "query-size", "response-size",
)
SECTION_FIELDS = (
    "query-question-sections", "query-answer-sections", "query-authority-sections", "query-additional-sections",
    "response-answer-sections", "response-authority-sections", "response-additional-sections",
)
# Signature map keys in the order of the signature tuples built below.
SIG_KEYS = tuple(range(F.SERVER_ADDRESS_INDEX, F.RESPONSE_RCODE + 1))

_HDR_COUNTS = struct.Struct("!4xHHHH").unpack_from
_HH = struct.Struct("!HH").unpack_from
_RR = struct.Struct("!HHIH").unpack_from

_TS, _SRC, _SPORT, _DST, _DPORT, _TTL = M.TS_NS, M.SRC, M.SPORT, M.DST, M.DPORT, M.TTL
_IPV, _TRANSPORT, _DNS_LEN, _ID, _FLAGS = M.IPV, M.TRANSPORT, M.DNS_LEN, M.ID, M.FLAGS
_QD, _AN, _NS, _AR = M.QDCOUNT, M.ANCOUNT, M.NSCOUNT, M.ARCOUNT
_QNAME, _QTYPE, _QCLASS, _EDNS, _MALFORMED, _RAW = M.QNAME, M.QTYPE, M.QCLASS, M.EDNS, M.MALFORMED, M.RAW
_E_UDP, _E_VERSION, _E_DO, _E_EXT, _E_RDATA = E.UDP_SIZE, E.VERSION, E.DO, E.EXT_RCODE, E.RDATA

# RFC 8618 transport value by transport code, as the C loop has it (CDNS_TRANSPORT, indexed by the code).
CDNS_TRANSPORT = tuple(
    TRANSPORTS[code][2] if code in TRANSPORTS else CDNS_TRANSPORT_UNKNOWN for code in range(max(TRANSPORTS) + 1)
)


def transport_flags(m):
    """qr-transport-flags bits 0-4 of a message: IPv6, and its transport (15, non-standard, when unknown)."""
    code = m[_TRANSPORT]
    value = CDNS_TRANSPORT[code] if type(code) is int and 0 <= code < len(CDNS_TRANSPORT) else CDNS_TRANSPORT_UNKNOWN
    return (1 if m[_IPV] == 6 else 0) | value << 1


# ---------------------------------------------------------------------------------------------
# DNS wire helpers: names in uncompressed wire form, sections, RDATA with names expanded


def _wire(labels):
    return b"".join(bytes((len(label),)) + label for label in labels) + b"\0"




def message_end(raw):
    """Offset just past the last RR of a well-formed message."""
    qd, an, ns, ar = _HDR_COUNTS(raw)
    off = 12
    for _ in range(qd):
        off = skip_name(raw, off) + 4
    return walk_rrs(raw, off, an + ns + ar, False)[0]


def query_trailing(q, name_end):
    """True when a query has bytes after its last RR (qr-transport-flags bit 5). name_end: the offset just
    past the first question's name when it is not compressed, else None. The usual query, one question
    and at most an OPT RR, is measured without walking it."""
    raw = q[_RAW]
    if name_end is not None and q[_QD] == 1 and not q[_AN] and not q[_NS]:
        end = name_end + 4
        ar = q[_AR]
        if not ar:
            return end < len(raw)
        qe = q[_EDNS]
        if ar == 1 and qe is not None and raw[end] == 0:
            return end + 11 + len(qe[_E_RDATA]) < len(raw)
    return message_end(raw) < len(raw)


def expand_rdata(buf, start, end, layout):
    """RDATA at buf[start:end] with its names uncompressed, following an RDATA_NAME_LAYOUT entry."""
    out = []
    pos = start
    for item in layout:
        if item == "N":
            labels, pos = read_name(buf, pos)
            out.append(_wire(labels))
        elif item == "S":
            n = buf[pos] + 1
            out.append(buf[pos : pos + n])
            pos += n
        elif item == "*":
            out.append(buf[pos:end])
            pos = end
        else:
            out.append(buf[pos : pos + item])
            pos += item
        if pos > end:
            raise Malformed("RDATA shorter than its type's layout")
    if pos != end:
        raise Malformed("RDATA longer than its type's layout")
    return b"".join(out)


def message_sections(buf, is_query):
    """(later questions, answers, authorities, additionals) of a well-formed message.

    A question is (name, type, class), an RR (name, type, class, ttl, rdata), names in uncompressed wire
    form. The query's first OPT RR is left out (the signature holds it)."""
    qd, an, ns, ar = _HDR_COUNTS(buf)
    off = 12
    questions = []
    for i in range(qd):
        labels, off = read_name(buf, off)
        qtype, qclass = _HH(buf, off)
        off += 4
        if i:
            questions.append((_wire(labels), qtype, qclass))
    sections = []
    skip_opt = is_query
    for section, count in enumerate((an, ns, ar)):
        rrs = []
        for _ in range(count):
            labels, off = read_name(buf, off)
            rtype, rclass, ttl, rdlen = _RR(buf, off)
            start = off + 10
            off = start + rdlen
            if skip_opt and rtype == TYPE_OPT and section == 2:
                skip_opt = False
                continue
            layout = F.RDATA_NAME_LAYOUT.get(rtype)
            rdata = None
            if layout is not None:
                try:
                    rdata = expand_rdata(buf, start, off, layout)
                except (Malformed, IndexError):
                    rdata = None  # kept as received
            rrs.append((_wire(labels), rtype, rclass, ttl, buf[start:off] if rdata is None else rdata))
        sections.append(rrs)
    return questions, sections[0], sections[1], sections[2]


# ---------------------------------------------------------------------------------------------
# Privacy of client addresses (export.anonymise.ClientPrivacy): addresses, prefixes, client subnets


class Clients:
    """Client addresses as stored: transformed by the ClientPrivacy, cut to the prefix's bytes."""

    def __init__(self, client):
        self.client = client
        self.cache = {}
        self.bytes4 = (client.prefix4 + 7) // 8 if client and client.prefix4 < 32 else 4
        self.bytes6 = (client.prefix6 + 7) // 8 if client and client.prefix6 < 128 else 16

    def address(self, packed):
        out = self.cache.get(packed)
        if out is None:
            if len(self.cache) > 200_000:
                self.cache.clear()
            out = self.client.address(packed)
            out = out[: self.bytes4 if len(out) == 4 else self.bytes6]
            self.cache[packed] = out
        return out

    def opt_rdata(self, rdata):
        """OPT RDATA with the address of a client-subnet option (RFC 7871) transformed like a client's."""
        pos = 0
        out = bytearray(rdata)
        while pos + 4 <= len(rdata):
            code, olen = _HH(rdata, pos)
            if code == OPT_ECS and olen >= 4 and pos + 4 + olen <= len(rdata):
                family, source = _HH(rdata, pos + 4)[0], rdata[pos + 6]
                addr = rdata[pos + 8 : pos + 4 + olen]
                size = 4 if family == 1 else 16 if family == 2 else 0
                if size and len(addr) <= size:
                    full = self.client.address(addr.ljust(size, b"\0"), min(source, size * 8))
                    out[pos + 8 : pos + 4 + olen] = full[: len(addr)]
            pos += 4 + olen
        return bytes(out)


# ---------------------------------------------------------------------------------------------
# One block


class _Table(dict):
    """A block table: value → index, in insertion order (dicts keep it), so list(table) is the array."""

    __slots__ = ()

    def index(self, value):
        i = self.get(value)
        if i is None:
            i = self[value] = len(self)
        return i


class Block:
    """A block being filled: its tables, items and statistics; encode() gives its CBOR bytes."""

    def __init__(self, writer):
        self.w = writer
        self.ip = _Table()
        self.classtype = _Table()
        self.names = _Table()
        self.sigs = _Table()
        self.qrr = _Table()
        self.qlist = _Table()
        self.rr = _Table()
        self.rrlist = _Table()
        self.mm_data = _Table()
        # add_records takes the transactions: message records, neither client privacy nor full sections.
        self._c_loop = writer.records and writer.clients is None and not writer.full_sections
        # Item tuples, see add_python; maps are made at encode() once earliest-time is known. With the C loop
        # they are kept as C structs (_cdnsblock.Items reads as this list of tuples).
        self.items = _cdnsblock.Items() if self._c_loop else []
        self.malformed = []  # (ticks, client index, client port, data index)
        self.events = {}  # (type, code, address index, transport flags) -> count
        self.earliest = None  # ticks
        self.fallback_ticks = None  # earliest-time of a block with address events only
        self.processed = self.unmatched_q = self.unmatched_r = 0
        self.cache = _cdnsblock.Cache() if self._c_loop else None  # see _cdnsblock.add_records

    def __len__(self):
        return len(self.items) + len(self.malformed)

    def add(self, txs, start=0, stop=None):
        """Add transactions txs[start:stop]: the hot loop of the C-DNS export. txs: what the writer is given
        (writer.records): a probe._records.TxBatch of message records, else a list of (query, response,
        response_messages) tuples, which add_python takes.

        Records go through the C loop (export.cdns._cdnsblock.add_records) unless there is client privacy or there
        are full sections (then add_python takes their tuples); it gives back the transactions it does not take
        (malformed messages), one at a time, to add_python, the reference it must equal."""
        stop = len(txs) if stop is None else stop
        if not self.w.records:
            self.add_python(txs[start:stop])
            return
        if not self._c_loop:
            self.add_python(txs.to_tuples(start, stop))
            return
        i = start
        while i < stop:
            i, self.earliest, processed, unmatched_q, unmatched_r = _cdnsblock.add_records(
                txs, i, stop, self.ip, self.names, self.classtype, self.sigs, self.items, self.earliest,
                self.w.qr_type, self.cache
            )
            self.processed += processed
            self.unmatched_q += unmatched_q
            self.unmatched_r += unmatched_r
            if i < stop:
                self.add_python(txs.to_tuples(i, i + 1))
                i += 1

    def add_python(self, txs):
        """add() in Python: the reference implementation, and the path of client privacy and full sections."""
        w = self.w
        ip = self.ip
        ip_get = ip.get
        names = self.names
        names_get = names.get
        sigs = self.sigs
        sigs_get = sigs.get
        classtype = self.classtype
        classtype_get = classtype.get
        items_append = self.items.append
        clients = w.clients
        full = w.full_sections
        qr_type = w.qr_type
        earliest = self.earliest
        processed = unmatched_q = unmatched_r = 0
        for q, r, nresp in txs:
            m = q if q is not None else r
            ticks = m[_TS] // NS_PER_TICK
            if earliest is None or ticks < earliest:
                earliest = ticks
            if m[_MALFORMED]:
                self._malformed(m, q is None, ticks)
                continue
            if q is not None:
                client, cport, server, sport = q[_SRC], q[_SPORT], q[_DST], q[_DPORT]
            else:
                client, cport, server, sport = r[_DST], r[_DPORT], r[_SRC], r[_SPORT]
            if clients is not None:
                client = clients.address(client)
            ci = ip_get(client)
            if ci is None:
                ci = ip[client] = len(ip)
            si = ip_get(server)
            if si is None:
                si = ip[server] = len(ip)
            if m[_QNAME] is not None:
                raw = m[_RAW]  # the first question's name, in uncompressed wire form; its end is wanted below
                end = 12
                ln = raw[12]
                while 0 < ln < 64:
                    end += ln + 1
                    ln = raw[end]
                if ln == 0:
                    end += 1
                    name = raw[12:end]
                else:  # compressed (pointing into the header: odd, but the walker accepts it)
                    name = _wire(read_name(raw, 12)[0])
                    end = None
                ni = names_get(name)
                if ni is None:
                    ni = names[name] = len(names)
                ct = (m[_QTYPE], m[_QCLASS])
                cti = classtype_get(ct)
                if cti is None:
                    cti = classtype[ct] = len(classtype)
            else:
                ni = cti = end = None
            tflags = transport_flags(m)
            if q is not None:
                if query_trailing(q, end):
                    tflags |= F.TRANSPORT_QUERY_TRAILINGDATA
                qf = q[_FLAGS]
                sflags = F.QR_HAS_QUERY if q[_QD] else F.QR_HAS_QUERY | F.QR_QUERY_HAS_NO_QUESTION
                dnsflags = (qf >> 4) & 0x7F
                qe = q[_EDNS]
                if qe is not None:
                    sflags |= F.QR_QUERY_HAS_OPT
                    if qe[_E_DO]:
                        dnsflags |= F.QUERY_DO
                    qrcode = (qf & 0xF) | (qe[_E_EXT] << 4)
                    ednsv, udp = qe[_E_VERSION], qe[_E_UDP]
                    rdata = qe[_E_RDATA]
                    if rdata and clients is not None:
                        rdata = clients.opt_rdata(rdata)
                    opt_i = names_get(rdata)
                    if opt_i is None:
                        opt_i = names[rdata] = len(names)
                else:
                    qrcode = qf & 0xF
                    ednsv = udp = opt_i = None
                qan, qns, qar = q[_AN], q[_NS], q[_AR]
                hop = q[_TTL]
                qsize = q[_DNS_LEN]
                processed += 1
            else:
                sflags = 0
                dnsflags = 0
                qrcode = ednsv = udp = opt_i = qan = qns = qar = hop = qsize = None
            if r is not None:
                rf = r[_FLAGS]
                sflags |= F.QR_HAS_RESPONSE if r[_QD] else F.QR_HAS_RESPONSE | F.QR_RESPONSE_HAS_NO_QUESTION
                dnsflags |= ((rf >> 4) & 0x7F) << 8
                re_ = r[_EDNS]
                if re_ is not None:
                    sflags |= F.QR_RESPONSE_HAS_OPT
                    rrcode = (rf & 0xF) | (re_[_E_EXT] << 4)
                else:
                    rrcode = rf & 0xF
                rsize = r[_DNS_LEN]
                processed += nresp
                if q is not None:
                    delay = r[_TS] // NS_PER_TICK - ticks
                else:
                    delay = None
                    unmatched_r += 1
            else:
                rrcode = rsize = delay = None
                unmatched_q += 1
            sig = (
                si, sport, tflags, qr_type, sflags, (m[_FLAGS] >> 11) & 0xF, dnsflags, qrcode, cti, m[_QD],
                qan, qns, qar, ednsv, udp, opt_i, rrcode,
            )
            sgi = sigs_get(sig)
            if sgi is None:
                sgi = sigs[sig] = len(sigs)
            if full:
                qext = self._extended(q, True) if q is not None else None
                rext = self._extended(r, False) if r is not None else None
            else:
                qext = rext = None
            items_append((ticks, ci, cport, m[_ID], sgi, hop, delay, ni, qsize, rsize, qext, rext))
        self.earliest = earliest
        self.processed += processed
        self.unmatched_q += unmatched_q
        self.unmatched_r += unmatched_r

    def _extended(self, m, is_query):
        """QueryResponseExtended map of a message's sections (None when they are all empty)."""
        questions, an, ns, ar = message_sections(m[_RAW], is_query)
        ext = {}
        if questions and is_query:
            names, classtype = self.names, self.classtype
            qlist = tuple(
                self.qrr.index((names.index(name), classtype.index((qtype, qclass))))
                for name, qtype, qclass in questions
            )
            ext[F.QUESTION_INDEX] = self.qlist.index(qlist)
        for key, rrs in ((F.ANSWER_INDEX, an), (F.AUTHORITY_INDEX, ns), (F.ADDITIONAL_INDEX, ar)):
            if rrs:
                ext[key] = self.rrlist.index(tuple(self._rr(rr) for rr in rrs))
        return ext or None

    def _rr(self, rr):
        name, rtype, rclass, ttl, rdata = rr
        clients = self.w.clients
        if rtype == TYPE_OPT and rdata and clients is not None:
            rdata = clients.opt_rdata(rdata)
        names = self.names
        return self.rr.index((names.index(name), self.classtype.index((rtype, rclass)), ttl, names.index(rdata)))

    def _malformed(self, m, response, ticks):
        """A malformed message: its bytes in malformed-message-data, an item in malformed-messages."""
        if response:
            client, cport, server, sport = m[_DST], m[_DPORT], m[_SRC], m[_SPORT]
        else:
            client, cport, server, sport = m[_SRC], m[_SPORT], m[_DST], m[_DPORT]
        clients = self.w.clients
        if clients is not None:
            client = clients.address(client)
        tflags = transport_flags(m)
        data = self.mm_data.index((self.ip.index(server), sport, tflags, bytes(m[_RAW])))
        self.malformed.append((ticks, self.ip.index(client), cport, data))
        self.processed += 1

    def add_events(self, events, now_ns):
        """Add (key, count) pairs of decoder address events until the block holds max-block-items of
        them; returns the pairs left over."""
        clients = self.w.clients
        mine = self.events
        room = self.w.max_items
        for i, ((ae_type, code, address, ipv), count) in enumerate(events):
            if clients is not None:
                address = clients.address(address)
            key = (ae_type, code, self.ip.index(address), 1 if ipv == 6 else 0)
            if key not in mine and len(mine) >= room:
                return events[i:]
            mine[key] = mine.get(key, 0) + count
        if self.fallback_ticks is None and now_ns is not None:
            self.fallback_ticks = now_ns // NS_PER_TICK
        return []

    def encode(self, python=False):
        """The block's CBOR bytes. Tables are ordered most-referenced first, so that the indexes used most
        take the fewest bytes (CBOR: 1 byte below 24, 2 below 256); every reference is renumbered.
        Signatures and items are written by _cdnsblock when built; python=True: the reference, in Python."""
        c = None if python else _cdnsblock
        earliest = self.earliest if self.earliest is not None else self.fallback_ticks or 0
        items = self.items
        count = _count_uses_python if c is None else c.count_uses
        sig_uses = count(items, 4, len(self.sigs))
        ip_uses = count(items, 1, len(self.ip))
        name_uses = count(items, 7, len(self.names))
        for sig, i in self.sigs.items():
            uses = sig_uses[i]
            ip_uses[sig[0]] += uses
            if sig[15] is not None:
                name_uses[sig[15]] += uses
        for n, _, _, d in self.rr:
            name_uses[n] += 1
            name_uses[d] += 1
        by_use = _by_use if c is None else c.by_use
        sig_order, new_sig = by_use(sig_uses)
        ip_order, new_ip = by_use(ip_uses)
        name_order, new_name = by_use(name_uses)

        block = {
            F.BLOCK_PREAMBLE: {F.EARLIEST_TIME: [earliest // TICKS_PER_SECOND, earliest % TICKS_PER_SECOND]},
            F.BLOCK_STATISTICS: {
                F.PROCESSED_MESSAGES: self.processed,
                F.QR_DATA_ITEMS: len(items),
                F.UNMATCHED_QUERIES: self.unmatched_q,
                F.UNMATCHED_RESPONSES: self.unmatched_r,
                F.DISCARDED_OPCODE: 0,
                F.MALFORMED_ITEMS: len(self.malformed),
            },
        }
        tables = {}
        if self.ip:
            ips = list(self.ip)
            tables[F.IP_ADDRESS] = [ips[i] for i in ip_order]
        if self.classtype:
            tables[F.CLASSTYPE] = [{F.TYPE: t, F.CLASS: c} for t, c in self.classtype]
        if self.names:
            names = list(self.names)
            tables[F.NAME_RDATA] = [names[i] for i in name_order]
        if self.sigs:
            sigs = list(self.sigs)
            sigs = [sigs[i] for i in sig_order]
            data = c.encode_signatures(sigs, new_ip, new_name) if c else None
            tables[F.QR_SIG] = _Encoded(data) if data is not None else [_signature(s, new_ip, new_name) for s in sigs]
        if self.qlist:
            tables[F.QLIST] = [list(x) for x in self.qlist]
            tables[F.QRR] = [{F.NAME_INDEX: new_name[n], F.CLASSTYPE_INDEX: c} for n, c in self.qrr]
        if self.rrlist:
            tables[F.RRLIST] = [list(x) for x in self.rrlist]
            tables[F.RR] = [
                {F.NAME_INDEX: new_name[n], F.CLASSTYPE_INDEX: c, F.TTL: t, F.RDATA_INDEX: new_name[d]}
                for n, c, t, d in self.rr
            ]
        if self.mm_data:
            tables[F.MALFORMED_MESSAGE_DATA] = [
                {F.MM_SERVER_ADDRESS_INDEX: new_ip[s], F.MM_SERVER_PORT: p, F.MM_TRANSPORT_FLAGS: t, F.MM_PAYLOAD: d}
                for s, p, t, d in self.mm_data
            ]
        if tables:
            block[F.BLOCK_TABLES] = tables
        if items:
            args = (items, earliest, new_ip, new_sig, new_name)
            data = c.encode_items(*args) if c else None
            block[F.QUERY_RESPONSES] = (
                _Encoded(data) if data is not None else c.items(*args) if c else item_maps_python(*args)
            )
        if self.events:
            block[F.ADDRESS_EVENT_COUNTS] = [
                _event(ae_type, code, new_ip[ai], tflags, count)
                for (ae_type, code, ai, tflags), count in self.events.items()
            ]
        if self.malformed:
            block[F.MALFORMED_MESSAGES] = [
                {F.TIME_OFFSET: t - earliest, F.CLIENT_ADDRESS_INDEX: new_ip[c], F.CLIENT_PORT: p,
                 F.MESSAGE_DATA_INDEX: d}
                for t, c, p, d in self.malformed
            ]
        return cbor2.dumps(block, default=_write_encoded)


class _Encoded:
    """CBOR bytes made elsewhere (_cdnsblock.encode_items, encode_signatures) that cbor2.dumps writes as is."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def _write_encoded(encoder, value):
    encoder.write(value.data)


def _count_uses_python(items, field, n):
    """Reference of _cdnsblock.count_uses: how many items hold each index 0..n-1 in `field` (None skipped)."""
    uses = [0] * n
    for i in map(itemgetter(field), items):
        if i is not None:
            uses[i] += 1
    return uses


def _by_use(uses):
    """(old indexes most used first, new index of each old index); ties keep the order of first use
    (sorted is stable, also with reverse=True). The reference of _cdnsblock.by_use."""
    order = sorted(range(len(uses)), key=uses.__getitem__, reverse=True)
    new = [0] * len(uses)
    for j, i in enumerate(order):
        new[i] = j
    return order, new


def _signature(sig, new_ip, new_name):
    out = {k: v for k, v in zip(SIG_KEYS, sig) if v is not None}
    out[F.SERVER_ADDRESS_INDEX] = new_ip[sig[0]]
    if sig[15] is not None:
        out[F.QUERY_OPT_RDATA_INDEX] = new_name[sig[15]]
    return out


def item_maps_python(items, earliest, new_ip, new_sig, new_name):
    """The QueryResponse maps of the items, indexes renumbered: the reference of _cdnsblock.items (and of
    _cdnsblock.encode_items, which writes their CBOR without making them)."""
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
