"""One block of a C-DNS file (RFC 8618 7.3), decoded: its tables, and its Q/R items and malformed messages as message
tuples in the layout of probe.model.MESSAGE_FIELDS (export/cdns/reader.py reads the file and builds the columns;
the format rules applied are described there). An index out of its table raises BadIndex."""


from export.cdns import format as F
from probe.decode.dnswire import Malformed, name_text, parse_message, parse_opt, read_name
from probe.errors import CaptureFileError
from probe.model import EDNS_FIELDS, MESSAGE_FIELDS, NET_FIELDS, TRANSPORTS

# Query/response hint bits of the full sections, all needed to rebuild DNS messages.
SECTION_HINTS = (
    "query-question-sections", "query-answer-sections", "query-authority-sections", "query-additional-sections",
    "response-answer-sections", "response-authority-sections", "response-additional-sections",
)
_HINT = {name: 1 << bit for name, bit in F.QR_HINT_BITS.items()}

TYPE_OPT = 41
_IP_PROTO = {F.TRANSPORT_UDP: 17, F.TRANSPORT_TCP: 6, F.TRANSPORT_TLS: 6, F.TRANSPORT_DTLS: 17, F.TRANSPORT_HTTPS: 6}
# The transport field (probe.model TRANSPORTS) of an RFC 8618 transport value; DTLS and non-standard: none (None).
_TRANSPORT_CODE = {cdns: code for code, (_, _, cdns) in TRANSPORTS.items() if cdns != F.TRANSPORT_NON_STANDARD}
_FIELD = {name: i for i, name in enumerate(MESSAGE_FIELDS)}
_NET = len(NET_FIELDS)


class BadIndex(Exception):
    """A table index out of range, or an item that is not a map."""


def _at(table, index, what):
    """table[index] for a 0-based C-DNS index, which must be an int inside the table."""
    if type(index) is not int or not 0 <= index < len(table):
        raise BadIndex(f"{what} index {index!r} out of range (the table has {len(table)} entries)")
    return table[index]


def _message(**fields):
    """A message tuple (MESSAGE_FIELDS layout) from the fields given; the others are None."""
    out = [None] * len(MESSAGE_FIELDS)
    for name, value in fields.items():
        out[_FIELD[name]] = value
    return tuple(out)


class BlockParams:
    """The storage parameters a block refers to: ticks per second and the hints."""

    def __init__(self, params, index, path):
        storage = params.get(F.STORAGE_PARAMETERS)
        if not isinstance(storage, dict):
            raise CaptureFileError(path, f"block parameters {index}: no storage parameters")
        self.tps = storage.get(F.TICKS_PER_SECOND)
        if type(self.tps) is not int or self.tps <= 0:
            raise CaptureFileError(path, f"block parameters {index}: bad ticks-per-second {self.tps!r}")
        hints = storage.get(F.STORAGE_HINTS) or {}
        if not isinstance(hints, dict):
            raise CaptureFileError(path, f"block parameters {index}: storage-hints is not a map")

        def bits(mapping, key, what):
            value = mapping.get(key, 0)
            if type(value) is not int or value < 0:
                raise CaptureFileError(path, f"block parameters {index}: {what} {value!r} is not a bit mask")
            return value

        self.qr_hints = bits(hints, F.QUERY_RESPONSE_HINTS, "query-response-hints")
        self.sig_hints = bits(hints, F.QUERY_RESPONSE_SIGNATURE_HINTS, "query-response-signature-hints")
        self.rr_hints = bits(hints, F.RR_HINTS, "rr-hints")
        self.storage_flags = bits(storage, F.STORAGE_FLAGS, "storage-flags")

    def missing_sections(self):
        return [name for name in SECTION_HINTS if not self.qr_hints & _HINT[name]]


def _pad(addr, ipv6):
    """Addresses may be stored shortened (a prefix): pad to the full length with zero bytes."""
    if not isinstance(addr, bytes):
        raise ValueError(f"address {addr!r} is not a byte string")
    return addr.ljust(16 if ipv6 or len(addr) > 4 else 4, b"\0")


def _header_flags(dns_flags, opcode, rcode, response):
    """The 16-bit header flags word from the C-DNS DNS flags (query bits 0..6, response bits 8..14)."""
    bits = (dns_flags >> F.RESPONSE_FLAGS_SHIFT if response else dns_flags) & 0x7F
    return (0x8000 if response else 0) | ((opcode or 0) & 0xF) << 11 | bits << 4 | ((rcode or 0) & 0xF)


class DecodedBlock:
    """One decoded block: its tables, and the messages of its items."""

    def __init__(self, block, params):
        pre = block.get(F.BLOCK_PREAMBLE, {})
        self.params = _at(params, pre.get(F.BLOCK_PARAMETERS_INDEX, 0), "block-parameters")
        secs, ticks = pre.get(F.EARLIEST_TIME, (0, 0))
        self.base_ticks = secs * self.params.tps + ticks
        self.items_ = block.get(F.QUERY_RESPONSES, ())
        self.malformed = block.get(F.MALFORMED_MESSAGES, ())
        t = block.get(F.BLOCK_TABLES, {})
        self.addresses = t.get(F.IP_ADDRESS, ())
        self.classtypes = t.get(F.CLASSTYPE, ())
        self.names = t.get(F.NAME_RDATA, ())
        self.sigs = t.get(F.QR_SIG, ())
        self.qlists = t.get(F.QLIST, ())
        self.questions = t.get(F.QRR, ())
        self.rrlists = t.get(F.RRLIST, ())
        self.rrs = t.get(F.RR, ())
        self.mm_data = t.get(F.MALFORMED_MESSAGE_DATA, ())
        self._text = {}

    def ns(self, ticks):
        return ticks * 1_000_000_000 // self.params.tps

    def name(self, index):
        """(wire, text, label count) of a name in the name-rdata table."""
        out = self._text.get(index)
        if out is None:
            wire = _at(self.names, index, "name-rdata")
            try:
                labels, end = read_name(wire, 0)
            except (Malformed, IndexError, TypeError):
                raise ValueError(f"name-rdata {index} is not a wire-format name") from None
            out = self._text[index] = (wire[:end], name_text(labels), len(labels))
        return out

    def classtype(self, index):
        ct = _at(self.classtypes, index, "classtype")
        return ct.get(F.TYPE), ct.get(F.CLASS)

    def rr_list(self, index):
        out = []
        for i in _at(self.rrlists, index, "rrlist"):
            rr = _at(self.rrs, i, "rr")
            rtype, rclass = self.classtype(rr[F.CLASSTYPE_INDEX])
            rdata = _at(self.names, rr[F.RDATA_INDEX], "name-rdata") if F.RDATA_INDEX in rr else b""
            out.append((self.name(rr[F.NAME_INDEX])[0], rtype, rclass, rr.get(F.TTL, 0), rdata))
        return out

    def question_list(self, index):
        out = []
        for i in _at(self.qlists, index, "qlist"):
            q = _at(self.questions, i, "qrr")
            out.append((self.name(q[F.NAME_INDEX])[0], *self.classtype(q[F.CLASSTYPE_INDEX])))
        return out

    def sections(self, ext, response):
        """[extra questions, answers, authority, additional] of a query- or response-extended map; None for
        a section the hints say was not recorded."""
        hints = self.params.qr_hints
        names = SECTION_HINTS[4:] if response else SECTION_HINTS[1:4]
        out = [self.question_list(ext[F.QUESTION_INDEX]) if F.QUESTION_INDEX in ext else []]
        if not hints & _HINT["query-question-sections"] and F.QUESTION_INDEX not in ext:
            out[0] = None
        for key, hint in zip((F.ANSWER_INDEX, F.AUTHORITY_INDEX, F.ADDITIONAL_INDEX), names):
            if key in ext:
                out.append(self.rr_list(ext[key]))
            else:
                out.append([] if hints & _HINT[hint] else None)
        return out

    def items(self, want_sections):
        out = []
        for item in self.items_:
            if type(item) is not dict:
                raise BadIndex(f"a Q/R item is a {type(item).__name__}, not a map")
            out.append(self._qr(item, want_sections))
        for mm in self.malformed:
            if type(mm) is not dict:
                raise BadIndex(f"a malformed-message item is a {type(mm).__name__}, not a map")
            out.append(self._malformed(mm, want_sections))
        return out

    def _qr(self, item, want_sections):
        """(query tuple, response tuple, Sections or None) of a Q/R item; None for a message it does not have."""
        sig = _at(self.sigs, item[F.QR_SIGNATURE_INDEX], "qr-sig") if F.QR_SIGNATURE_INDEX in item else {}
        sflags = sig.get(F.QR_SIG_FLAGS)
        if sflags is None:
            sflags = _synthesise_sig_flags(item, sig)
        tflags = sig.get(F.QR_TRANSPORT_FLAGS, 0)
        ipv6 = bool(tflags & F.TRANSPORT_IPV6)
        transport = (tflags & F.TRANSPORT_MASK) >> F.TRANSPORT_SHIFT
        ipv, proto, code = (6 if ipv6 else 4), _IP_PROTO.get(transport), _TRANSPORT_CODE.get(transport)
        client = _pad(_at(self.addresses, item[F.CLIENT_ADDRESS_INDEX], "ip-address"), ipv6) \
            if F.CLIENT_ADDRESS_INDEX in item else None
        server = _pad(_at(self.addresses, sig[F.SERVER_ADDRESS_INDEX], "ip-address"), ipv6) \
            if F.SERVER_ADDRESS_INDEX in sig else None
        ends = (client, item.get(F.CLIENT_PORT), server, sig.get(F.SERVER_PORT))
        qname_wire = qname = labels = qtype = qclass = None
        if F.QUERY_NAME_INDEX in item:
            qname_wire, qname, labels = self.name(item[F.QUERY_NAME_INDEX])
        if F.QUERY_CLASSTYPE_INDEX in sig:
            qtype, qclass = self.classtype(sig[F.QUERY_CLASSTYPE_INDEX])
        common = dict(ipv=ipv, proto=proto, transport=code, scope=proto, id=item.get(F.TRANSACTION_ID), qname=qname,
                      qtype=qtype, qclass=qclass, labels=labels)
        q = r = qsec = rsec = qopt = None
        if sflags & F.QR_HAS_QUERY:
            q, qopt = self._query(item, sig, sflags, ends, common)
            if want_sections:
                qsec = self.sections(item.get(F.QUERY_EXTENDED, {}), False)
        if sflags & F.QR_HAS_RESPONSE:
            r, rsec = self._response(item, sig, sflags, ends, common)
        if not want_sections:
            return q, r, None
        first_q = None if qname_wire is None or qtype is None else (qname_wire, qtype, qclass)
        return q, r, Sections(sflags, qsec, rsec, first_q, qopt, sig.get(F.QR_DNS_FLAGS) or 0, sig, tflags)

    def _query(self, item, sig, sflags, ends, common):
        """(query tuple, the OPT (UDP size, TTL, RDATA) the signature holds or None) of a Q/R item."""
        client, cport, server, sport = ends
        dns_flags, opcode, qrcode = sig.get(F.QR_DNS_FLAGS), sig.get(F.QUERY_OPCODE), sig.get(F.QUERY_RCODE)
        qedns = qopt = None
        if sflags & F.QR_QUERY_HAS_OPT:
            # The query's OPT is in the signature, or (RFC 8618 7.6.2) in its recorded additional section.
            opt = None
            if F.QUERY_UDP_SIZE not in sig and F.QUERY_OPT_RDATA_INDEX not in sig:
                opt = _opt_rr(self.sections(item.get(F.QUERY_EXTENDED, {}), False)[3])
            if opt is None:
                rdata = _at(self.names, sig[F.QUERY_OPT_RDATA_INDEX], "name-rdata") \
                    if F.QUERY_OPT_RDATA_INDEX in sig else b""
                ttl = ((qrcode or 0) >> 4 & 0xFF) << 24 | (sig.get(F.QUERY_EDNS_VERSION, 0) & 0xFF) << 16
                ttl |= 0x8000 if (dns_flags or 0) & F.QUERY_DO else 0
                udp = sig.get(F.QUERY_UDP_SIZE)
                qopt = (udp or 0, ttl, rdata)
                opt = (b"\0", TYPE_OPT, udp, ttl, rdata)
            qedns = _edns(opt, (qrcode or 0) >> 4)
        q = _message(
            ts_ns=self.ns(self.base_ticks + item.get(F.TIME_OFFSET, 0)), src=client, sport=cport, dst=server,
            dport=sport, ttl=item.get(F.CLIENT_HOPLIMIT),
            dns_len=item.get(F.QUERY_SIZE), qdcount=sig.get(F.QUERY_QDCOUNT), ancount=sig.get(F.QUERY_ANCOUNT),
            nscount=sig.get(F.QUERY_NSCOUNT), arcount=sig.get(F.QUERY_ARCOUNT), malformed=False, edns=qedns,
            flags=None if dns_flags is None and opcode is None and qrcode is None
            else _header_flags(dns_flags or 0, opcode, qrcode, False),
            **common,
        )
        return q, qopt

    def _response(self, item, sig, sflags, ends, common):
        """(response tuple, its recorded sections) of a Q/R item."""
        client, cport, server, sport = ends
        dns_flags, opcode, rrcode = sig.get(F.QR_DNS_FLAGS), sig.get(F.QUERY_OPCODE), sig.get(F.RESPONSE_RCODE)
        has_q = sflags & F.QR_HAS_QUERY
        rsec = self.sections(item.get(F.RESPONSE_EXTENDED, {}), True)
        counts = [None if s is None else len(s) for s in rsec]
        if counts[0] is not None:
            counts[0] += 0 if sflags & F.QR_RESPONSE_HAS_NO_QUESTION else 1
        ext_rcode = (rrcode or 0) >> 4
        redns = None
        if sflags & F.QR_RESPONSE_HAS_OPT:
            opt = _opt_rr(rsec[3])
            if opt is None:  # the OPT was not recorded: only the extended RCODE is known
                redns = (None, None, None, ext_rcode) + (None,) * (len(EDNS_FIELDS) - 4)
            else:
                redns = _edns(opt, ext_rcode)
        delay = item.get(F.RESPONSE_DELAY, 0) if has_q else 0
        r = _message(
            ts_ns=self.ns(self.base_ticks + item.get(F.TIME_OFFSET, 0) + delay), src=server, sport=sport, dst=client,
            dport=cport, dns_len=item.get(F.RESPONSE_SIZE), qdcount=counts[0] if has_q else sig.get(F.QUERY_QDCOUNT),
            ancount=counts[1], nscount=counts[2], arcount=counts[3], malformed=False, edns=redns,
            flags=None if dns_flags is None and opcode is None and rrcode is None
            else _header_flags(dns_flags or 0, opcode, rrcode, True),
            **common,
        )
        return r, rsec

    def _malformed(self, mm, want_sections):
        data = {}
        if F.MESSAGE_DATA_INDEX in mm:
            data = _at(self.mm_data, mm[F.MESSAGE_DATA_INDEX], "malformed-message-data")
        tflags = data.get(F.MM_TRANSPORT_FLAGS, 0)
        ipv6 = bool(tflags & F.TRANSPORT_IPV6)
        transport = (tflags & F.TRANSPORT_MASK) >> F.TRANSPORT_SHIFT
        proto, code = _IP_PROTO.get(transport), _TRANSPORT_CODE.get(transport)
        client = _pad(_at(self.addresses, mm[F.CLIENT_ADDRESS_INDEX], "ip-address"), ipv6) \
            if F.CLIENT_ADDRESS_INDEX in mm else None
        server = _pad(_at(self.addresses, data[F.MM_SERVER_ADDRESS_INDEX], "ip-address"), ipv6) \
            if F.MM_SERVER_ADDRESS_INDEX in data else None
        cport, sport = mm.get(F.CLIENT_PORT), data.get(F.MM_SERVER_PORT)
        payload = data.get(F.MM_PAYLOAD, b"")
        dns = list(parse_message(payload))
        dns[_FIELD["malformed"] - _NET] = True  # the writer found it malformed, whatever our walker thinks
        flags = dns[_FIELD["flags"] - _NET]
        response = flags is not None and flags & 0x8000
        src, sp, dst, dp = (server, sport, client, cport) if response else (client, cport, server, sport)
        net = _message(
            ts_ns=self.ns(self.base_ticks + mm.get(F.TIME_OFFSET, 0)), ipv=6 if ipv6 else 4, proto=proto,
            transport=code, scope=proto, src=src, sport=sp, dst=dst, dport=dp,
        )[:_NET]
        msg = net + tuple(dns)
        extra = Sections(None, None, None, None, None, 0, {}, tflags, payload) if want_sections else None
        return (None, msg, extra) if response else (msg, None, extra)


def _opt_rr(rrs):
    """The first OPT RR of a recorded section, or None (also when the section was not recorded)."""
    return next((rr for rr in rrs if rr[1] == TYPE_OPT), None) if rrs else None


def _edns(opt, ext_rcode):
    """The EDNS tuple (EDNS_FIELDS) of an OPT RR (name, type, class, ttl, rdata); the extended RCODE is the
    one of the signature's RCODE, which includes it. Options that cannot be parsed are left out."""
    _, _, udp, ttl, rdata = opt
    try:
        edns = parse_opt(rdata, udp, ttl, 0, len(rdata))
    except Malformed:
        edns = parse_opt(b"", udp, ttl, 0, 0)
    return edns[:3] + (ext_rcode,) + edns[4:]


def _synthesise_sig_flags(item, sig):
    """qr-sig-flags when the writer did not record them (RFC 8618 Appendix D.2): guessed from what is there."""
    flags = 0
    if any(k in item for k in (F.CLIENT_HOPLIMIT, F.QUERY_SIZE, F.RESPONSE_DELAY)) or any(
        k in sig for k in (F.QUERY_QDCOUNT, F.QUERY_ANCOUNT, F.QUERY_NSCOUNT, F.QUERY_ARCOUNT, F.QUERY_RCODE)
    ):
        flags |= F.QR_HAS_QUERY
    if any(k in sig for k in (F.QUERY_EDNS_VERSION, F.QUERY_UDP_SIZE, F.QUERY_OPT_RDATA_INDEX)):
        flags |= F.QR_HAS_QUERY | F.QR_QUERY_HAS_OPT
    if any(k in item for k in (F.RESPONSE_DELAY, F.RESPONSE_SIZE, F.RESPONSE_EXTENDED)) or F.RESPONSE_RCODE in sig:
        flags |= F.QR_HAS_RESPONSE
    return flags or F.QR_HAS_QUERY


class Sections:
    """What rebuilds the DNS messages of one item (see export.cdns.pcap)."""

    __slots__ = ("sig_flags", "query", "response", "first_question", "query_opt", "dns_flags", "sig", "transport",
                 "payload")

    def __init__(self, sig_flags, query, response, first_question, query_opt, dns_flags, sig, transport,
                 payload=None):
        self.sig_flags = sig_flags
        self.query = query
        self.response = response
        self.first_question = first_question
        self.query_opt = query_opt
        self.dns_flags = dns_flags
        self.sig = sig
        self.transport = transport
        self.payload = payload
