"""Input files recognised by their content, whatever their names: pcap and pcapng (pcapfile), dnstap Frame
Streams (dnstap_file), each plain or compressed with gzip, xz or zstd (probe.compressed)."""

import os

from probe.capture.pcapfile import MAGICS as PCAP_MAGICS
from probe.capture.pcapfile import PcapFileSource
from probe.compressed import open_stream
from probe.errors import CaptureFileError

HEAD = 12  # bytes that tell the formats apart


def is_dnstap(head):
    """A Frame Streams file starts with a control frame (the escape, a length) whose type is START."""
    return len(head) >= 12 and head[:4] == b"\0\0\0\0" and head[8:12] == b"\0\0\0\2"


def _head(stream, path):
    chunks, n = [], 0
    try:
        while n < HEAD:
            chunk = stream.read(HEAD - n)
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
    except Exception as exc:  # gzip, lzma and zstandard raise their own error types
        raise CaptureFileError(path, f"decompression failed: {exc}") from None
    return b"".join(chunks)


def open_file_source(path, batch_size=4096, on_progress=None, raw=None, share=None):
    """The source for a capture file: PcapFileSource or DnstapFileSource; CaptureFileError when it is neither.
    raw: the file already open (probe.compressed.open_stream), path its name. share: (k, n), a read worker's
    (probe.capture.pcapfile.read_capture)."""
    stream, raw = open_stream(path, raw)
    try:
        head = _head(stream, path)
        if is_dnstap(head):
            from probe.capture.dnstap_file import DnstapFileSource  # (a pcap's read does without Frame Streams)

            return DnstapFileSource(path, stream, raw, head, batch_size, on_progress)
        if head[:4] in PCAP_MAGICS:
            return PcapFileSource(path, batch_size, on_progress, opened=(stream, raw, head), share=share)
        if not head:
            raise CaptureFileError(path, "empty file, not a pcap, pcapng or dnstap file")
        raise CaptureFileError(path, f"not a pcap, pcapng or dnstap file (first bytes {head[:8].hex()})")
    except BaseException:
        stream.close()
        raw.close()
        raise


def input_kind(path):
    """The source kind of an input (export.filemeta.SOURCE_KINDS), from its first bytes: "pcap file" (pcap or
    pcapng), "dnstap file"; "pipe" for what is not a regular file (its bytes are read once, by the run); None when
    it cannot be read or is neither (the run reports it)."""
    if path == "-" or not os.path.isfile(path):
        return "pipe"
    try:
        stream, raw = open_stream(path)
    except (OSError, CaptureFileError):
        return None
    try:
        head = _head(stream, path)
    except CaptureFileError:
        return None
    finally:
        stream.close()
        raw.close()
    if is_dnstap(head):
        return "dnstap file"
    return "pcap file" if head[:4] in PCAP_MAGICS else None
