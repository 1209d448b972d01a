"""A C-DNS file whose writer died: NAME.cdns[.gz|.xz|.zst].part made into NAME.cdns[...] holding its complete blocks.

The writer puts each block in the file as it closes, and flushes the compressor on time (export.flush_seconds),
so the file is decodable up to its last flushed block whatever happens to the writer. Recovery reads the
header and then block after block until the data ends or a block is cut short, and writes the header, those
blocks and the closing break as the finished file (compressed with the codec its name says). Blocks are copied
as bytes, never decoded into values and encoded again.
"""

import io
import os

import cbor2

from export.cdns import format as F
from export.cdns.writer import FILE_TRAILER, compressor
from probe.compressed import open_stream

READ_BYTES = 1 << 20
_CODECS = {suffix: codec for codec, suffix in F.COMPRESSION_SUFFIXES.items() if suffix}


def codec_of(path):
    """The whole-file codec a C-DNS file name says (.cdns, .cdns.gz, .cdns.xz, .cdns.zst)."""
    name = str(path)
    return next((codec for suffix, codec in _CODECS.items() if name.endswith(suffix)), "none")


class _Decompressed:
    """The decompressed bytes of a file, read on demand; a damaged or cut compressed stream ends them."""

    def __init__(self, path):
        self.stream, self.raw = open_stream(path)
        self.ended = False

    def more(self):
        if self.ended:
            return b""
        try:  # read1: one read of the compressed stream, so that an error after it loses nothing read before
            data = self.stream.read1(READ_BYTES)
        except Exception:  # noqa: BLE001 (EOFError, lzma/zlib/zstd errors: the stream was cut here)
            data = b""
        if not data:
            self.ended = True
            self.raw.close()
        return data


class _Items:
    """CBOR items read one after another from the decompressed bytes; bytes before `keep_from` are kept."""

    def __init__(self, path):
        self.src = _Decompressed(path)
        self.buf = bytearray()
        self.pos = 0  # where the next item starts in buf
        self.keep_from = 0  # buf[:keep_from] may be dropped when more is read

    def _more(self):
        data = self.src.more()
        if not data:
            return False
        del self.buf[: self.keep_from]
        self.pos -= self.keep_from
        self.keep_from = 0
        self.buf += data
        return True

    def peek(self):
        """The next byte, or None at the end of the data."""
        while self.pos >= len(self.buf):
            if not self._more():
                return None
        return self.buf[self.pos]

    def skip(self):
        self.pos += 1

    def item(self):
        """The next item decoded, and its bytes; (None, None) when the data ends inside it."""
        while True:
            fp = io.BytesIO(memoryview(self.buf)[self.pos :])
            try:
                value = cbor2.CBORDecoder(fp).decode()
            except (cbor2.CBORDecodeEOF, EOFError):
                if not self._more():
                    return None, None
                continue
            raw = bytes(self.buf[self.pos : self.pos + fp.tell()])
            self.pos += fp.tell()
            return value, raw


def complete_blocks(path):
    """(header bytes, [(block bytes, rows)], closed): the file's header and its complete blocks, in order;
    closed when the block array had its closing break. ValueError when not even the header is whole."""
    items = _Items(path)
    if items.peek() != 0x83:
        raise ValueError("not a C-DNS file (no 3-element array at its start)")
    items.skip()
    file_type, _ = items.item()
    if file_type != F.FILE_TYPE_ID:
        raise ValueError('not a C-DNS file (no "C-DNS" file type)')
    preamble, _ = items.item()
    if preamble is None or items.peek() != 0x9F:
        raise ValueError("the file ends inside its preamble")
    items.skip()
    header = bytes(items.buf[: items.pos])  # nothing was dropped yet (keep_from is 0)
    blocks = []
    while True:
        items.keep_from = items.pos
        first = items.peek()
        if first is None:
            return header, blocks, False
        if first == 0xFF:
            return header, blocks, True
        try:
            block, raw = items.item()
        except (cbor2.CBORDecodeError, ValueError, TypeError):  # damaged: what follows cannot be trusted
            return header, blocks, False
        if not isinstance(block, dict):
            return header, blocks, False
        rows = len(block.get(F.QUERY_RESPONSES, ())) + len(block.get(F.MALFORMED_MESSAGES, ()))
        blocks.append((raw, rows))


def recover_cdns(part, final):
    """Write the complete blocks of part as final (through final.recovering, renamed), then remove part; returns
    the number of rows (without a block, no file is written)."""
    try:
        header, blocks, _ = complete_blocks(part)
    except ValueError:
        header, blocks = None, []
    rows = sum(n for _, n in blocks)
    if blocks:
        codec = codec_of(final)
        comp = compressor(codec, None)
        tmp = f"{final}.recovering"
        with open(tmp, "wb") as out:
            for data in (header, *(b for b, _ in blocks), FILE_TRAILER):
                out.write(comp.compress(data))
            out.write(comp.flush())
        os.replace(tmp, final)
    os.unlink(part)
    return rows
