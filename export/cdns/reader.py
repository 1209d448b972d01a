"""C-DNS (RFC 8618) reader: the transactions of a file as dnsprobe records, and its DNS messages as a pcap.

A file is `["C-DNS", preamble, [block, ...]]`. The outer array header, the file type id and the preamble
are read first; the block array (definite, or indefinite and closed by a break byte as streaming
writers leave it) is then decoded **one block at a time** with cbor2, so memory is bounded by a block
whatever the file size. Plain, gzip, xz and zstd files are recognised by their content.

Format 1.0 rules applied: table indexes are 0-based; a table or a map key that is absent is simply
not there (an absent table is empty, an absent item field is unknown: null in the record); negative
(implementation-specific) map keys are ignored; an item's time is the block's earliest time plus its
time offset in ticks (ticks per second from the block's parameters); the response time is the query
time plus the signed response delay. Storage hints tell which fields the writer records: a section
whose hint bit is set and whose index is absent was empty (count 0); with the bit cleared it is
unknown (null).

Records: each Q/R item becomes a query tuple and/or a response tuple in the layout of
probe.model.MESSAGE_FIELDS, and export.parquet.records.RecordBuilder turns them into the same columns
as the Parquet output, with the same semantics (client = src, server = dst, query columns null in a
response-only row, ...). Columns C-DNS does not carry (frame lengths, UDP checksum, VLAN, TCP
handshake RTT, zone-transfer message count) are left out (see CDNS_ABSENT_COLUMNS). Malformed
messages (the block's malformed-messages list) become rows with malformed = true, their header and
question read from the recorded payload.

Errors: every problem is a CaptureFileError naming the file and the problem (bad magic, wrong major
version, truncation, an index out of range, ...); the blocks read before it have been yielded.
"""

import io
import lzma
import struct

import cbor2

from export.cdns import format as F
from probe.compressed import open_stream
from probe.decode.dnswire import Malformed, name_text, parse_message, parse_opt, read_name
from probe.errors import CaptureFileError
from probe.model import EDNS_FIELDS, MESSAGE_FIELDS, NET_FIELDS, TRANSPORTS

# Parquet columns that C-DNS does not record; the C-DNS records leave them out.
CDNS_ABSENT_COLUMNS = ("len", "udp_sum", "res_len", "vlan", "tcp_hs_rtt", "response_messages")

# Query/response hint bits of the full sections, all needed to rebuild DNS messages.
SECTION_HINTS = (
    "query-question-sections", "query-answer-sections", "query-authority-sections", "query-additional-sections",
    "response-answer-sections", "response-authority-sections", "response-additional-sections",
)
_HINT = {name: 1 << bit for name, bit in F.QR_HINT_BITS.items()}

TYPE_OPT = 41
_CHUNK = 1 << 16
_BREAK = 0xFF
_IP_PROTO = {F.TRANSPORT_UDP: 17, F.TRANSPORT_TCP: 6, F.TRANSPORT_TLS: 6, F.TRANSPORT_DTLS: 17, F.TRANSPORT_HTTPS: 6}
# The transport field (probe.model TRANSPORTS) of an RFC 8618 transport value; DTLS and non-standard: none (None).
_TRANSPORT_CODE = {cdns: code for code, (_, _, cdns) in TRANSPORTS.items() if cdns != F.TRANSPORT_NON_STANDARD}
_FIELD = {name: i for i, name in enumerate(MESSAGE_FIELDS)}
_NET = len(NET_FIELDS)


class _BadIndex(Exception):
    pass


def _at(table, index, what):
    """table[index] for a 0-based C-DNS index, which must be an int inside the table."""
    if type(index) is not int or not 0 <= index < len(table):
        raise _BadIndex(f"{what} index {index!r} out of range (the table has {len(table)} entries)")
    return table[index]


def _message(**fields):
    """A message tuple (MESSAGE_FIELDS layout) from the fields given; the others are None."""
    out = [None] * len(MESSAGE_FIELDS)
    for name, value in fields.items():
        out[_FIELD[name]] = value
    return tuple(out)


class _Window(io.RawIOBase):
    """A stream that can step back over what it last returned, cheaply.

    cbor2 reads ahead in large chunks from a seekable stream and seeks back over what it did not use;
    GzipFile and LZMAFile are "seekable", but a backward seek restarts the decompression. This window
    keeps the last chunk so that the step back is free, and reports decompression failures by name.
    """

    def __init__(self, stream, path):
        super().__init__()
        self.stream = stream
        self.path = path
        self.buf = b""
        self.pos = 0
        self.offset = 0  # stream bytes before buf[0]

    def readable(self):
        return True

    def seekable(self):
        return True

    def _fill(self, need):
        if len(self.buf) - self.pos >= need:
            return
        try:
            chunk = self.stream.read(max(_CHUNK, need))
        except (OSError, EOFError, lzma.LZMAError) as exc:
            raise CaptureFileError(self.path, f"decompression failed: {exc}") from None
        except Exception as exc:  # zstandard raises its own ZstdError type
            raise CaptureFileError(self.path, f"read failed: {exc}") from None
        self.offset += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0

    def read(self, n=-1):
        if n is None or n < 0:
            raise io.UnsupportedOperation("read() needs a size")
        self._fill(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def peek(self):
        """The next byte as an int, or None at the end of the stream."""
        self._fill(1)
        return self.buf[self.pos] if self.pos < len(self.buf) else None

    def tell(self):
        return self.offset + self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self.tell() + offset}.get(whence)
        if target is None or not self.offset <= target <= self.offset + len(self.buf):
            raise io.UnsupportedOperation("seek outside the current chunk")
        self.pos = target - self.offset
        return target


def sniff_cdns(head):
    """True when the first bytes (of the decompressed file) are those of a C-DNS file."""
    return len(head) >= 7 and head[0] in (0x83, 0x9F) and head[1:7] == b"eC-DNS"


def file_head(path, size=8):
    """The first bytes of a file after decompression (for telling C-DNS from Parquet)."""
    stream, _ = open_stream(path)
    try:
        return _Window(stream, path).read(size)
    finally:
        stream.close()


def _array_length(window, path, what):
    """Read a CBOR array header; the element count, or None for an indefinite-length array."""
    first = window.read(1)
    if not first:
        raise CaptureFileError(path, f"truncated: the file ends before the {what}")
    major, info = first[0] >> 5, first[0] & 0x1F
    if major != 4:
        raise CaptureFileError(path, f"not a C-DNS file: the {what} is not a CBOR array")
    if info < 24:
        return info
    if info == 31:
        return None
    size = {24: 1, 25: 2, 26: 4, 27: 8}.get(info)
    raw = window.read(size) if size else b""
    if size is None or len(raw) != size:
        raise CaptureFileError(path, f"bad CBOR array header for the {what}")
    return int.from_bytes(raw, "big")


class CdnsFile:
    """An open C-DNS file: its preamble, then its blocks one at a time (use as a context manager)."""

    def __init__(self, path):
        self.path = path
        self.stream, _ = open_stream(path)
        self.window = _Window(self.stream, path)
        self.decoder = cbor2.CBORDecoder(self.window, read_size=_CHUNK)
        try:
            self._read_header()
        except BaseException:
            self.close()
            raise

    def close(self):
        self.stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _decode(self, what):
        try:
            return self.decoder.decode()
        except cbor2.CBORDecodeEOF:
            raise CaptureFileError(self.path, f"truncated: the file ends inside {what}") from None
        except (cbor2.CBORDecodeError, RecursionError, ValueError, TypeError) as exc:
            raise CaptureFileError(self.path, f"{what} is not valid CBOR: {exc}") from None

    def _read_header(self):
        path = self.path
        head = self.window.read(1)
        if not head:
            raise CaptureFileError(path, "empty file, not a C-DNS file")
        if head[0] not in (0x83, 0x9F):
            raise CaptureFileError(path, f"not a C-DNS file (starts with byte 0x{head[0]:02x}, not an array of 3)")
        self.outer_indefinite = head[0] == 0x9F
        file_type = self._decode("the file type id")
        if file_type != F.FILE_TYPE_ID:
            raise CaptureFileError(path, f"not a C-DNS file (file type id {file_type!r}, expected 'C-DNS')")
        pre = self._decode("the file preamble")
        if not isinstance(pre, dict):
            raise CaptureFileError(path, "bad file preamble: not a map")
        major, minor = pre.get(F.MAJOR_FORMAT_VERSION), pre.get(F.MINOR_FORMAT_VERSION)
        if major != F.FORMAT_MAJOR:
            raise CaptureFileError(
                path, f"unsupported C-DNS format version {major}.{minor} (this reader reads version 1.x)"
            )
        self.preamble = pre
        self.version = (major, minor, pre.get(F.PRIVATE_VERSION))
        params = pre.get(F.BLOCK_PARAMETERS)
        if not isinstance(params, list) or not params or not all(isinstance(p, dict) for p in params):
            raise CaptureFileError(path, "bad file preamble: block-parameters is not a non-empty array of maps")
        self.block_parameters = [_BlockParams(p, i, path) for i, p in enumerate(params)]
        self.block_count = _array_length(self.window, path, "block array")
        self.blocks_read = 0

    def blocks(self):
        """Yield each block as the decoded CBOR map, in file order."""
        path = self.path
        while True:
            if self.block_count is None:
                nxt = self.window.peek()
                if nxt is None:
                    raise CaptureFileError(
                        path, f"truncated: the block array has no closing break ({self.blocks_read} blocks read)"
                    )
                if nxt == _BREAK:
                    self.window.read(1)
                    break
            elif self.blocks_read == self.block_count:
                break
            block = self._decode(f"block {self.blocks_read}")
            if not isinstance(block, dict):
                raise CaptureFileError(path, f"block {self.blocks_read} is not a map")
            self.blocks_read += 1
            yield block
        if self.outer_indefinite and self.window.read(1) != b"\xff":
            raise CaptureFileError(path, "truncated: the file array has no closing break")
        if self.window.peek() is not None:
            at = self.window.tell()
            raise CaptureFileError(path, f"unexpected bytes after the end of the C-DNS file at offset {at}")

    def transactions(self, sections=False):
        """Yield, block by block, lists of (query tuple, response tuple, sections) for every Q/R item and
        malformed message. sections is None unless asked for: then the data that rebuilds the messages."""
        for block in self.blocks():
            n = self.blocks_read - 1
            try:
                yield _Block(block, self.block_parameters).items(sections)
            except _BadIndex as exc:
                raise CaptureFileError(self.path, f"block {n}: {exc}") from None
            except (TypeError, ValueError, AttributeError, KeyError, IndexError, struct.error) as exc:
                problem = f"block {n}: unexpected content ({type(exc).__name__}: {exc})"
                raise CaptureFileError(self.path, problem) from None


class _BlockParams:
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


class _Block:
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
                raise _BadIndex(f"a Q/R item is a {type(item).__name__}, not a map")
            out.append(self._qr(item, want_sections))
        for mm in self.malformed:
            if type(mm) is not dict:
                raise _BadIndex(f"a malformed-message item is a {type(mm).__name__}, not a map")
            out.append(self._malformed(mm, want_sections))
        return out

    def _qr(self, item, want_sections):
        sig = _at(self.sigs, item[F.QR_SIGNATURE_INDEX], "qr-sig") if F.QR_SIGNATURE_INDEX in item else {}
        sflags = sig.get(F.QR_SIG_FLAGS)
        if sflags is None:
            sflags = _synthesise_sig_flags(item, sig)
        has_q, has_r = sflags & F.QR_HAS_QUERY, sflags & F.QR_HAS_RESPONSE
        tflags = sig.get(F.QR_TRANSPORT_FLAGS, 0)
        ipv6 = bool(tflags & F.TRANSPORT_IPV6)
        transport = (tflags & F.TRANSPORT_MASK) >> F.TRANSPORT_SHIFT
        ipv, proto, code = (6 if ipv6 else 4), _IP_PROTO.get(transport), _TRANSPORT_CODE.get(transport)
        client = _pad(_at(self.addresses, item[F.CLIENT_ADDRESS_INDEX], "ip-address"), ipv6) \
            if F.CLIENT_ADDRESS_INDEX in item else None
        server = _pad(_at(self.addresses, sig[F.SERVER_ADDRESS_INDEX], "ip-address"), ipv6) \
            if F.SERVER_ADDRESS_INDEX in sig else None
        cport, sport = item.get(F.CLIENT_PORT), sig.get(F.SERVER_PORT)
        mid = item.get(F.TRANSACTION_ID)
        dns_flags = sig.get(F.QR_DNS_FLAGS)
        opcode = sig.get(F.QUERY_OPCODE)
        qname_wire = qname = labels = qtype = qclass = None
        if F.QUERY_NAME_INDEX in item:
            qname_wire, qname, labels = self.name(item[F.QUERY_NAME_INDEX])
        if F.QUERY_CLASSTYPE_INDEX in sig:
            qtype, qclass = self.classtype(sig[F.QUERY_CLASSTYPE_INDEX])
        first_ticks = self.base_ticks + item.get(F.TIME_OFFSET, 0)
        common = dict(ipv=ipv, proto=proto, transport=code, scope=proto, id=mid, qname=qname, qtype=qtype,
                      qclass=qclass, labels=labels)
        q = r = None
        qsec = rsec = qopt = None
        if has_q:
            qrcode = sig.get(F.QUERY_RCODE)
            qedns = None
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
                ts_ns=self.ns(first_ticks), src=client, sport=cport, dst=server, dport=sport,
                ttl=item.get(F.CLIENT_HOPLIMIT),
                dns_len=item.get(F.QUERY_SIZE), qdcount=sig.get(F.QUERY_QDCOUNT), ancount=sig.get(F.QUERY_ANCOUNT),
                nscount=sig.get(F.QUERY_NSCOUNT), arcount=sig.get(F.QUERY_ARCOUNT), malformed=False, edns=qedns,
                flags=None if dns_flags is None and opcode is None and qrcode is None
                else _header_flags(dns_flags or 0, opcode, qrcode, False),
                **common,
            )
            if want_sections:
                qsec = self.sections(item.get(F.QUERY_EXTENDED, {}), False)
        if has_r:
            rrcode = sig.get(F.RESPONSE_RCODE)
            rsec = self.sections(item.get(F.RESPONSE_EXTENDED, {}), True)
            questions, answers, authority, additional = rsec
            counts = [None if s is None else len(s) for s in rsec]
            if counts[0] is not None:
                counts[0] += 0 if sflags & F.QR_RESPONSE_HAS_NO_QUESTION else 1
            ext_rcode = (rrcode or 0) >> 4
            redns = None
            if sflags & F.QR_RESPONSE_HAS_OPT:
                opt = _opt_rr(additional)
                if opt is None:  # the OPT was not recorded: only the extended RCODE is known
                    redns = (None, None, None, ext_rcode) + (None,) * (len(EDNS_FIELDS) - 4)
                else:
                    redns = _edns(opt, ext_rcode)
            delay = item.get(F.RESPONSE_DELAY, 0) if has_q else 0
            r = _message(
                ts_ns=self.ns(first_ticks + delay), src=server, sport=sport, dst=client, dport=cport,
                dns_len=item.get(F.RESPONSE_SIZE), qdcount=counts[0] if has_q else sig.get(F.QUERY_QDCOUNT),
                ancount=counts[1], nscount=counts[2], arcount=counts[3], malformed=False, edns=redns,
                flags=None if dns_flags is None and opcode is None and rrcode is None
                else _header_flags(dns_flags or 0, opcode, rrcode, True),
                **common,
            )
            if not want_sections:
                rsec = None
        extra = None
        if want_sections:
            first_q = None if qname_wire is None or qtype is None else (qname_wire, qtype, qclass)
            extra = _Sections(sflags, qsec, rsec, first_q, qopt, dns_flags or 0, sig, tflags)
        return q, r, extra

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
        extra = _Sections(None, None, None, None, None, 0, {}, tflags, payload) if want_sections else None
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


class _Sections:
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


def iter_tables(path):
    """Yield the records of a C-DNS file as Arrow tables (one per block), with Parquet's column names."""
    import pyarrow as pa

    from export.parquet.records import RecordBuilder

    builder = RecordBuilder()
    with CdnsFile(path) as f:
        for items in f.transactions():
            if items:
                try:
                    table = builder.build([(q, r, 1) for q, r, _ in items])
                except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                    problem = f"block {f.blocks_read - 1}: a field has a value of the wrong type or size ({exc})"
                    raise CaptureFileError(path, problem) from None
                yield table.drop_columns(list(CDNS_ABSENT_COLUMNS))


def read_records(path):
    """Yield the records of a C-DNS file as dicts (timestamps as integer nanoseconds)."""
    import pyarrow as pa

    for table in iter_tables(path):
        for i, field in enumerate(table.schema):
            if pa.types.is_timestamp(field.type):
                ns = table.column(i).cast(pa.timestamp("ns", tz=field.type.tz))
                table = table.set_column(i, field.name, ns.cast(pa.int64()))
        yield from table.to_pylist()


def read_table(path, limit=0):
    """The records of a C-DNS file as one Arrow table (its first `limit` rows when limit > 0, reading no
    further blocks than needed), and the CaptureFileError that stopped the reading early, or None."""
    import pyarrow as pa

    from export.parquet.schema import SCHEMA

    tables, error, rows = [], None, 0
    try:
        for table in iter_tables(path):
            tables.append(table)
            rows += len(table)
            if limit and rows >= limit:
                break
    except CaptureFileError as exc:
        error = exc
    table = pa.concat_tables(tables) if tables else SCHEMA.empty_table().drop_columns(list(CDNS_ABSENT_COLUMNS))
    return (table.slice(0, limit) if limit else table), error
