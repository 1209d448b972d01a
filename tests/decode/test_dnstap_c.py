"""The dnstap decoder's C loop (probe/decode/_dnstap.c) against its Python twin and protobuf's parser (upb):
the same messages, counters and refusals, and the same bytes accepted, on crafted, real-shaped and mutated
frames (fuzz/fuzz_dnstap.py's one_input, which the coverage-guided fuzzer drives)."""

import random

import pytest
from fuzz_dnstap import corpus, decode_both, mutate, one_input, upb_accepts
from support.dnstap import dnstap_frame
from support.frames import T0

from probe.decode import _dnstap, dnstap
from probe.model import TRANSPORTS


def test_extension_is_built_and_used():
    assert _dnstap is not None and dnstap._dnstap is not None
    from probe.config import load_config
    from probe.stats import Stats

    cfg = load_config()
    assert dnstap.DnstapDecoder(cfg.dnstap, cfg.decode, Stats())._c is not None


def test_constants_are_the_python_ones():
    assert _dnstap.COUNT_NAMES == dnstap.COUNTS
    assert _dnstap.PROTO_OF == (0, *(TRANSPORTS[c][1] for c in range(1, 8)))


def test_corpus_then_mutations():
    frames = corpus()
    for frame in frames:
        assert upb_accepts(frame)
        one_input(frame)
    python, c = decode_both(frames * 3)  # one producer's run of many frames, the caches warm
    assert python == c and len(python[0]) > 10
    rng = random.Random(18)
    refused = 0
    for _ in range(20_000):
        frame = mutate(rng, rng.choice(frames))
        refused += not upb_accepts(frame)
        one_input(frame)
    assert 2_000 < refused < 18_000  # both sides of the line were explored


def test_a_refused_frame_in_the_middle_of_a_run():
    frames = corpus()
    python, c = decode_both(frames[:3] + [b"\x0a\x05ab"] + frames)
    assert python == c and python[2] and python[1]["dnstap_frames_discarded"] == len(frames)


def _varint(v):
    out = bytearray()
    while True:
        out.append(v & 0x7F | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def _ld(field, body):
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def _groups(field, k):
    return _varint(field << 3 | 3) * k + _varint(field << 3 | 4) * k


GOOD = dnstap_frame("CLIENT_QUERY")


@pytest.mark.parametrize("frame", [
    b"",
    _groups(5, 100), _groups(5, 101),  # nesting limits: upb's is 100 levels of messages and groups
    GOOD + _ld(14, _groups(20, 99)), GOOD + _ld(14, _groups(20, 100)),
    GOOD + _ld(14, _ld(15, _groups(9, 98))), GOOD + _ld(14, _ld(15, _groups(9, 99))),
    GOOD + b"\x2b\x34",  # a group closed by another field's end tag
    GOOD + b"\x2c",  # an end tag without its group
    GOOD + b"\x0e", GOOD + b"\x0f",  # wire types 6 and 7
    GOOD + b"\x78" + b"\xff" * 9 + b"\x7f", GOOD + b"\x78" + b"\xff" * 10 + b"\x01",  # 10 and 11 byte varints
    GOOD + b"\xf8\xff\xff\xff\x0f\x00", GOOD + b"\x80\x80\x80\x80\x10\x00",  # field 2^29-1, then a key of 2^32
    GOOD + b"\x00\x00",  # field number 0
    # Field number 0 inside a group, which upb takes (found by fuzz/fuzz_dnstap.py: the C reader refused it),
    # at any depth of groups and in a message field's groups, and the fuzzer's input itself:
    GOOD + b"\x5b\x00\x01\x5c", GOOD + b"\x5b\x5b\x00\x01\x5c\x5c", GOOD + b"\x5b\x03\x04\x5c",
    GOOD + _ld(14, b"\x5b\x01" + bytes(8) + b"\x5c"), bytes.fromhex("5b010e5b5b5b5c5c5c5c5c"),
    GOOD + b"\x5b\x00\x01",  # ... in a group that does not end
    # Keys and lengths of more than 5 bytes, which upb refuses even for a small number (found by
    # fuzz/fuzz_dnstap.py: the C reader took them, up to 10 bytes as for a value), the fuzzer's input first;
    # 5 bytes still taken, and values of 10 bytes:
    bytes.fromhex("728080808080808080000801"), GOOD + b"\x72\x80\x80\x80\x80\x80\x00",
    GOOD + b"\x72\x80\x80\x80\x80\x00",
    GOOD + b"\x0a\x81\x80\x80\x80\x80\x00a", GOOD + b"\x0a\x81\x80\x80\x80\x00a",  # a 1-byte identity
    GOOD + b"\xfa\x80\x80\x80\x80\x00\x00", GOOD + b"\xfa\x80\x80\x80\x00\x00",  # field 15 as a 6- and 5-byte key
    GOOD + b"\x5b\xdb\x80\x80\x80\x80\x00\x5c", GOOD + b"\x5b\x12\x80\x80\x80\x80\x80\x00\x5c",  # in a group
    GOOD + _ld(14, b"\x22\x84\x80\x80\x80\x80\x00\x01\x02\x03\x04"),  # query_address
    GOOD + _ld(14, b"\x22\x84\x80\x80\x80\x00\x01\x02\x03\x04"),
    GOOD + _ld(14, b"\x08" + b"\x81" + b"\x80" * 8 + b"\x00"),  # a 10-byte value: taken
    GOOD + _ld(14, b"\x08" + _varint((1 << 32) + 6)),  # an enum beyond 32 bits: upb keeps its low 32 bits
    GOOD + _ld(14, b"\x08" + _varint((1 << 64) - 1)),  # -1 as an enum: outside, unknown
    GOOD + _ld(14, b"\x18\x04\x18\x09"),  # DOH then a protocol outside the enum: DOH stays
    GOOD + _ld(14, b"\x30" + _varint((1 << 32) + 53)),  # a port beyond 32 bits: its low 32 bits
    GOOD + _ld(14, b"\x38" + _varint(70000)),  # a port beyond 16 bits: bad address
    GOOD + _ld(14, b"\x25\x01\x02\x03\x04"),  # query_address with the wrong wire type: unknown, skipped
    GOOD + _ld(14, b"\x42\x00"),  # query_time_sec as bytes: unknown; the time from before stays
    GOOD + _ld(14, b"\x4d\xff\xc9\x9a\x3b"),  # nsec 999999999 + ... then 1e9 below
    GOOD + _ld(14, b"\x4d\x00\xca\x9a\x3b"),  # nsec = 1e9: no time
    GOOD + _ld(14, b"\x40" + _varint(9223372036)),  # the last second of int64 ns (found by this test) ...
    GOOD + _ld(14, b"\x40" + _varint(9223372036) + b"\x4d\x00\x00\x00\x33"),  # ... and beyond it
    GOOD + _ld(14, b"\x40" + _varint(9223372037)),
    GOOD + _ld(14, b"\x7a\x03\x08\x01"),  # a Policy cut short
    GOOD + _ld(14, b"\x7a\x02\x18\x07"),  # a Policy action outside its enum: fine
    GOOD + _ld(14, b"") + _ld(14, b"\x08\x06"),  # message merged: now a CLIENT_RESPONSE without its DNS message
    GOOD + _ld(1, b"") ,  # an empty identity: none
    GOOD + b"\x78\x02",  # Dnstap.type 2 after 1: 1 stays
    b"\x78\x02" + GOOD[:-2],  # Dnstap.type only 2 (outside): not a message
    _ld(14, b""),  # a message, no Dnstap.type
    GOOD + _ld(14, b"\x10\x02"),  # INET6 with IPv4 addresses
    GOOD + _ld(14, b"\x10\x01\x22\x00\x2a\x00"),  # empty addresses: none
])
def test_crafted(frame):
    one_input(frame)


def test_families_are_the_records():
    """A record stores the family as its code, (type + 1) // 2, named by probe._records.FAMILIES."""
    from probe import _records
    from probe.decode.dnstap_types import FAMILIES, MESSAGE_TYPES

    assert _records.FAMILIES == FAMILIES
    assert all(FAMILIES.index(family) + 1 == (number + 1) // 2 for number, (_, family, _) in MESSAGE_TYPES.items())


def test_records_round_trip_the_python_tuples():
    """The Python decoder's tuples (QueryCopy included) through MsgBatch.append come back unchanged, type and all:
    the frames the C loop hands back join the batch that way. The producer is a file whose name is not UTF-8
    (a surrogate in Python), as the C loop also takes it."""
    from fuzz_dnstap import _decoder

    from probe import _records
    from probe.model import DataFrames, DnstapBatch

    msgs = _decoder(True).decode(DnstapBatch([("tap-é-\udcff.fstrm", DataFrames.of(corpus() * 2))]))
    batch = _records.MsgBatch()
    batch.extend(msgs)
    back = batch.to_tuples()
    assert [(type(m), tuple(m)) for m in back] == [(type(m), tuple(m)) for m in msgs]
    assert sum(type(m).__name__ == "QueryCopy" for m in back) > 2
    python, c = decode_both(corpus(), producer="tap-é-\udcff.fstrm")
    assert python == c


def test_an_ip_list_that_raises_gives_its_exception():
    """Found by review (issue 32): an IP list's callable raising left its exception set while decode went on to
    add the counts, calling into Python with it (a count whose + runs Python code turned it into SystemError)."""
    from fuzz_dnstap import _decoder

    from probe import _records
    from probe.model import DataFrames

    class Count(int):
        def __add__(self, other):
            return Count(int(self) + other)

    def refuse(client, server):
        raise LookupError("no list")

    types, _, keep6, keep_raw = _decoder(False)._c_args
    counts, type_counts = [Count(0)] * len(_dnstap.COUNT_NAMES), [Count(0)] * 15
    with pytest.raises(LookupError, match="no list"):
        _dnstap.decode(DataFrames.of([GOOD]).spans, "p", _records.MsgBatch(), counts, type_counts, types, refuse,
                       keep6, keep_raw)
    assert counts == [0] * len(counts) and type_counts == [0] * 15
    assert _dnstap.decode(DataFrames.of([GOOD]).spans, "p", _records.MsgBatch(), counts, type_counts, types,
                          lambda client, server: True, keep6, keep_raw) == (-1, T0)
    assert counts[_dnstap.COUNT_NAMES.index("dns_messages")] == 1
