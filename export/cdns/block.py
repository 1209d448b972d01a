"""One C-DNS block (RFC 8618 7.3): transactions → deduplicated tables, Q/R items, address events, statistics
→ the block's CBOR. What is recorded, and how, is described in export/cdns/writer.py.

Block.add_python is the reference, on transaction tuples: the reference pipeline's, and that of the C loop on
message records (export.cdns._cdnsblock.add_records), which Block.add runs in the production pipeline for the
common transactions, giving the others to add_python (tests/export/test_cdns_block.py, test_cdnsrec.py).
"""


import struct

from export.cdns import format as F
from export.cdns.encode import SIG_KEYS, TICKS_PER_SECOND, encode_block
from probe.decode.dnswire import Malformed, read_name, read_rr, skip_name, walk_rrs
from probe.model import CDNS_TRANSPORT_UNKNOWN, TRANSPORTS, E, M
from probe.native import load

_cdnsblock = load("export.cdns._cdnsblock")
BACKEND = "c" if _cdnsblock is not None else "python"

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

_HDR_COUNTS = struct.Struct("!4xHHHH").unpack_from
_HH = struct.Struct("!HH").unpack_from

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
            labels, rtype, rclass, ttl, start, off = read_rr(buf, off)
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


def _response_signature(r, sflags, dnsflags):
    """The signature's qr-sig-flags and DNS flags with the response's added, and the response rcode."""
    rf = r[_FLAGS]
    sflags |= F.QR_HAS_RESPONSE if r[_QD] else F.QR_HAS_RESPONSE | F.QR_RESPONSE_HAS_NO_QUESTION
    dnsflags |= ((rf >> 4) & 0x7F) << 8
    re_ = r[_EDNS]
    if re_ is not None:
        return sflags | F.QR_RESPONSE_HAS_OPT, dnsflags, (rf & 0xF) | (re_[_E_EXT] << 4)
    return sflags, dnsflags, rf & 0xF


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

    def __init__(self, writer, previous=None, python=False):
        """previous: the block before this one (its C tables' sizes are where this one's start), or None.
        python: the reference block (tests), every table a dict and the items a list, filled by add_python alone."""
        self.w = writer
        # add_records takes the transactions: transaction records, neither client privacy nor full sections.
        self._c_loop = writer.tx_records and writer.clients is None and not writer.full_sections and not python
        # The address, name and signature tables: with the C loop, held in C (_cdnsblock.Keys, read as the _Table
        # it replaces; a signature's key as its tuple).
        like = previous if previous is not None and previous._c_loop else None
        self.ip = _cdnsblock.Keys(getattr(like, "ip", None)) if self._c_loop else _Table()
        self.names = _cdnsblock.Keys(getattr(like, "names", None)) if self._c_loop else _Table()
        self.sigs = _cdnsblock.Keys(getattr(like, "sigs", None), len(SIG_KEYS)) if self._c_loop else _Table()
        self.classtype = _Table()
        self.qrr = _Table()
        self.qlist = _Table()
        self.rr = _Table()
        self.rrlist = _Table()
        self.mm_data = _Table()
        # Item tuples, see add_python; maps are made at encode() once earliest-time is known. With the C loop
        # they are kept as C structs (_cdnsblock.Items reads as this list of tuples).
        self.items = _cdnsblock.Items(writer.max_items) if self._c_loop else []
        self.malformed = []  # (ticks, client index, client port, data index)
        self.events = {}  # (type, code, address index, transport flags) -> count
        self.earliest = None  # ticks
        self.fallback_ticks = None  # earliest-time of a block with address events only
        self.processed = self.unmatched_q = self.unmatched_r = 0
        # Lookups by content in front of the class/type dict: see _cdnsblock.add_records.
        self.cache = _cdnsblock.Cache(getattr(like, "cache", None)) if self._c_loop else None

    def __len__(self):
        return len(self.items) + len(self.malformed)

    def add(self, txs, start=0, stop=None):
        """Add transactions txs[start:stop]: the hot loop of the C-DNS export. txs: what the writer is given
        (writer.tx_records): a probe._records.TxBatch of transaction records, else a list of (query, response,
        response_messages) tuples, which add_python takes.

        Records go through the C loop (export.cdns._cdnsblock.add_records) unless there is client privacy or there
        are full sections (then add_python takes their tuples); it gives back the transactions it does not take
        (malformed messages), one at a time, to add_python, the reference it must equal."""
        stop = len(txs) if stop is None else stop
        if not self.w.tx_records:
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
        ip_get, ip_index = self.ip.get, self.ip.index
        sigs_get, sigs_index = self.sigs.get, self.sigs.index
        items_append = self.items.append
        clients = self.w.clients
        full = self.w.full_sections
        qr_type = self.w.qr_type
        question, query_signature = self._question, self._query_signature
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
                ci = ip_index(client)
            si = ip_get(server)
            if si is None:
                si = ip_index(server)
            ni, cti, end = question(m)
            tflags = transport_flags(m)
            if q is not None:
                if query_trailing(q, end):
                    tflags |= F.TRANSPORT_QUERY_TRAILINGDATA
                sflags, dnsflags, qrcode, ednsv, udp, opt_i = query_signature(q)
                qan, qns, qar, hop, qsize = q[_AN], q[_NS], q[_AR], q[_TTL], q[_DNS_LEN]
                processed += 1
            else:
                sflags = dnsflags = 0
                qrcode = ednsv = udp = opt_i = qan = qns = qar = hop = qsize = None
            if r is not None:
                sflags, dnsflags, rrcode = _response_signature(r, sflags, dnsflags)
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
                sgi = sigs_index(sig)
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

    def _question(self, m):
        """(name index, class-type index, offset just past the name when it is not compressed) of a message's first
        question; (None, None, None) without one."""
        if m[_QNAME] is None:
            return None, None, None
        raw = m[_RAW]  # the first question's name, in uncompressed wire form; its end is wanted by query_trailing
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
        names = self.names
        ni = names.get(name)
        if ni is None:
            ni = names.index(name)
        classtype = self.classtype
        ct = (m[_QTYPE], m[_QCLASS])
        cti = classtype.get(ct)
        if cti is None:
            cti = classtype[ct] = len(classtype)
        return ni, cti, end

    def _query_signature(self, q):
        """The query's part of a Q/R signature: (qr-sig-flags, query DNS flags, query rcode, EDNS version, UDP
        size, OPT RDATA index)."""
        qf = q[_FLAGS]
        sflags = F.QR_HAS_QUERY if q[_QD] else F.QR_HAS_QUERY | F.QR_QUERY_HAS_NO_QUESTION
        dnsflags = (qf >> 4) & 0x7F
        qe = q[_EDNS]
        if qe is None:
            return sflags, dnsflags, qf & 0xF, None, None, None
        sflags |= F.QR_QUERY_HAS_OPT
        if qe[_E_DO]:
            dnsflags |= F.QUERY_DO
        rdata = qe[_E_RDATA]
        clients = self.w.clients
        if rdata and clients is not None:
            rdata = clients.opt_rdata(rdata)
        names = self.names
        opt_i = names.get(rdata)
        if opt_i is None:
            opt_i = names.index(rdata)
        return sflags, dnsflags, (qf & 0xF) | (qe[_E_EXT] << 4), qe[_E_VERSION], qe[_E_UDP], opt_i

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
        """The block's CBOR bytes (export.cdns.encode.encode_block; python=True: the reference, in Python)."""
        return encode_block(self, python)
