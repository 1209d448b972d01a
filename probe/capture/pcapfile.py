"""Capture-file source: classic pcap and pcapng, plain or gzip/xz/zstd compressed.

Yields FrameBatch objects. The readers are written against the file formats directly (struct over
large buffered reads) rather than dpkt's pcap readers because those return timestamps as floats,
which loses the nanoseconds of a capture; timestamps here stay exact integers.
"""

import queue
import struct
import threading
import time

from probe.compressed import open_stream, read_error
from probe.errors import CaptureFileError
from probe.model import INT32_MAX, FrameBatch
from probe.native import load, say_not_built

CHUNK = 1 << 20
# From a pipe, a batch with frames is handed on when the bytes that would add to it have not come this long (wall
# time) after the last batch was: a paused or slow input (tcpdump -w -) is decoded as it arrives. It moves batch
# boundaries only, never a timestamp or a record.
PIPE_BATCH_WAIT_S = 0.25

_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000),  # little-endian, microseconds
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),  # little-endian, nanoseconds
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"
MAGICS = (*_PCAP_MAGICS, _PCAPNG_SHB)  # the first 4 bytes of the files this module reads


class _Arrivals:
    """A pipe read by a thread of its own, in chunks of what has arrived: the reader can wait for more with a time
    limit (a batch is then handed on when the pipe pauses), and on SIGINT or SIGTERM (a KeyboardInterrupt while
    waiting) take what has arrived and end there."""

    def __init__(self, stream):
        self.stream = stream
        self.chunks = queue.Queue(maxsize=8)  # chunks of up to CHUNK bytes, then b"" (the end) or the exception
        self.interrupted = False
        self.thread = threading.Thread(target=self._read, name="pipe reader", daemon=True)
        self.thread.start()

    def _read(self):
        read = self.stream.read1  # what has arrived, up to CHUNK bytes (every stream open_stream gives has it)
        try:
            while chunk := read(CHUNK):
                self.chunks.put(chunk)
            self.chunks.put(b"")
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which reports it as reading from a file would
            self.chunks.put(exc)

    def next(self, wait):
        """The next chunk, b"" at the end, or None when none came within `wait` seconds (None: as long as it takes)."""
        if self.interrupted:
            try:
                chunk = self.chunks.get_nowait()
            except queue.Empty:
                return b""
        else:
            try:
                chunk = self.chunks.get(timeout=wait)
            except queue.Empty:
                return None
            except KeyboardInterrupt:  # what arrived before it is still read; then the input ends here
                self.interrupted = True
                return self.next(0)
        if isinstance(chunk, Exception):
            raise chunk
        if not chunk:
            self.chunks.put(b"")  # (an end stays an end)
        return chunk


class _Buffered:
    """Reads a stream in large chunks; hands out views for struct parsing without per-record reads."""

    __slots__ = ("stream", "buf", "pos", "consumed", "path", "batch", "arrivals", "handed")

    def __init__(self, stream, path, pipe=False):
        self.stream = stream
        self.buf = b""
        self.pos = 0
        self.consumed = 0  # bytes of the file before buf[0]
        self.path = path
        self.batch = None  # the batch a format reader is filling: handed out when an error ends the file
        self.arrivals = _Arrivals(stream) if pipe else None
        self.handed = time.monotonic()  # when the last batch was handed on (PIPE_BATCH_WAIT_S)

    def fill(self, need, wait=False):
        """Make at least `need` bytes available from pos; False at a clean end of file. wait: True when a batch with
        frames waits for these bytes: from a pipe, then False too when they have not come PIPE_BATCH_WAIT_S after the
        last batch was handed on (the reader hands this one on first, and asks again)."""
        avail = len(self.buf) - self.pos
        if avail >= need:
            return True
        # The bytes left in the buffer (a record the chunk cut) are completed by reading only what they lack, and
        # the next chunk is then used as read: joining them to a whole chunk would copy it.
        chunks = [self.buf[self.pos :]] if avail else []
        limit = self.handed + PIPE_BATCH_WAIT_S if wait else None
        try:
            while avail < need:
                if self.arrivals is None:
                    chunk = self.stream.read(need - avail if chunks else max(CHUNK, need - avail))
                else:
                    chunk = self.arrivals.next(None if limit is None else max(0.0, limit - time.monotonic()))
                    if chunk is None:
                        break
                if not chunk:
                    break
                chunks.append(chunk)
                avail += len(chunk)
        except Exception as exc:  # (each decompressor raises its own error types)
            raise read_error(self.path, exc) from None
        finally:
            self.consumed += self.pos
            self.buf = b"".join(chunks)  # one chunk: that chunk itself, not a copy
            self.pos = 0
        return avail >= need

    def paused(self, need):
        """From a pipe: True when the `need` bytes a batch with frames waits for have not come PIPE_BATCH_WAIT_S after
        the last batch was handed on (the reader hands this one on, and asks again). Never for a file. (A length a
        corrupt block announces is bounded here, and reported by the reading that follows.)"""
        return self.arrivals is not None and not self.fill(min(need, 1 << 24), wait=True)

    def handing(self):
        """A batch is handed on now."""
        if self.arrivals is not None:
            self.handed = time.monotonic()

    def interrupted(self):
        return self.arrivals is not None and self.arrivals.interrupted

    def offset(self):
        return self.consumed + self.pos


def read_capture(path, batch_size=4096, on_progress=None, opened=None, share=None):
    """Yield FrameBatch objects from a pcap or pcapng file (optionally compressed).

    Raises CaptureFileError naming the file and the problem; batches yielded before the error
    are complete and valid, so callers can still export what was decoded. on_progress, if given,
    is called after each batch with the number of bytes of the (compressed) file consumed. The file
    may be a pipe (/dev/stdin, a FIFO, a shell's <(...)). opened: (decompressed stream, raw file, the
    bytes already read from the stream) when the caller opened the file to see what it is (probe.capture.files).
    share: (k, n), this is read worker k of n: a classic pcap file's batches then hold only its frames, where the C
    splitter is built (FrameBatch.share; the decoder selects the others' itself).
    """
    stream, raw, head = opened if opened is not None else (*open_stream(path), b"")
    reader = None
    try:
        reader = _Buffered(stream, path, pipe=not raw.seekable())
        reader.buf = head
        if not reader.fill(4):
            raise CaptureFileError(path, "empty file, not a pcap or pcapng capture")
        magic = reader.buf[:4]
        if magic in _PCAP_MAGICS:
            batches = _read_pcap(reader, *_PCAP_MAGICS[magic], batch_size, share)
        elif magic == _PCAPNG_SHB:
            batches = _read_pcapng(reader, batch_size)
        else:
            raise CaptureFileError(path, f"not a pcap or pcapng file (magic bytes {magic.hex()})")
        try:
            # A pipe has no file position: report the capture bytes read instead (decompressed, if it was).
            position = raw.tell if raw.seekable() else reader.offset
            for batch in batches:
                if reader.batch is batch:
                    reader.batch = None
                reader.handing()
                yield batch
                if on_progress is not None:
                    on_progress(position())
        except CaptureFileError:
            if reader.batch is not None and reader.batch.frames_read():  # read before the problem: still written
                yield reader.batch
            if reader.interrupted():  # (a record the interrupt cut is not a damaged file)
                raise KeyboardInterrupt from None
            raise
        if reader.interrupted():  # everything that arrived before SIGINT/SIGTERM was handed on: now say it
            raise KeyboardInterrupt
    finally:
        # A pipe's reading thread still waiting for input holds the stream: closing it would wait as long. The
        # process is ending then (interrupted), and the thread with it.
        if reader is None or reader.arrivals is None or not reader.arrivals.thread.is_alive():
            stream.close()
            raw.close()


class PcapFileSource:
    """A capture file as a Source (probe.capture): read() gives its batches in order, then None."""

    def __init__(self, path, batch_size=4096, on_progress=None, opened=None, share=None):
        self.name = str(path)
        self.frames = 0
        self._batches = read_capture(path, batch_size, on_progress, opened, share)

    def read(self, max_frames=None):
        """The next batch (of the batch size given at creation), or None at the end of the file. Raises
        CaptureFileError, after the batch that holds the frames read before the problem."""
        batch = next(self._batches, None)
        if batch is not None:
            self.frames += batch.frames_read()
        return batch

    def fileno(self):
        return -1

    def counters(self):
        return {"frames": self.frames}

    def close(self):
        self._batches.close()


_MAX_CAPLEN = 0x40000  # larger captured lengths mean a corrupt record (libpcap's maximum snaplen is 256 KiB)
# Original lengths land in int32 columns (DNS Probe's len, res_len): a larger one is a corrupt record.
_MAX_WIRELEN = INT32_MAX
# Capture times are int64 nanoseconds (Arrow timestamp[ns]): a pcapng time outside them is corrupt.
_TS_MIN, _TS_MAX = -(1 << 63), (1 << 63) - 1


def _bad_lengths(caplen, wirelen):
    """Why a record header's lengths are impossible, for the error message."""
    if wirelen > _MAX_WIRELEN:
        return f"original length {wirelen} (over {_MAX_WIRELEN})"
    return f"captured length {caplen}"


def split_records(buf, pos, big_endian, ts_mult, limit, ts_list, wl_list, data_list):
    """Append up to `limit` records lying entirely in buf[pos:] to the lists; return (position after
    them, status): 0 stopped (limit reached or the next record is incomplete), 1 the record header at
    the position announces an impossible captured or original length. The reference for the C version in
    probe.capture._pcaprecords (split_packed), which the reader uses when it and probe._records were built."""
    unpack = _REC_BE if big_endian else _REC_LE
    end = len(buf)
    if not 0 <= pos <= end:
        raise ValueError("position outside the buffer")
    done = 0
    while done < limit and pos + 16 <= end:
        sec, frac, caplen, wirelen = unpack(buf, pos)
        if caplen > _MAX_CAPLEN or caplen > wirelen + _MAX_CAPLEN or wirelen > _MAX_WIRELEN:
            return pos, 1
        stop = pos + 16 + caplen
        if stop > end:
            break
        ts_list.append(sec * 1_000_000_000 + frac * ts_mult)
        wl_list.append(wirelen)
        data_list.append(buf[pos + 16 : stop])
        pos = stop
        done += 1
    return pos, 0


_REC_LE = struct.Struct("<IIII").unpack_from
_REC_BE = struct.Struct(">IIII").unpack_from
_pcaprecords = load("probe.capture._pcaprecords")
_records = load("probe._records")


def _read_pcap(r, endian, ts_mult, batch_size, share=None):
    if not r.fill(24):
        raise CaptureFileError(r.path, "truncated pcap file header")
    _, _, _, _, _, snaplen, linktype = struct.unpack_from(endian + "IHHiIII", r.buf, 0)
    linktype &= 0x0FFFFFFF  # upper bits carry FCS information in newer files
    r.pos = 24
    big = endian == ">"
    if _pcaprecords is None:
        say_not_built("probe.capture._pcaprecords")
    # Packed batches (FrameBatch.packed: the frames point into the read buffer, no object per frame) where the
    # C splitter and probe._records are built; else the three lists.
    packed = _pcaprecords is not None and _records is not None
    if not packed:
        share = None

    def new_batch():
        if not packed:
            return FrameBatch(linktype)
        return FrameBatch(linktype, packed=_records.Frames(), share=share)

    unpack = _REC_BE if big else _REC_LE
    batch = r.batch = new_batch()
    while True:
        if batch.frames_read() and r.paused(16):
            yield batch
            batch = r.batch = new_batch()
        if not r.fill(16):
            if len(r.buf) - r.pos:
                raise CaptureFileError(r.path, f"truncated record header at byte {r.offset()}")
            break
        buf = r.buf
        # Records fully present in the buffer are split in one call: no per-record read() calls. With a share, a
        # batch still ends after batch_size frames read, theirs too (FrameBatch.read), as it does for one worker: the
        # capture clock then moves by the same steps in every worker.
        while True:
            room = batch_size - batch.frames_read()
            if share is not None:
                r.pos, status, taken, ts = _pcaprecords.split_packed(
                    buf, r.pos, big, ts_mult, room, batch.packed, linktype, *share
                )
                if taken:  # (frames_read() before this call: batch_size - room)
                    batch.read = (batch_size - room + taken, ts)
            elif packed:
                r.pos, status = _pcaprecords.split_packed(buf, r.pos, big, ts_mult, room, batch.packed)
            else:
                r.pos, status = split_records(buf, r.pos, big, ts_mult, room, batch.ts_ns, batch.wirelen, batch.data)
            if status:
                caplen, wirelen = unpack(buf, r.pos)[2:]
                why = _bad_lengths(caplen, wirelen)
                raise CaptureFileError(r.path, f"corrupt record at byte {r.offset()}: {why}")
            if batch.frames_read() < batch_size:
                break
            yield batch
            batch = r.batch = new_batch()
        if r.pos + 16 <= len(buf):
            caplen = unpack(buf, r.pos)[2]
            if batch.frames_read() and r.paused(16 + caplen):
                yield batch
                batch = r.batch = new_batch()
            if not r.fill(16 + caplen):
                raise CaptureFileError(
                    r.path, f"truncated record at byte {r.offset()} ({caplen} bytes announced)"
                )
    if batch.frames_read():  # (a file of only its header, as tcpdump leaves when it captured nothing: no batch)
        yield batch


_BLOCK_SHB = 0x0A0D0D0A
_BLOCK_IDB = 1
_BLOCK_PB = 2
_BLOCK_SPB = 3
_BLOCK_EPB = 6


def _idb_resolution(body, endian):
    """Return (nanoseconds numerator, denominator, offset seconds) from IDB options, or None when an option runs
    past the end of the block."""
    num, den, offset = 1000, 1, 0  # default resolution: microseconds
    pos = 8
    while pos + 4 <= len(body):
        code, length = struct.unpack_from(endian + "HH", body, pos)
        pos += 4
        value = body[pos : pos + length]
        pos += (length + 3) & ~3
        if code == 0:
            break
        if len(value) < length:
            return None
        if code == 9 and length >= 1:  # if_tsresol
            v = value[0]
            if v & 0x80:
                num, den = 1_000_000_000, 1 << (v & 0x7F)
            elif v <= 9:
                num, den = 10 ** (9 - v), 1
            else:
                num, den = 1, 10 ** (v - 9)
        elif code == 14 and length == 8:  # if_tsoffset
            offset = struct.unpack_from(endian + "q", value)[0]
    return num, den, offset


class _PcapngSection:
    """What the blocks of a pcapng section are read with: its byte order, and the interfaces it described."""

    def __init__(self, endian="<"):
        self.endian = endian
        self.head = struct.Struct(endian + "II").unpack_from
        self.epb = struct.Struct(endian + "IIIII").unpack_from
        self.interfaces = []  # (linktype, snaplen, num, den, offset_s)


def _read_pcapng(r, batch_size):
    section = _PcapngSection()
    batch = r.batch = None
    while True:
        if batch and r.paused(12):
            yield batch
            batch = r.batch = None
        if not r.fill(12):
            if len(r.buf) - r.pos:
                raise CaptureFileError(r.path, f"truncated block header at byte {r.offset()}")
            break
        buf, pos = r.buf, r.pos
        end = len(buf)
        head, epb, interfaces = section.head, section.epb, section.interfaces
        # Inner loop over the enhanced packet blocks already in the buffer (the common case).
        while pos + 12 <= end:
            btype, blen = head(buf, pos)
            if btype != _BLOCK_EPB or pos + blen > end or blen < 32 or blen % 4:
                break
            ifid, hi, lo, caplen, wirelen = epb(buf, pos + 8)
            if ifid >= len(interfaces) or caplen > blen - 32 or wirelen > _MAX_WIRELEN:
                break  # let the general path below report it
            linktype, _, num, den, offset_s = interfaces[ifid]
            ts = (((hi << 32) | lo) * num) // den + offset_s * 1_000_000_000
            if not _TS_MIN <= ts <= _TS_MAX or batch is None or batch.linktype != linktype:
                break  # errors and the first frame of a batch: the general path
            batch.ts_ns.append(ts)
            batch.wirelen.append(wirelen)
            batch.data.append(buf[pos + 28 : pos + 28 + caplen])
            pos += blen
            if len(batch.data) >= batch_size:
                r.pos = pos
                yield batch
                batch = None
        r.pos = pos
        if not r.fill(12):
            continue
        if batch and r.paused(section.head(r.buf, r.pos)[1]):  # (a block's length, to wait for all of it)
            yield batch
            batch = r.batch = None
        section, frame = _pcapng_block(r, section)
        if frame is None:
            continue
        linktype, ts, wirelen, data = frame
        if batch is None or batch.linktype != linktype:
            if batch:
                yield batch
            batch = r.batch = FrameBatch(linktype)
        batch.ts_ns.append(ts)
        batch.wirelen.append(wirelen)
        batch.data.append(data)
        if len(batch.data) >= batch_size:
            yield batch
            batch = None
    if batch:
        yield batch


def _pcapng_block(r, section):
    """Read the next block, any type (the general path): (the section it leaves, (linktype, ts_ns, wire length,
    frame bytes) of a packet block or None)."""
    buf, pos = r.buf, r.pos
    endian = section.endian
    btype = struct.unpack_from(endian + "I", buf, pos)[0]
    if btype == _BLOCK_SHB:
        bom = buf[pos + 8 : pos + 12]
        if bom == b"\x4d\x3c\x2b\x1a":
            endian = "<"
        elif bom == b"\x1a\x2b\x3c\x4d":
            endian = ">"
        else:
            raise CaptureFileError(r.path, f"bad pcapng byte-order magic at byte {r.offset()}")
        section = _PcapngSection(endian)  # a new section starts a new interface list
    blen = struct.unpack_from(endian + "I", buf, pos + 4)[0]
    if blen < 12 or blen % 4 or blen > 0x1000000:
        raise CaptureFileError(r.path, f"corrupt pcapng block length {blen} at byte {r.offset()}")
    if not r.fill(blen):
        raise CaptureFileError(r.path, f"truncated pcapng block at byte {r.offset()}")
    buf, pos = r.buf, r.pos
    block_at = r.offset()
    body = buf[pos + 8 : pos + blen - 4]
    r.pos = pos + blen
    if btype == _BLOCK_IDB:
        if len(body) < 8:
            raise CaptureFileError(r.path, "corrupt interface description block")
        linktype, _, snaplen = struct.unpack_from(endian + "HHI", body, 0)
        resolution = _idb_resolution(body, endian)
        if resolution is None:
            raise CaptureFileError(
                r.path, f"corrupt interface description block at byte {block_at}: an option runs past its end"
            )
        section.interfaces.append((linktype, snaplen) + resolution)
        return section, None
    if btype == _BLOCK_EPB:
        if len(body) < 20:
            raise CaptureFileError(r.path, f"corrupt enhanced packet block at byte {block_at}")
        ifid, hi, lo, caplen, wirelen = struct.unpack_from(endian + "IIIII", body, 0)
    elif btype == _BLOCK_PB:
        ifid, _, hi, lo, caplen, wirelen = struct.unpack_from(endian + "HHIIII", body, 0)
    elif btype == _BLOCK_SPB:
        # A simple packet block has no timestamp; it cannot be placed in time, so it is refused.
        raise CaptureFileError(r.path, "simple packet blocks (no timestamps) are not supported")
    else:
        return section, None  # name resolution, statistics, custom blocks: nothing for us
    data = body[20 : 20 + caplen]
    if ifid >= len(section.interfaces):
        raise CaptureFileError(r.path, f"packet names interface {ifid}, which was never described")
    linktype, _, num, den, offset_s = section.interfaces[ifid]
    if len(data) < caplen:
        raise CaptureFileError(r.path, f"packet block shorter than its captured length at byte {block_at}")
    if wirelen > _MAX_WIRELEN:
        why = _bad_lengths(caplen, wirelen)
        raise CaptureFileError(r.path, f"corrupt packet block at byte {block_at}: {why}")
    ticks = (hi << 32) | lo
    ts = (ticks * num) // den + offset_s * 1_000_000_000
    if not _TS_MIN <= ts <= _TS_MAX:
        raise CaptureFileError(
            r.path, f"corrupt packet block at byte {block_at}: timestamp {ticks} ticks is outside"
            " the years 1677-2262 that nanosecond capture times can hold"
        )
    return section, (linktype, ts, wirelen, data)
