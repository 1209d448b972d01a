"""The answers column (export.answers): every resource record of a response's answer, authority and additional
sections as (section, owner name, type, class, TTL, RDATA in presentation format), like ENTRADA2's dns_rdata.

RDATA is written as a zone file writes it (RFC 1035 section 5.1 and each type's RFC), for the types in RDATA_LAYOUTS;
any other type, and RDATA that does not fit its type's layout, in RFC 3597's generic form `\\# LENGTH HEX`. Names are
absolute (trailing dot) with RFC 1035 escapes; base64 and hex are written in one piece. The OPT pseudo-record is
left out: the edns_* columns describe it. A zone transfer's row has the records of its first response message;
a message that cannot be walked to its end has the records read before the damage. The walk uses the decode stage's
name reader (probe.decode.dnswire); tests/export/test_answers.py compares every text with dnspython's.

The text is capped, as a name's pointers let a few bytes stand for a name of up to 255 bytes (about 1 KB of
text with escapes): a record's RDATA text over RECORD_TEXT_BASE + RECORD_TEXT_PER_BYTE * RDLENGTH bytes is written
in RFC 3597's form instead (at most 2 * RDLENGTH + 9), and once a message's owner names and RDATA texts would pass
MESSAGE_TEXT_BASE + MESSAGE_TEXT_PER_BYTE * its length, that record and the ones after it have an empty owner name
and data (the mark: no real owner is empty, the root being "."); both counted (answers_capped; docs/parquet.md).
A string column's text (int32 offsets) stays under 2 GiB: a batch whose messages' caps could pass it is made in
slices, the column then chunked.

The decoder keeps each response's bytes only when this column is on (export.reads_raw), so it costs nothing off.
The column is made by the C walker export/parquet/_answers.c, given the tables below; message_records and
answers_column_python are its twin, compared with it by tests/export/test_answers.py.
"""

import base64
import datetime
import socket
import struct

import pyarrow as pa

from export.parquet.schema import ANSWER, ANSWERS
from probe.decode.dnswire import Malformed, read_name, read_rr, skip_name
from probe.native import load, say_not_built

SECTIONS = ("answer", "authority", "additional")
TYPE_OPT = 41

# IANA "Resource Record (RR) TYPEs" mnemonics, for RRSIG's type covered and NSEC/NSEC3 type bitmaps.
TYPE_NAMES = {
    1: "A", 2: "NS", 3: "MD", 4: "MF", 5: "CNAME", 6: "SOA", 7: "MB", 8: "MG", 9: "MR", 10: "NULL", 11: "WKS",
    12: "PTR", 13: "HINFO", 14: "MINFO", 15: "MX", 16: "TXT", 17: "RP", 18: "AFSDB", 19: "X25", 20: "ISDN",
    21: "RT", 22: "NSAP", 23: "NSAP-PTR", 24: "SIG", 25: "KEY", 26: "PX", 27: "GPOS", 28: "AAAA", 29: "LOC",
    30: "NXT", 33: "SRV", 35: "NAPTR", 36: "KX", 37: "CERT", 38: "A6", 39: "DNAME", 41: "OPT", 42: "APL",
    43: "DS", 44: "SSHFP", 45: "IPSECKEY", 46: "RRSIG", 47: "NSEC", 48: "DNSKEY", 49: "DHCID", 50: "NSEC3",
    51: "NSEC3PARAM", 52: "TLSA", 53: "SMIMEA", 55: "HIP", 59: "CDS", 60: "CDNSKEY", 61: "OPENPGPKEY",
    62: "CSYNC", 63: "ZONEMD", 64: "SVCB", 65: "HTTPS", 99: "SPF", 104: "NID", 105: "L32", 106: "L64", 107: "LP",
    108: "EUI48", 109: "EUI64", 249: "TKEY", 250: "TSIG", 251: "IXFR", 252: "AXFR", 255: "ANY", 256: "URI",
    257: "CAA", 32768: "TA", 32769: "DLV",
}

# RDATA layouts, field by field: N name, B/H/I 1/2/4-byte number, 4/16 IPv4/IPv6 address, S character-string,
# S* character-strings to the end, T type mnemonic, E time (RRSIG), X hex to the end, B64 base64 to the end,
# SALT length-prefixed hex ('-' when empty), HASH length-prefixed base32hex, BITMAP type bitmaps to the end,
# TAG length-prefixed text (CAA), Q* the rest as one quoted string (CAA).
_DS = ("H", "B", "B", "X")
_DNSKEY = ("H", "B", "B", "B64")
_TXT = ("S*",)
RDATA_LAYOUTS = {
    1: ("4",), 2: ("N",), 5: ("N",), 6: ("N", "N", "I", "I", "I", "I", "I"), 12: ("N",), 13: ("S", "S"),
    15: ("H", "N"), 16: _TXT, 17: ("N", "N"), 18: ("H", "N"), 28: ("16",), 33: ("H", "H", "H", "N"),
    35: ("H", "H", "S", "S", "S", "N"), 36: ("H", "N"), 39: ("N",), 43: _DS, 44: ("B", "B", "X"),
    46: ("T", "B", "B", "I", "E", "E", "H", "N", "B64"), 47: ("N", "BITMAP"), 48: _DNSKEY,
    50: ("B", "B", "H", "SALT", "HASH", "BITMAP"), 51: ("B", "B", "H", "SALT"), 52: ("B", "B", "B", "X"),
    53: ("B", "B", "B", "X"), 59: _DS, 60: _DNSKEY, 99: _TXT, 257: ("B", "TAG", "Q*"), 32769: _DS,
}

# The caps (see above and docs/parquet.md for why these numbers).
RECORD_TEXT_BASE, RECORD_TEXT_PER_BYTE = 1024, 4
MESSAGE_TEXT_BASE, MESSAGE_TEXT_PER_BYTE = 1024, 8
CAPS = (RECORD_TEXT_BASE, RECORD_TEXT_PER_BYTE, MESSAGE_TEXT_BASE, MESSAGE_TEXT_PER_BYTE)
COLUMN_TEXT_MAX = 2**31 - 1  # a string column's text (int32 offsets)

_HDR_COUNTS = struct.Struct("!4xHHHH").unpack_from
_NAME_SPECIAL = b'"().;\\@$'
# Bytes written as they are in a label; the rest as \X (specials) or \DDD.
_NAME_PLAIN = bytes(b for b in range(0x21, 0x7F) if b not in _NAME_SPECIAL and b != 0x2E)
_NAME_ESC = [
    chr(b) if b in _NAME_PLAIN else (f"\\{chr(b)}" if b in _NAME_SPECIAL or b == 0x2E else f"\\{b:03d}")
    for b in range(256)
]
_TEXT_PLAIN = bytes(b for b in range(0x20, 0x7F) if b not in b'"\\')
_TEXT_ESC = [chr(b) if b in _TEXT_PLAIN else (f"\\{chr(b)}" if b in b'"\\' else f"\\{b:03d}") for b in range(256)]
_B32HEX = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", b"0123456789abcdefghijklmnopqrstuv")


_answers = load("export.parquet._answers")
_WALKER = _answers.Walker(RDATA_LAYOUTS, TYPE_NAMES, SECTIONS, CAPS) if _answers is not None else None


def type_name(rtype):
    return TYPE_NAMES.get(rtype) or f"TYPE{rtype}"


def name_text(labels):
    """A name in presentation format: absolute, RFC 1035 escapes."""
    if not labels:
        return "."
    out = []
    for label in labels:
        if label.translate(None, _NAME_PLAIN):
            out.append("".join(_NAME_ESC[b] for b in label))
        else:
            out.append(label.decode("ascii"))
    return ".".join(out) + "."


def _quoted(data):
    if data.translate(None, _TEXT_PLAIN):
        return '"' + "".join(_TEXT_ESC[b] for b in data) + '"'
    return '"' + data.decode("ascii") + '"'


def _bitmap(data):
    types = []
    pos = 0
    while pos < len(data):
        if pos + 2 > len(data):
            raise Malformed("truncated type bitmap")
        window, length = data[pos], data[pos + 1]
        bits = data[pos + 2 : pos + 2 + length]
        if not 1 <= length <= 32 or len(bits) != length:
            raise Malformed("bad type bitmap length")
        for i, byte in enumerate(bits):
            for bit in range(8):
                if byte & (0x80 >> bit):
                    types.append(type_name(window * 256 + i * 8 + bit))
        pos += 2 + length
    return " ".join(types)


def _field(item, buf, pos, end):
    """(text, next position) of one layout item at buf[pos:end]."""
    if item == "N":
        labels, nxt = read_name(buf, pos)
        return name_text(labels), nxt
    if item == "B":
        return str(buf[pos]), pos + 1
    if item == "H":
        return str((buf[pos] << 8) | buf[pos + 1]), pos + 2
    if item == "I" or item == "E":
        value = struct.unpack_from("!I", buf, pos)[0]
        if item == "E":
            t = datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
            return t.strftime("%Y%m%d%H%M%S"), pos + 4
        return str(value), pos + 4
    if item == "4":
        return socket.inet_ntop(socket.AF_INET, buf[pos : pos + 4]), pos + 4
    if item == "16":
        return socket.inet_ntop(socket.AF_INET6, buf[pos : pos + 16]), pos + 16
    if item == "T":
        return type_name((buf[pos] << 8) | buf[pos + 1]), pos + 2
    if item in ("S", "TAG", "SALT", "HASH"):
        n = buf[pos]
        data = buf[pos + 1 : pos + 1 + n]
        if len(data) != n:
            raise Malformed("string runs past the RDATA")
        if item == "S":
            text = _quoted(data)
        elif item == "TAG":
            text = data.decode("ascii")
            if not n or not text.isalnum():
                raise Malformed("bad CAA tag")
        elif item == "SALT":
            text = data.hex() if n else "-"
        else:
            text = base64.b32encode(data).translate(_B32HEX).decode("ascii").rstrip("=")
        return text, pos + 1 + n
    rest = buf[pos:end]
    if item == "S*":
        parts = []
        while pos < end:
            text, pos = _field("S", buf, pos, end)
            parts.append(text)
        return " ".join(parts), pos  # (past the end when the last string runs over it: then not this layout)
    if item == "X":
        return rest.hex(), end
    if item == "B64":
        return base64.b64encode(rest).decode("ascii"), end
    if item == "BITMAP":
        return _bitmap(rest), end
    if item == "Q*":
        return _quoted(rest), end
    raise ValueError(f"unknown RDATA layout item {item!r}")


def generic(rdata):
    """RFC 3597's form of any RDATA."""
    return f"\\# {len(rdata)} {rdata.hex()}" if rdata else "\\# 0"


def rdata_text(buf, start, end, rtype):
    """(text, capped) of the RDATA at buf[start:end] of a message in presentation format: RFC 3597 form where it
    has no layout here or does not fit it, or where its text is over the record cap (capped: True)."""
    layout = RDATA_LAYOUTS.get(rtype)
    if layout is not None:
        try:
            parts = []
            pos = start
            for item in layout:
                text, pos = _field(item, buf, pos, end)
                if pos > end:
                    raise Malformed("RDATA shorter than its type's layout")
                parts.append(text)
            if pos == end:
                text = " ".join(p for p in parts if p)  # an empty type bitmap adds nothing
                if len(text) <= RECORD_TEXT_BASE + RECORD_TEXT_PER_BYTE * (end - start):
                    return text, False
                return generic(bytes(buf[start:end])), True
        except (Malformed, IndexError, struct.error, UnicodeError, ValueError, OverflowError, OSError):
            pass
    return generic(bytes(buf[start:end])), False


def message_records(buf, out):
    """Append (section, name, type, class, ttl, data) of every RR of a DNS message to out (a list of 6 lists);
    returns (records, capped): how many, and how many of them the caps changed. Stops at the first damage, keeping
    what was read before it."""
    n = capped = 0
    room = MESSAGE_TEXT_BASE + MESSAGE_TEXT_PER_BYTE * len(buf)
    try:
        qd, an, ns, ar = _HDR_COUNTS(buf)
        off = 12
        for _ in range(qd):
            off = skip_name(buf, off) + 4
        for section, count in zip(SECTIONS, (an, ns, ar)):
            for _ in range(count):
                labels, rtype, rclass, ttl, start, off = read_rr(buf, off)
                if off > len(buf):
                    return n, capped
                if rtype == TYPE_OPT:
                    continue
                name = name_text(labels)
                data, over = rdata_text(buf, start, off, rtype) if room >= 0 else ("", True)
                if room < len(name) + len(data):
                    name = data = ""
                    room = -1
                else:
                    room -= len(name) + len(data)
                for column, value in zip(out, (section, name, rtype, rclass, ttl, data)):
                    column.append(value)
                n += 1
                capped += over or not name
    except (Malformed, IndexError, struct.error):
        pass
    return n, capped


def column_slices(raw, text_max=COLUMN_TEXT_MAX):
    """raw (a binary column of messages) in slices whose answers text cannot pass text_max bytes in any string
    column, by the message cap (a message's section names are shorter still: 10 bytes a record of 11 or more);
    one slice unless the batch is huge."""
    import pyarrow.compute as pc

    n = len(raw)
    lengths = pc.binary_length(raw).fill_null(0)
    if MESSAGE_TEXT_BASE * n + MESSAGE_TEXT_PER_BYTE * (pc.sum(lengths).as_py() or 0) <= text_max:
        return [raw]
    slices, start, used = [], 0, 0
    for i, length in enumerate(lengths.to_pylist()):
        need = MESSAGE_TEXT_BASE + MESSAGE_TEXT_PER_BYTE * length
        if used + need > text_max and i > start:
            slices.append(raw.slice(start, i - start))
            start, used = i, 0
        used += need
    return slices + [raw.slice(start)]


def _chunked(parts):
    """One array from (array, capped) parts: the array itself, or chunked for several; with the capped total."""
    arrays = [a for a, _ in parts]
    column = arrays[0] if len(arrays) == 1 else pa.chunked_array(arrays, ANSWERS)
    return column, sum(c for _, c in parts)


def answers_column(raw, text_max=COLUMN_TEXT_MAX):
    """(the answers column, records capped) from a binary column of response messages (null: no response → null):
    by the C walker (export/parquet/_answers.c) where it is built, else answers_column_python, its twin. text_max:
    the most text a slice's string column may hold (column_slices); several slices make a chunked column."""
    if _WALKER is None:
        say_not_built("export.parquet._answers")
        return answers_column_python(raw, text_max)
    if isinstance(raw, pa.ChunkedArray):
        raw = raw.combine_chunks()
    return _chunked([_walked(part) for part in column_slices(raw, text_max)])


def _walked(raw):
    n = len(raw)
    nulls, validity, offsets, *fields, records, capped = _WALKER.column(n, raw.offset, raw.buffers())
    arrays = []
    for field in ANSWER:
        if field.type == pa.string():
            buffers = [None, pa.py_buffer(fields.pop(0)), pa.py_buffer(fields.pop(0))]
        else:
            buffers = [None, pa.py_buffer(fields.pop(0))]
        arrays.append(pa.Array.from_buffers(field.type, records, buffers))
    values = pa.StructArray.from_arrays(arrays, fields=list(ANSWER))
    column = pa.Array.from_buffers(ANSWERS, n, [None if validity is None else pa.py_buffer(validity),
                                                pa.py_buffer(offsets)], nulls, children=[values])
    return column, capped


def answers_column_python(raw, text_max=COLUMN_TEXT_MAX):
    """answers_column by message_records, one message after the other."""
    if isinstance(raw, pa.ChunkedArray):
        raw = raw.combine_chunks()
    return _chunked([_listed(part) for part in column_slices(raw, text_max)])


def _listed(raw):
    columns = [[] for _ in ANSWER]
    offsets = [0]
    valid = []
    total = capped = 0
    for buf in raw.to_pylist():
        if buf is not None:
            records, over = message_records(buf, columns)
            total += records
            capped += over
        offsets.append(total)
        valid.append(buf is not None)
    values = pa.StructArray.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, ANSWER)], fields=list(ANSWER)
    )
    mask = pa.array([not v for v in valid], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, type=ANSWERS, mask=mask), capped
