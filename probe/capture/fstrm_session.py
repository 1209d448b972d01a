"""The reading side of one Frame Streams stream, a producer's connection or a file: the handshake.

Bidirectional (a server connected to our socket): the producer sends READY with the content types it
offers, we ACCEPT ours, it sends START, data frames, STOP, we answer FINISH and the stream is over.
Unidirectional (a file, or a producer that skips READY): START, data frames, STOP. A file may hold several
START ... STOP runs (files joined with cat). A START without a content type is taken (libfstrm allows it:
the data frames say what they are); another content type than ours is refused. Control types beyond
the five are ignored once data flows, as libfstrm's readers do, so that later versions can add some.
"""

from probe.capture.fstrm import (
    ACCEPT,
    FINISH,
    READY,
    START,
    STOP,
    FrameError,
    FrameReader,
    control_name,
    encode_control,
)

DNSTAP_CONTENT_TYPE = b"protobuf:dnstap.Dnstap"

# States of a session.
WAITING = "waiting for READY or START"
ACCEPTED = "waiting for START after ACCEPT"
DATA = "receiving data"
STOPPED = "stopped"
KNOWN_CONTROLS = (ACCEPT, START, STOP, READY, FINISH)


class HandshakeRefused(FrameError):
    """The producer's content type is not ours (or it offers none of ours)."""


class Session:
    """Feed the bytes of one stream with feed(), take its data frames with read()."""

    def __init__(self, content_type=DNSTAP_CONTENT_TYPE, file=False):
        """file: a file (several START ... STOP runs, no READY) rather than a connection."""
        self.content_type = content_type
        self.file = file
        self.reader = FrameReader()
        self.state = WAITING
        self.bidirectional = False
        self.ended = False  # a connection's STOP was received: nothing more is read from it
        self.stops = 0

    def feed(self, data):
        self.reader.feed(data)

    def read(self, out, limit):
        """Append up to `limit` data frames to out; returns the control frames to send back (ACCEPT, FINISH)
        as bytes, b"" when none. Raises HandshakeRefused or FrameError naming the problem."""
        reply = b""
        while not self.ended and limit > 0:
            before = len(out)
            control = self.reader.take(out, limit, self.state == DATA)
            limit -= len(out) - before
            if control is None:
                break
            reply += self._control(*control)
        return reply

    def end_problem(self):
        """At the end of the stream (connection closed, end of file): what was wrong with how it ended, or None."""
        pending = self.reader.pending()
        if pending:
            return f"ended inside a frame ({pending} bytes of it received)"
        if self.state in (WAITING, ACCEPTED):
            return f"ended before START ({self.state})"
        return None

    def _check_type(self, ctype, types):
        if types and types[0] != self.content_type:
            raise HandshakeRefused(
                f"{control_name(ctype)} has content type {types[0]!r}, not {self.content_type!r}"
            )

    def _control(self, ctype, types):
        state = self.state
        if state == DATA:
            if ctype == STOP:
                self.state = STOPPED
                self.stops += 1
                if not self.file:
                    self.ended = True
                return encode_control(FINISH) if self.bidirectional else b""
            if ctype in KNOWN_CONTROLS:
                raise FrameError(f"{control_name(ctype)} after START")
            return b""  # a later version's control frame: ignored
        if ctype == START and (state != STOPPED or self.file):
            self._check_type(ctype, types)
            self.state = DATA
            return b""
        if ctype == READY and state == WAITING and not self.file:
            if types and self.content_type not in types:
                raise HandshakeRefused(f"READY offers {types!r}, not {self.content_type!r}")
            self.bidirectional = True
            self.state = ACCEPTED
            return encode_control(ACCEPT, [self.content_type])
        where = "in a file" if self.file else f"while {state}"
        raise FrameError(f"{control_name(ctype)} {where}")
