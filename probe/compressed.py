"""Input files plain or compressed with gzip, xz or zstd, recognised by their magic bytes (not their name).

Shared by the capture-file source (pcap, pcapng) and the C-DNS reader.
"""

import sys
from pathlib import Path

from probe.errors import CaptureFileError

# Compression is recognised by the file's magic bytes, not its name.
_COMPRESSORS = (
    (b"\x1f\x8b", "gzip"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)


def open_stream(path, raw=None):
    """(readable stream of the decompressed bytes, the raw file object); CaptureFileError when it cannot be opened.
    raw: the input already open (a buffered binary reader, e.g. a pipe from `dnsprobe read --workers`' parent), read
    instead of opening path, which still names it."""
    path = Path(path)
    if raw is None:
        try:
            raw = open(path, "rb")
        except FileNotFoundError:
            raise CaptureFileError(path, "no such file") from None
        except IsADirectoryError:
            raise CaptureFileError(path, "is a directory, not a capture file") from None
        except PermissionError:
            raise CaptureFileError(path, "permission denied") from None
    # peek, not read and seek back: the input may be a pipe (/dev/stdin, <(xzcat day.pcap.xz), a FIFO).
    kind = compression(raw.peek(6)[:6])
    if kind is None:
        return raw, raw
    # A decompressor reads its input in blocks of 32-128 KiB and, from a pipe, would wait for a whole block: what
    # has arrived would not be decompressed until more comes. From a pipe it gets what has arrived instead.
    source = raw if raw.seekable() else _WhatArrived(raw)
    # (each decompressor's module imported here: a plain file's read does without them)
    if kind == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=source), raw
    if kind == "xz":
        import lzma

        return lzma.LZMAFile(source), raw
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(source), raw


class _WhatArrived:
    """A pipe whose read(n) gives what has arrived (up to n bytes), waiting only when nothing has: a decompressor's
    input."""

    def __init__(self, raw):
        self.raw = raw

    def read(self, n=-1):
        return self.raw.read1(n)

    def readable(self):
        return True

    def close(self):
        self.raw.close()


def read_error(path, exc):
    """The CaptureFileError of an exception that reading the decompressed stream of path raised."""
    lzma = sys.modules.get("lzma")  # (imported by an xz input only)
    if isinstance(exc, (OSError, EOFError)) or (lzma is not None and isinstance(exc, lzma.LZMAError)):
        return CaptureFileError(path, f"decompression failed: {exc}")
    return CaptureFileError(path, f"read failed: {exc}")  # (zstandard raises its own ZstdError type)


def compression(head):
    """The compression of a file that starts with the bytes `head` (its first 6 or more): gzip, xz, zstd or None."""
    for magic, kind in _COMPRESSORS:
        if head.startswith(magic):
            return kind
    return None
