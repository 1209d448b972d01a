"""dnstap file source: a Frame Streams file of dnstap messages (fstrm_capture, Knot's or kdig's file sink),
plain or compressed, read in large pieces and handed on as DnstapBatch objects.

A file is unidirectional: START (content type protobuf:dnstap.Dnstap, or none), data frames, STOP; files
joined with cat hold several such runs. Errors are CaptureFileError naming the file and the problem; the
frames read before it are handed on first. A file that ends without STOP (still being written when it was
copied) is read to its last whole frame; a file that ends inside a frame is an error, like a cut pcap.
"""

from probe.capture.fstrm import FrameError
from probe.capture.fstrm_session import HandshakeRefused, Session
from probe.compressed import read_error
from probe.errors import CaptureFileError
from probe.model import DataFrames, DnstapBatch

CHUNK = 1 << 18


class DnstapFileSource:
    """A dnstap file as a Source (probe.capture): read() gives its frames in batches, then None."""

    def __init__(self, path, stream, raw, head=b"", batch_size=4096, on_progress=None):
        """stream: the file's decompressed bytes, of which `head` was already read; raw: the file itself (the
        progress is its position)."""
        self.name = str(path)
        self.path = path
        self.stream, self.raw = stream, raw
        self.batch_size = batch_size
        self.on_progress = on_progress
        self.session = Session(file=True)
        self.session.feed(head)
        self.frames = self.frame_errors = self.truncated = 0
        self.done = False
        self.problem = None  # what ended the file early: raised once the frames before it are handed on
        self._last = None  # the batch handed on last: the decoder may have refused the file in it
        self._position = raw.tell if raw.seekable() else lambda: self.session.reader.bytes_in

    def read(self, max_frames=None):
        """The next batch, or None at the end of the file. Raises CaptureFileError, after the batch that holds
        the frames read before the problem."""
        last, self._last = self._last, None
        if last is not None and last.refused:
            self.done = True
            raise CaptureFileError(self.path, next(iter(last.refused.values())))
        frames = DataFrames()
        limit = max_frames or self.batch_size
        try:
            while not self.done:
                self.session.read(frames, limit - len(frames))
                if len(frames) >= limit:
                    break
                self._fill()
        except HandshakeRefused as exc:
            self._end(f"not a dnstap file: {exc}")
        except FrameError as exc:
            self.frame_errors += 1
            self._end(f"{exc} (at byte {self._offset()} of its Frame Streams data)")
        if self.on_progress is not None:
            self.on_progress(self._position())
        if frames:
            self.frames += len(frames)
            self._last = DnstapBatch([(self.name, frames)])
            return self._last
        if self.problem is not None:
            problem, self.problem = self.problem, None
            raise CaptureFileError(self.path, problem)
        return None

    def _fill(self):
        """Feed the next piece of the file; at its end, check how the stream ended."""
        try:
            data = self.stream.read(CHUNK)
        except Exception as exc:  # (each decompressor raises its own error types)
            raise read_error(self.path, exc) from None
        if data:
            self.session.feed(data)
            return
        problem = self.session.end_problem()
        if problem is not None and self.session.reader.pending():
            self.truncated += 1
        self._end(None if problem is None else f"truncated: {problem}")

    def _end(self, problem):
        self.done = True
        self.problem = problem

    def _offset(self):
        reader = self.session.reader
        return reader.bytes_in - reader.pending()

    def fileno(self):
        return -1

    def counters(self):
        """The counters of probe.stats this file adds to (the decoder counts the frames' contents)."""
        return {"dnstap_bytes": self.session.reader.bytes_in, "dnstap_frame_errors": self.frame_errors,
                "dnstap_truncated": self.truncated}

    def close(self):
        self.stream.close()
        self.raw.close()
