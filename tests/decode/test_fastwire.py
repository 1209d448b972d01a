"""The C walker (probe.decode._fastwire) must give exactly what the Python walker gives.

- The extension is built (a broken build must fail CI, not silently fall back to Python).
- parse_message: C == Python (values and types, and the names cache they fill) on every DNS message of
  every capture the tests use, and on many thousands of messages damaged from real ones: truncation
  at every length, byte flips, compression pointers and label types corrupted, huge counts, OPT
  options rewritten.
- The captures the decoder tests share (test_decoderec uses them): the shared ones, the sample, and traffic
  made here, among it TCP (tcp_frames: split, merged, retransmitted, reordered segments, RST, TFO, FIN,
  mid-stream starts, IPv6, VLAN tags).
- keep_raw=False (an exporter that does not read the raw message): the same messages with raw None, with every
  parser.
- decode.parser auto/fast where the extension is not built: a copy of the source tree without it.
"""

import functools
import json
import random
import shutil
import struct
import subprocess
import sys

import pytest
from support.data import ROOT, needs_shared
from support.dnsprobe import copy_env
from support.stages import dns_messages

from probe.capture.pcapfile import read_capture
from probe.config import DecodeConfig
from probe.decode import dnswire
from probe.decode.packets import PacketDecoder
from probe.decode.parsers import effective
from probe.model import M
from probe.stats import Stats

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"


def test_extension_is_built():
    # Not importorskip: a machine where the build failed must fail here (setup.py builds it optional).
    from probe.decode import _fastwire

    assert callable(_fastwire.parse_message)
    assert effective("auto") == "fast"


def c_parse():
    from probe.decode import _fastwire

    return _fastwire.parse_message


def typed(value):
    """The value with the type of every part, so that == also compares types (True != 1 here)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(typed(v) for v in value))
    return (type(value).__name__, value)


def check_same(bufs, py_names=None, c_names=None):
    """C == Python on each message (with the names caches given, else fresh ones); returns how many."""
    parse = c_parse()
    py_names = {} if py_names is None else py_names
    c_names = {} if c_names is None else c_names
    for buf in bufs:
        want = dnswire.parse_message(buf, py_names)
        got = parse(buf, c_names)
        assert typed(got) == typed(want), (buf.hex(), want, got)
    assert typed(sorted(c_names.items())) == typed(sorted(py_names.items()))
    return len(bufs)




@functools.cache
def corpus_of(path):
    """Every DNS message of a capture as `dnsprobe read` finds them (UDP, TCP, fragments)."""
    return tuple(dns_messages(path))


@needs_shared
def test_captures_found(decode_captures):
    names = {p.name for p in decode_captures}
    assert {"knot-live.raw.pcap.xz", "nsd-live.raw.pcap.xz", "udp_simple.pcap", "sample-mix.pcap.xz",
            "traffic.pcap", "edge.pcap", "tcp.pcap"} <= names
    assert len(names) == 19


@needs_shared
def test_every_message_of_every_capture(decode_captures):
    total = 0
    for path in decode_captures:
        bufs = corpus_of(path)
        assert bufs, path
        total += check_same(bufs)
    assert total > 50000


# --------------------------------------------------------------------------------------------------
# Damaged messages


def seeds(captures):
    """A few hundred real messages of different shapes: from every capture, the first of each
    (flags, qdcount, ancount, nscount, arcount, OPT or not) combination, and 16 spread over it."""
    picked = {}
    for path in captures:
        bufs = corpus_of(path)
        for i, buf in enumerate(bufs):
            t = dnswire.parse_message(buf)
            key = (path.name, t[2], t[3], min(t[4] or 0, 3), min(t[5] or 0, 2), min(t[6] or 0, 2), t[12],
                   t[11] is not None and len(t[11][-1]) > 0)
            if i % max(1, len(bufs) // 16) == 0:
                key += (i,)
            picked.setdefault(key, buf)
    return list(picked.values())


def damaged(buf, rng):
    """Messages derived from buf by one kind of damage each."""
    n = len(buf)
    out = []
    for _ in range(8 if n else 0):  # random byte flips
        b = bytearray(buf)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(n)] = rng.randrange(256)
        out.append(bytes(b))
    for _ in range(6):  # pointers anywhere, to anywhere (mostly backwards, some to themselves or beyond)
        if n > 13:
            b = bytearray(buf)
            pos = rng.randrange(12, n - 1)
            target = rng.randrange(pos + 1) if rng.random() < 0.7 else rng.randrange(0x4000)
            struct.pack_into("!H", b, pos, 0xC000 | target)
            out.append(bytes(b))
    for _ in range(3):  # reserved label types, overlong labels
        if n > 13:
            b = bytearray(buf)
            b[rng.randrange(12, n)] = rng.choice((0x40, 0x7F, 0x80, 0xBF, 63, 62, 1))
            out.append(bytes(b))
    if n >= 12:  # counts: huge, off by one, zero
        for field in range(2, 6):
            for value in (0, 0xFFFF, rng.randrange(1, 8)):
                b = bytearray(buf)
                struct.pack_into("!H", b, 2 * field, value)
                out.append(bytes(b))
    out.append(buf + bytes(rng.randrange(1, 40)))  # trailing bytes
    out.append(buf + bytes([rng.randrange(256) for _ in range(rng.randrange(1, 40))]))
    return out


def opt_messages(rng, count):
    """Queries whose OPT RDATA is random option headers and values, often inconsistent."""
    out = []
    head = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 1) + b"\x04opts\x07example\x00\x00\x01\x00\x01"
    for _ in range(count):
        rdata = b""
        for _ in range(rng.randint(0, 5)):
            code = rng.choice((3, 5, 6, 7, 8, 10, 12, 15, 65001, rng.randrange(65536)))
            value = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 2, 3, 4, 5, 8, 20))))
            if code == 8 and rng.random() < 0.7:
                family = rng.choice((1, 2, 2, 3))
                value = struct.pack("!HBB", family, rng.randrange(256), 0) + bytes(
                    rng.randrange(256) for _ in range(rng.randrange(0, 18))
                )
            olen = len(value) if rng.random() < 0.9 else rng.randrange(65536)
            rdata += struct.pack("!HH", code, olen) + value
        rdlen = len(rdata) if rng.random() < 0.9 else rng.randrange(len(rdata) + 8)
        ttl = rng.randrange(1 << 32)
        out.append(head + b"\x00" + struct.pack("!HHIH", 41, rng.randrange(65536), ttl, rdlen) + rdata)
    return out


@needs_shared
def test_damaged_messages(decode_captures):
    rng = random.Random(20240601)
    base = seeds(decode_captures)
    assert len(base) > 300
    count = 0
    for buf in base:
        count += check_same([buf[:k] for k in range(len(buf) + 1)])  # truncated at every length
        count += check_same(damaged(buf, rng))
    count += check_same(opt_messages(rng, 5000))
    count += check_same([bytes(rng.randrange(256) for _ in range(rng.randrange(40))) for _ in range(2000)])
    print(f"{count} damaged messages compared")
    assert count > 50000


def test_hand_made_rules():
    h = functools.partial(struct.pack, "!HHHHHH", 0x1234, 0x0100)
    q = b"\x03www\x07example\x00\x00\x01\x00\x01"
    cases = [b"", b"\x00" * 11, h(0, 0, 0, 0), h(1, 0, 0, 0)]
    for size in range(248, 260):  # names of 248 to 259 bytes without the root: cached below 255, too long above
        last = size - 3 * 64 - 1
        name = b"".join(b"\x3f" + b"a" * 63 for _ in range(3)) + bytes([last]) + b"b" * last + b"\x00"
        cases += [h(1, 0, 0, 0) + name + b"\x00\x01\x00\x01", h(1, 0, 0, 0) + b"\x01z\xc0\x0e" + name[2:]]
    cases += [
        h(1, 0, 0, 0) + b"\x01a\xc0\x0c\x00\x01\x00\x01",  # pointer to itself's start
        h(2, 1, 0, 0) + q + b"\x01a\xc0\x0c\x00\x01\x00\x01" + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x01\x00\x00",
        h(2, 0, 0, 0) + q + b"\x01a\xc0\x20\x00\x01\x00\x01",  # forward pointer in the 2nd question
        h(1, 1, 0, 0) + q + b"\xc0\x0c\x00\x06\x00\x01\x00\x00\x00\x01\x00\x04\x01\x02\x03",  # RDATA cut
        h(1, 2, 0, 0) + q + b"\xc0\x0c\x00\x06\x00\x01\x00\x00\x00\x01\x00\x00",  # one answer of two
        h(1, 0, 0, 1) + q + b"\x00\x00\x29\x10\x00\x00\x00\x80\x00\x00\x08\x00\x0a\x00\x04abcd",
        h(1, 0, 0, 1) + q + b"\x00\x00\x29\x10\x00\x00\x00\x80\x00\x00\x09\x00\x0a\x00\x04abcd",
    ]
    check_same(cases)
    parse = c_parse()
    for buf in cases:  # without a cache, and other buffer types (handed to the Python walker)
        assert typed(parse(buf)) == typed(dnswire.parse_message(buf))
        assert typed(parse(memoryview(buf))) == typed(dnswire.parse_message(memoryview(buf)))
        assert typed(parse(bytearray(buf))) == typed(dnswire.parse_message(bytearray(buf)))


def test_names_cache_bound():
    from probe.decode.parsers import FastParser

    py, c = dnswire.MessageParser(max_names=3), FastParser(max_names=3)
    for i in range(20):
        buf = struct.pack("!HHHHHH", i, 0, 1, 0, 0, 0) + bytes([1, 97 + i % 7]) + b"\x00\x00\x01\x00\x01"
        assert typed(c.parse(buf)) == typed(py.parse(buf))
        assert c.names == py.names


# --------------------------------------------------------------------------------------------------
# The whole decoder


def decode_all(path, parser, batch_size, ip_filter=None, keep_raw=True):
    stats = Stats()
    decoder = PacketDecoder(DecodeConfig(parser=parser), (53,), stats, ip_filter, keep_raw=keep_raw)
    assert decoder.parser == parser
    msgs = []
    for batch in read_capture(path, batch_size):
        msgs += decoder.decode(batch, str(path))
    decoder.flush()
    return msgs, stats.as_dict(), decoder.address_events


@needs_shared
@pytest.mark.parametrize("parser", ["fast", "wire", "dpkt"])
def test_raw_left_out(decode_captures, parser):
    """keep_raw=False (an exporter that never reads the raw message): the same messages with raw None, the
    same counters and events (the records' raw field: tests/decode/test_decoderec.py)."""
    for path in decode_captures:
        if path.stat().st_size > 1 << 20:
            continue
        for batch_size in (4096, 7) if path.name == "tcp.pcap" else (4096,):
            full = decode_all(path, parser, batch_size)
            lean = decode_all(path, parser, batch_size, keep_raw=False)
            assert lean[1:] == full[1:], path.name
            assert [typed(m) for m in lean[0]] == [typed(m[: M.RAW] + (None,)) for m in full[0]], path.name


def test_raw_kept_for_cdns_only():
    from export import reads_raw
    from probe.config import load_config

    assert reads_raw(load_config(None, {"export.format": "cdns"})) is True
    assert reads_raw(load_config(None, {"export.format": "parquet"})) is False
    assert reads_raw(load_config(None, {})) is False


# --------------------------------------------------------------------------------------------------
# Which parser runs


def run_in(tree, *args):
    """`python -m probe ARGS` with the package of the source tree `tree` (ROOT: this one)."""
    env = None if tree == ROOT else copy_env()
    return subprocess.run([sys.executable, "-m", "probe", *map(str, args)], capture_output=True, text=True, cwd=tree,
                          env=env)


def test_stats_json_names_the_parser(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = run_in(ROOT, "read", SAMPLE, "-o", out, "-q", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    (stats,) = out.glob("*.stats.json")
    assert json.loads(stats.read_text())["decode_parser"] == "fast"


@pytest.fixture(scope="module")
def tree_without_extension(tmp_path_factory):
    """A copy of the package sources with every compiled extension but _fastwire: the state of an
    install where it did not build. Run with the copy first on the path (python -m from its directory)."""
    d = tmp_path_factory.mktemp("unbuilt")
    for name in ("probe", "export", "config"):
        shutil.copytree(ROOT / name, d / name, ignore=shutil.ignore_patterns("_fastwire*.so", "__pycache__"))
    assert not list(d.rglob("_fastwire*.so"))
    return d


def test_not_built_fast_is_a_config_error(tree_without_extension, tmp_path):
    proc = run_in(tree_without_extension, "read", SAMPLE, "-o", tmp_path, "-q", "--set", "decode.parser=fast")
    assert proc.returncode == 2, proc.stderr
    assert "decode.parser" in proc.stderr and "_fastwire is not built" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_not_built_auto_warns_and_says_so(tree_without_extension, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = run_in(tree_without_extension, "read", SAMPLE, "-o", out, "-q", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning: decode.parser auto") == 1, proc.stderr
    (stats,) = out.glob("*.stats.json")
    doc = json.loads(stats.read_text())
    assert doc["decode_parser"] == "wire"
    # Same records as the C decoder writes (the sample's Parquet output, compared as rows).
    ref = tmp_path / "ref"
    ref.mkdir()
    proc = run_in(ROOT, "read", SAMPLE, "-o", ref, "-q", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    from support.dnsprobe import as_rows, read_output

    assert as_rows(read_output(out)) == as_rows(read_output(ref))
    assert json.loads(next(ref.glob("*.stats.json")).read_text())["counters"] == doc["counters"]
