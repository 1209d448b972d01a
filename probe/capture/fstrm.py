"""Frame Streams (fstrm) codec: data frames and control frames out of a byte stream, control frames in.

The format, as libfstrm's control.h documents it: a frame is a 32-bit big-endian length then that many
bytes. A length of 0 escapes a control frame: a 32-bit length, a 32-bit control type, then fields (a 32-bit
field type, a 32-bit length, the bytes); the only field type is CONTENT_TYPE. No maintained Python package
fits (PyPI's fstrm buffers quadratically, has no limits and no handshake), and the format is this small.
The handshake over a connection is in fstrm_session.
"""

import struct

from probe.native import load

ESCAPE = b"\0\0\0\0"
CONTROL_LENGTH_MAX = 512  # libfstrm: the longest control frame payload
CONTENT_TYPE_LENGTH_MAX = 256  # libfstrm: the longest CONTENT_TYPE field
DATA_FRAME_MAX = 1 << 20  # longer data frames are refused (a DNS message over TCP is at most 64 KiB, a dnstap
# message carries two of them)
FIELD_CONTENT_TYPE = 1

# Control frame types (libfstrm fstrm_control_type).
ACCEPT = 1
START = 2
STOP = 3
READY = 4
FINISH = 5
CONTROL_NAMES = {ACCEPT: "ACCEPT", START: "START", STOP: "STOP", READY: "READY", FINISH: "FINISH"}

_U32 = struct.Struct("!I")
_U32x2 = struct.Struct("!II")


class FrameError(ValueError):
    """The byte stream breaks the Frame Streams format or its handshake: the stream cannot go on."""


def control_name(ctype):
    return CONTROL_NAMES.get(ctype, f"control type {ctype}")


def encode_control(ctype, content_types=()):
    """A whole control frame: the escape, its length, its type, one CONTENT_TYPE field per content type."""
    body = [_U32.pack(ctype)]
    for ct in content_types:
        body.append(_U32x2.pack(FIELD_CONTENT_TYPE, len(ct)))
        body.append(ct)
    payload = b"".join(body)
    return ESCAPE + _U32.pack(len(payload)) + payload


def decode_control(payload):
    """(control type, [content types]) of a control frame's payload; FrameError says what is wrong. A type
    outside the five is returned as it is: the session ignores those once data flows (libfstrm's rule)."""
    if len(payload) < 4:
        raise FrameError(f"control frame of {len(payload)} bytes, shorter than its type")
    (ctype,) = _U32.unpack_from(payload, 0)
    name = control_name(ctype)
    types, pos, end = [], 4, len(payload)
    while pos < end:
        if end - pos < 8:
            raise FrameError(f"{name}: {end - pos} trailing bytes, shorter than a field header")
        ftype, flen = _U32x2.unpack_from(payload, pos)
        pos += 8
        if flen > end - pos:
            raise FrameError(f"{name}: a field of {flen} bytes overruns the frame")
        if ftype != FIELD_CONTENT_TYPE:
            raise FrameError(f"{name}: unknown control field type {ftype}")
        if flen > CONTENT_TYPE_LENGTH_MAX:
            raise FrameError(f"{name}: a content type of {flen} bytes (at most {CONTENT_TYPE_LENGTH_MAX})")
        types.append(bytes(payload[pos : pos + flen]))
        pos += flen
    if ctype in (STOP, FINISH) and types:
        raise FrameError(f"{name} with a content type")
    if ctype == START and len(types) > 1:
        raise FrameError(f"START with {len(types)} content types")
    return ctype, types


def data_frames_python(buf, pos, limit, max_data):
    """(end, count): the whole data frames from pos on, at most `limit`, up to an escape (a control frame), a frame
    cut short or one longer than max_data. The reference of probe.capture._pcaprecords.data_frames, and the fallback
    where that is not built."""
    unpack, end, count = _U32.unpack_from, len(buf), 0
    while count < limit and end - pos >= 4:
        (n,) = unpack(buf, pos)
        if n == 0 or n > max_data or end - pos - 4 < n:
            break
        pos += 4 + n
        count += 1
    return pos, count


_pcaprecords = load("probe.capture._pcaprecords")
data_frames = data_frames_python if _pcaprecords is None else _pcaprecords.data_frames


class FrameReader:
    """Frames of a byte stream fed in pieces as they arrive (the pieces may split frames anywhere).

    The buffer is bytes with a read offset. Data frames are not cut out of it: each run of them becomes a span of
    the buffer (probe.model.DataFrames), found by data_frames (in C when built), so a frame costs no Python work
    here. A piece fed is not joined to the unread rest (a frame cut short by the piece before, usually): only
    that frame is completed, from the piece's first bytes, into a buffer of its own, and the piece is read where
    it arrived after it (`next`), so that a file's bytes are not copied once more (a 256 KiB piece each time).
    """

    def __init__(self, max_data_frame=DATA_FRAME_MAX):
        self.max_data_frame = max_data_frame
        self.buf = b""
        self.pos = 0
        self.next = None  # the piece to read once buf is read to its end, from next_pos on
        self.next_pos = 0
        self.bytes_in = 0

    def feed(self, data):
        self.bytes_in += len(data)
        rest = len(self.buf) - self.pos
        if not rest and self.next is None:
            self.buf, self.pos = bytes(data), 0
            return
        cut = self._cut_frame_rest(data) if self.next is None else None
        if cut is None:  # (a piece fed before this one is read to its end, or the cut frame's end is not in data)
            self.buf = b"".join((self.buf[self.pos :], b"" if self.next is None else self.next[self.next_pos :], data))
            self.pos, self.next = 0, None
            return
        self.buf, self.pos = self.buf[self.pos :] + data[:cut], 0
        self.next, self.next_pos = bytes(data), cut

    def _cut_frame_rest(self, data):
        """How many bytes of data complete the frame the unread rest of buf begins, when that rest is less than a
        whole frame and data holds the frame's end; None otherwise."""
        rest = len(self.buf) - self.pos
        head = self.buf[self.pos : self.pos + 8]
        if len(head) < 8:
            head += data[: 8 - len(head)]
        if len(head) < 4:
            return None
        (n,) = _U32.unpack_from(head, 0)
        if n:
            whole = 4 + n if n <= self.max_data_frame else None
        else:
            clen = _U32.unpack_from(head, 4)[0] if len(head) == 8 else CONTROL_LENGTH_MAX + 1
            whole = 8 + clen if clen <= CONTROL_LENGTH_MAX else None
        if whole is None or whole <= rest or whole - rest > len(data):
            return None
        return whole - rest

    def pending(self):
        """Bytes received but not yet part of a whole frame (at the end of the stream: a frame cut short)."""
        return len(self.buf) - self.pos + (0 if self.next is None else len(self.next) - self.next_pos)

    def take(self, out, limit, data_allowed=True):
        """Add whole data frames to out (a probe.model.DataFrames), at most `limit` of them, up to the next
        control frame, which is returned decoded as (type, [content types]); None when the buffer holds no
        further whole frame or the limit was reached. FrameError for an impossible length, a malformed control
        frame, or a data frame when data_allowed is false (before the stream has started)."""
        while True:
            before = len(out)
            control = self._take(out, limit, data_allowed)
            if control is not None or self.next is None or self.pos < len(self.buf):
                return control
            self.buf, self.pos, self.next = self.next, self.next_pos, None  # the cut frame read: on to its piece
            limit -= len(out) - before
            if limit <= 0:
                return None

    def _take(self, out, limit, data_allowed):
        """take() in buf alone."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        max_data = self.max_data_frame
        try:
            while end - pos >= 4 and limit > 0:
                stop, count = data_frames(buf, pos, limit, max_data)
                if count:
                    if not data_allowed:
                        raise FrameError("a data frame before START")
                    out.add(buf, pos, stop, count)
                    pos = stop
                    limit -= count
                    continue
                (n,) = _U32.unpack_from(buf, pos)  # what stopped the run: a control frame, or a data frame
                if n:
                    if not data_allowed:
                        raise FrameError("a data frame before START")
                    if n > max_data:
                        raise FrameError(f"a data frame of {n} bytes (at most {max_data})")
                    break  # cut short: the rest is to come
                if end - pos < 8:
                    break
                (clen,) = _U32.unpack_from(buf, pos + 4)
                if clen > CONTROL_LENGTH_MAX:
                    raise FrameError(f"a control frame of {clen} bytes (at most {CONTROL_LENGTH_MAX})")
                if end - pos - 8 < clen:
                    break
                control = decode_control(buf[pos + 8 : pos + 8 + clen])
                pos += 8 + clen
                return control
            return None
        finally:
            self.pos = pos
