"""Frame Streams: the codec and the reader's handshake (probe.capture.fstrm, fstrm_session), on their own and
against libfstrm's own tools (fstrm_capture, fstrm_replay from Debian's fstrm-bin)."""

import os
import random
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from support.dnstap import fstrm_file

from probe.capture.fstrm import (
    ACCEPT,
    FINISH,
    READY,
    START,
    STOP,
    FrameError,
    FrameReader,
    data_frames,
    data_frames_python,
    decode_control,
    encode_control,
)
from probe.capture.fstrm_session import DNSTAP_CONTENT_TYPE, HandshakeRefused, Session
from probe.model import DataFrames

CT = DNSTAP_CONTENT_TYPE


def frame(data):
    return struct.pack("!I", len(data)) + data


def all_frames(session, data, pieces):
    """Feed data to the session in the given piece lengths (the last takes the rest); the data frames and the
    bytes it sends back."""
    out, replies, pos = DataFrames(), b"", 0
    for n in pieces + [len(data)]:
        session.feed(data[pos : pos + n])
        pos += n
        replies += session.read(out, 1 << 30)
        if pos >= len(data):
            break
    return list(out), replies


def test_control_frames_round_trip():
    for ctype, types in ((READY, [CT, b"other"]), (ACCEPT, [CT]), (START, [CT]), (START, []), (STOP, []),
                         (FINISH, [])):
        wire = encode_control(ctype, types)
        assert wire[:4] == b"\0\0\0\0" and struct.unpack_from("!I", wire, 4)[0] == len(wire) - 8
        assert decode_control(wire[8:]) == (ctype, types)
    # The bytes libfstrm writes at the start of a file (checked against fstrm_capture below).
    assert encode_control(START, [CT]) == bytes.fromhex("00000000 00000022 00000002 00000001 00000016") + CT


def test_frames_do_not_depend_on_how_the_stream_is_cut():
    rng = random.Random(20)
    data_frames = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) for _ in range(200)]
    stream = fstrm_file(data_frames)
    # an unknown control type in the middle (a later version's): ignored once data flows
    cut = len(fstrm_file(data_frames[:50], stop=False))
    stream = stream[:cut] + encode_control(9, [b"x"]) + stream[cut:]
    for pieces in ([len(stream)], [1] * len(stream), [rng.randrange(1, 40) for _ in range(2000)],
                   [rng.randrange(1, 2000) for _ in range(200)]):
        session = Session(file=True)
        got, replies = all_frames(session, stream, list(pieces))
        assert got == data_frames and replies == b""
        assert session.state == "stopped" and session.end_problem() is None


def test_a_piece_is_read_where_it_arrived():
    """A piece that completes the frame the piece before cut short is not joined to the unread rest: that frame
    alone is, and the frames after it are spans of the piece itself (no copy of a file's every byte)."""
    frames = [bytes([i]) * 100 for i in range(20)]
    stream = fstrm_file(frames)
    cut = len(stream) // 2 + 7  # inside a frame
    session, out = Session(file=True), DataFrames()
    session.feed(stream[:cut])
    session.read(out, 100)
    cut_short = session.reader.pending()
    assert 0 < cut_short < 104
    piece = stream[cut:]
    session.feed(piece)
    assert session.reader.pending() == cut_short + len(piece)
    session.read(out, 100)
    assert list(out) == frames and session.state == "stopped" and session.reader.pending() == 0
    assert out.spans[-1][0] is piece and len(out.spans[-2][0]) == 104  # the cut frame, joined alone


@pytest.mark.parametrize("payload, problem", [
    (b"\0\0\0", "shorter than its type"),
    (struct.pack("!III", STOP, 1, len(CT)) + CT, "STOP with a content type"),
    (struct.pack("!III", START, 1, 400) + b"x" * 400, "a content type of 400 bytes"),
    (struct.pack("!III", START, 1, 30) + CT, "overruns the frame"),
    (struct.pack("!III", START, 2, 0), "unknown control field type 2"),
    (struct.pack("!III", START, 1, 1) + b"a" + struct.pack("!II", 1, 1) + b"b", "START with 2 content types"),
    (struct.pack("!I", READY) + b"\0\0", "2 trailing bytes"),
])
def test_malformed_control_frames(payload, problem):
    with pytest.raises(FrameError, match=problem):
        decode_control(payload)


def test_limits():
    reader = FrameReader(max_data_frame=100)
    reader.feed(encode_control(START, [CT]) + frame(b"x" * 100) + struct.pack("!I", 101))
    out = DataFrames()
    assert reader.take(out, 10) == (START, [CT])
    with pytest.raises(FrameError, match="a data frame of 101 bytes"):
        reader.take(out, 10)
    assert list(out) == [b"x" * 100]
    reader = FrameReader()
    reader.feed(b"\0\0\0\0" + struct.pack("!I", 513))
    with pytest.raises(FrameError, match="a control frame of 513 bytes"):
        reader.take(DataFrames(), 10)
    reader = FrameReader()  # 2^31 announced: refused at once, not awaited
    reader.feed(b"\x7f\xff\xff\xff" + b"x" * 10)
    with pytest.raises(FrameError, match="2147483647 bytes"):
        reader.take(DataFrames(), 10)


def test_limit_on_frames_taken():
    reader = FrameReader()
    reader.feed(b"".join(frame(bytes([i])) for i in range(10)))
    out = DataFrames()
    assert reader.take(out, 4) is None and len(out) == 4
    assert reader.take(out, 100) is None and len(out) == 10 and reader.pending() == 0


def test_data_frames_scan_in_c_equals_python():
    """The C scan for whole data frames (probe.capture._pcaprecords.data_frames) stops where its Python reference does,
    on streams of frames, escapes, over-long and cut frames, from any offset and with any limit."""
    assert data_frames is not data_frames_python, "probe.capture._pcaprecords is not built"
    rng = random.Random(7)
    for _ in range(2000):
        parts = []
        for _ in range(rng.randrange(6)):
            kind = rng.randrange(6)
            if kind == 0:
                parts.append(encode_control(rng.choice((START, STOP)), []))
            elif kind == 1:
                parts.append(struct.pack("!I", rng.randrange(1, 1 << 32)))
            else:
                parts.append(frame(bytes(rng.randrange(1, 40))))
        buf = b"".join(parts)
        buf = buf[: rng.randrange(len(buf) + 1)] if rng.random() < 0.3 else buf
        args = (buf, rng.randrange(len(buf) + 1), rng.randrange(1, 8), rng.choice((20, 1 << 20)))
        assert data_frames(*args) == data_frames_python(*args), args


def test_bidirectional_handshake():
    session = Session()
    data = encode_control(READY, [b"protobuf:other", CT]) + encode_control(START, [CT]) + frame(b"m1") + frame(b"m2")
    got, replies = all_frames(session, data, [5, 30])
    assert got == [b"m1", b"m2"] and replies == encode_control(ACCEPT, [CT])
    session.feed(encode_control(STOP) + frame(b"after"))
    out = DataFrames()
    assert session.read(out, 10) == encode_control(FINISH)
    assert list(out) == [] and session.ended  # nothing is read after STOP


def test_unidirectional_connection_without_ready():
    session = Session()
    got, replies = all_frames(session, fstrm_file([b"a", b"b"]), [])
    assert got == [b"a", b"b"] and replies == b"" and session.ended


def test_start_without_content_type_is_taken():
    got, _ = all_frames(Session(file=True), fstrm_file([b"a"], content_type=None), [])
    assert got == [b"a"]


@pytest.mark.parametrize("data, error, problem", [
    (encode_control(READY, [b"protobuf:other"]), HandshakeRefused, "READY offers"),
    (encode_control(READY, [CT]) + encode_control(START, [b"text:plain"]), HandshakeRefused,
     "START has content type b'text:plain'"),
    (encode_control(START, [b"protobuf:other"]), HandshakeRefused, "START has content type"),
    (frame(b"data first"), FrameError, "a data frame before START"),
    (encode_control(READY, [CT]) + frame(b"x"), FrameError, "a data frame before START"),
    (encode_control(READY, [CT]) + encode_control(READY, [CT]), FrameError, "READY while waiting for START"),
    (encode_control(START, [CT]) + encode_control(READY, [CT]), FrameError, "READY after START"),
    (encode_control(STOP), FrameError, "STOP while waiting"),
    (b"GET / HTTP/1.1\r\n\r\n", FrameError, "a data frame before START"),
])
def test_handshake_errors(data, error, problem):
    with pytest.raises(error, match=problem):
        all_frames(Session(), data, [])


def test_files_may_hold_several_runs_but_no_ready():
    got, _ = all_frames(Session(file=True), fstrm_file([b"a"]) + fstrm_file([b"b", b"c"]), [7])
    assert got == [b"a", b"b", b"c"]
    with pytest.raises(FrameError, match="READY in a file"):
        all_frames(Session(file=True), encode_control(READY, [CT]), [])


def test_how_a_stream_ended():
    session = Session(file=True)
    all_frames(session, fstrm_file([b"abc"], stop=False), [])
    assert session.end_problem() is None  # no STOP: a file still being written
    session = Session()
    all_frames(session, fstrm_file([b"abc"])[:-9], [])
    assert session.end_problem() == "ended inside a frame (3 bytes of it received)"
    session = Session()
    all_frames(session, encode_control(READY, [CT]), [])
    assert "ended before START" in session.end_problem()


@pytest.mark.skipif(not (shutil.which("fstrm_capture") and shutil.which("fstrm_replay")),
                    reason="fstrm_capture/fstrm_replay missing (Debian package fstrm-bin; contrib/install-deps.sh)")
def test_libfstrm_reads_what_we_write_and_we_read_what_it_writes():
    """Our file → fstrm_replay → a Unix socket → fstrm_capture → its file → our reader: the same frames, and
    libfstrm's file starts with the bytes we write."""
    rng = random.Random(7)
    data_frames = [os.urandom(rng.randrange(1, 2000)) for _ in range(500)]
    with tempfile.TemporaryDirectory(prefix="dnsprobe-i20-") as d:
        ours, theirs, sock = Path(d, "ours.fstrm"), Path(d, "theirs.fstrm"), Path(d, "s")
        ours.write_bytes(fstrm_file(data_frames))
        cap = subprocess.Popen(["fstrm_capture", "-t", CT.decode(), "-u", str(sock), "-w", str(theirs)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 10
            while not sock.exists():
                assert time.monotonic() < deadline and cap.poll() is None, "fstrm_capture did not listen"
                time.sleep(0.02)
            replay = subprocess.run(["fstrm_replay", "-t", CT.decode(), "-r", str(ours), "-u", str(sock)],
                                    capture_output=True, text=True, timeout=30)
            assert replay.returncode == 0, replay.stderr
        finally:
            cap.send_signal(signal.SIGINT)  # closes its file with STOP
            log = cap.communicate(timeout=10)[0]
        data = theirs.read_bytes()
        assert data.startswith(encode_control(START, [CT])) and data.endswith(encode_control(STOP)), log
        got, _ = all_frames(Session(file=True), data, [4096] * (len(data) // 4096))
        assert got == data_frames
