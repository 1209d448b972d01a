"""C-DNS (RFC 8618) reader: the transactions of a file as dnsprobe's rows, and its DNS messages as a pcap.

A file is `["C-DNS", preamble, [block, ...]]`. The outer array header, the file type id and the preamble
are read first; the block array (definite, or indefinite and closed by a break byte as streaming
writers leave it) is then decoded **one block at a time** with cbor2, so memory is bounded by a block
whatever the file size. Plain, gzip, xz and zstd files are recognised by their content.

Format 1.0 rules applied: table indexes are 0-based; a table or a map key that is absent is simply
not there (an absent table is empty, an absent item field is unknown: null in the row); negative
(implementation-specific) map keys are ignored; an item's time is the block's earliest time plus its
time offset in ticks (ticks per second from the block's parameters); the response time is the query
time plus the signed response delay. Storage hints tell which fields the writer records: a section
whose hint bit is set and whose index is absent was empty (count 0); with the bit cleared it is
unknown (null).

Rows: each Q/R item becomes a query tuple and/or a response tuple in the layout of
probe.model.MESSAGE_FIELDS, and export.parquet.rows.RowBuilder turns them into the same columns
as the Parquet output, with the same semantics (client = src, server = dst, query columns null in a
response-only row, ...). Columns C-DNS does not carry (frame lengths, UDP checksum, VLAN, TCP
handshake RTT, zone-transfer message count) are left out (see CDNS_ABSENT_COLUMNS). Malformed
messages (the block's malformed-messages list) become rows with malformed = true, their header and
question read from the recorded payload.

Errors: every problem is a CaptureFileError naming the file and the problem (bad magic, wrong major
version, truncation, an index out of range, ...); the blocks read before it have been yielded.
"""

import io
import struct

import cbor2

from export.cdns import format as F
from export.cdns.blockdecode import BadIndex, BlockParams, DecodedBlock
from probe.compressed import open_stream, read_error
from probe.errors import CaptureFileError

# Parquet columns that C-DNS does not record; the C-DNS records leave them out.
CDNS_ABSENT_COLUMNS = ("len", "udp_sum", "res_len", "vlan", "tcp_hs_rtt", "response_messages")

_CHUNK = 1 << 16
_BREAK = 0xFF


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
        except Exception as exc:  # (each decompressor raises its own error types)
            raise read_error(self.path, exc) from None
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


def preamble_meta(preamble):
    """What a file preamble says of the file, with the keys of export.filemeta.file_meta: from RFC 8618's fields
    (the first block parameters'), and dnsprobe's own collection parameter when dnsprobe wrote the file."""
    meta = {"schema_version": f"C-DNS {preamble.get(F.MAJOR_FORMAT_VERSION)}.{preamble.get(F.MINOR_FORMAT_VERSION)}"}
    params = (preamble.get(F.BLOCK_PARAMETERS) or [{}])[0]
    storage = params.get(F.STORAGE_PARAMETERS) or {}
    collection = params.get(F.COLLECTION_PARAMETERS) or {}
    generator = collection.get(F.GENERATOR_ID)
    if isinstance(generator, str):
        meta["generator"] = generator
        if generator.startswith("dnsprobe "):
            meta["version"] = generator[len("dnsprobe "):]
    anonymised = bool((storage.get(F.STORAGE_FLAGS) or 0) & F.STORAGE_FLAG_ANONYMIZED_DATA)
    method = storage.get(F.ANONYMIZATION_METHOD)
    meta["client_privacy"] = method if method else ("anonymised (no method given)" if anonymised else
                                                    "none: client addresses as captured")
    # The flag also marks addresses only cut to a prefix: dnsprobe's method then names nothing but the cuts.
    only_cut = bool(method) and all(p.startswith("client IPv") for p in str(method).split("; "))
    meta["client_anonymised"] = "true" if anonymised and not only_cut else "false"
    meta["client_ipv4_prefix"] = str(storage.get(F.CLIENT_ADDRESS_PREFIX_IPV4, 32))
    meta["client_ipv6_prefix"] = str(storage.get(F.CLIENT_ADDRESS_PREFIX_IPV6, 128))
    if F.HOST_ID in collection:
        meta["server"] = collection[F.HOST_ID]
    own = collection.get(F.DNSPROBE_ORIGIN) if (generator or "").startswith("dnsprobe ") else None
    if isinstance(own, dict):
        meta.update({k: v for k, v in own.items() if isinstance(k, str) and isinstance(v, str)})
    return meta


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
        self.block_parameters = [BlockParams(p, i, path) for i, p in enumerate(params)]
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
                yield DecodedBlock(block, self.block_parameters).items(sections)
            except BadIndex as exc:
                raise CaptureFileError(self.path, f"block {n}: {exc}") from None
            except (TypeError, ValueError, AttributeError, KeyError, IndexError, struct.error) as exc:
                problem = f"block {n}: unexpected content ({type(exc).__name__}: {exc})"
                raise CaptureFileError(self.path, problem) from None


def iter_tables(path):
    """Yield the rows of a C-DNS file as Arrow tables (one per block), with Parquet's column names."""
    import pyarrow as pa

    from export.parquet.rows import RowBuilder

    builder = RowBuilder()
    with CdnsFile(path) as f:
        for items in f.transactions():
            if items:
                try:
                    table = builder.build([(q, r, 1) for q, r, _ in items])
                except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                    problem = f"block {f.blocks_read - 1}: a field has a value of the wrong type or size ({exc})"
                    raise CaptureFileError(path, problem) from None
                yield table.drop_columns(list(CDNS_ABSENT_COLUMNS))


def read_rows(path):
    """Yield the rows of a C-DNS file as dicts (timestamps as integer nanoseconds)."""
    import pyarrow as pa

    for table in iter_tables(path):
        for i, field in enumerate(table.schema):
            if pa.types.is_timestamp(field.type):
                ns = table.column(i).cast(pa.timestamp("ns", tz=field.type.tz))
                table = table.set_column(i, field.name, ns.cast(pa.int64()))
        yield from table.to_pylist()


def read_table(path, limit=0):
    """The rows of a C-DNS file as one Arrow table (its first `limit` rows when limit > 0, reading no
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
