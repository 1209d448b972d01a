"""A dnstap frame through the C decoder (probe.decode._dnstap, message records), the Python decoder (message tuples)
and protobuf's own parser (upb): the C reader accepts exactly what upb accepts, and both decoders give the same
messages (the records read back as tuples, field by field), counters and refusals.

    one_input(data)       raises AssertionError when they disagree on the bytes of one dnstap frame
    python fuzz/fuzz_dnstap.py [libFuzzer flags] [corpus dirs]   under atheris, with the fuzz build (make fuzz)
    python fuzz/fuzz_dnstap.py --random N    without atheris: N seeded mutations of the valid frames of corpus()

tests/decode/test_dnstap_c.py runs one_input over real, crafted and mutated frames; a finding becomes a case there.
"""

import random
import sys
from pathlib import Path

if __name__ == "__main__" and sys.argv[1:2] != ["--random"]:
    import harness  # first: it instruments the modules of probe imported below (fuzz/harness.py)

from google.protobuf.message import DecodeError  # noqa: E402

from probe.config import load_config  # noqa: E402
from probe.decode import _dnstap  # noqa: E402
from probe.decode.dnstap import COUNTS, DnstapDecoder  # noqa: E402
from probe.decode.dnstap_schema import Dnstap  # noqa: E402
from probe.decode.dnstap_types import TYPE_NAMES  # noqa: E402
from probe.decode.ipfilter import IpFilter  # noqa: E402
from probe.model import DnstapBatch  # noqa: E402
from probe.native import load  # noqa: E402
from probe.stats import Stats  # noqa: E402

_records = load("probe._records")

ROOT = Path(__file__).resolve().parent.parent

# Every type selected, an IP list on, raw kept: every rule of the mapping runs.
_CFG = load_config(overrides={"dnstap.message_types": list(TYPE_NAMES), "filter.ipv4_deny": ["10.9.0.0/16"],
                              "filter.ipv6_deny": ["2001:db8:dead::/48"]})


def _decoder(python):
    return DnstapDecoder(_CFG.dnstap, _CFG.decode, Stats(), IpFilter(_CFG.filter), keep_raw=True, python=python)


def upb_accepts(frame):
    try:
        Dnstap.FromString(frame)
        return True
    except DecodeError:
        return False


def decode_both(frames, producer="p"):
    """(messages, counters, refused) of the Python decoder's tuples and of the C decoder's records (read back as
    tuples: QueryCopy keeps its type) for one producer's frames."""
    out = []
    for python in (True, False):
        decoder = _decoder(python)
        batch = DnstapBatch([(producer, list(frames))])
        if python:
            msgs = decoder.decode(batch)
        else:
            records = _records.MsgBatch()
            decoder.decode_into(batch, records)
            msgs = records.to_tuples()
        out.append(([(type(m).__name__, tuple(m)) for m in msgs], decoder.stats.as_dict(), batch.refused))
    return out


def one_input(data):
    """The C reader accepts exactly what upb accepts, and both decoders give the same result."""
    c_counts = [0] * len(COUNTS)
    d = _decoder(False)
    stop, _ = _dnstap.decode([data], 0, "p", _records.MsgBatch(), c_counts, [0] * 15, *d._c_args)
    assert (stop == 1) == upb_accepts(data), (data.hex(), stop)
    python, c = decode_both([data])
    assert python == c, (data.hex(), python, c)


def mutate(rng, frame):
    f = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        i = rng.randrange(len(f)) if f else 0
        if op < 0.45 and f:
            f[i] = rng.randrange(256)
        elif op < 0.6 and f:
            del f[i : i + rng.randint(1, 8)]
        elif op < 0.8:
            f[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op < 0.9 and f:
            j = rng.randrange(len(f))
            f[i:i] = f[j : j + rng.randint(1, 16)]  # a piece of itself: keys and lengths that make sense
        else:
            f = f[: rng.randrange(len(f) + 1)]
    return bytes(f)


def corpus():
    """Valid frames with every field the decoder reads, and some it does not (the seeds: fuzz/make_corpus.py)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))  # the tests' support package builds them
    from support.dnstap import dnstap_frame
    from support.messages import q_dns, r_dns

    frames = []
    for i, (mtype, proto, family, addrs) in enumerate([
        ("CLIENT_QUERY", "UDP", "INET", ("192.0.2.1", "198.51.100.53")),
        ("CLIENT_RESPONSE", "TCP", "INET6", ("2001:db8::1", "2001:db8:53::53")),
        ("AUTH_RESPONSE", "DOT", None, ("10.9.1.1", "192.0.2.53")),  # denied by the IP list
        ("RESOLVER_QUERY", "DOH", "INET", ("192.0.2.1", "192.0.2.2")),
        ("TOOL_RESPONSE", None, None, (None, None)),
        ("FORWARDER_QUERY", "DOQ", "INET6", ("2001:db8:dead::1", "2001:db8::53")),
    ]):
        extra = {"http_protocol": 3} if proto == "DOH" else {}
        response = mtype.endswith("RESPONSE")
        frames.append(dnstap_frame(mtype, dns=(r_dns if response else q_dns)(i), family=family, protocol=proto,
                                   qaddr=addrs[0], raddr=addrs[1], embedded=q_dns(i) if response else None,
                                   identity=b"id\xff%d" % i if i % 2 else None, **extra))
    d = Dnstap.FromString(frames[0])
    d.version = b"v"
    d.extra = b"x"
    d.message.query_zone = b"\x07example\x00"
    d.message.policy.type = "rpz"
    d.message.policy.action = 2
    d.message.policy.value = b"\x01"
    frames.append(d.SerializeToString())
    return frames


def main(argv):
    assert _dnstap is not None, "probe.decode._dnstap is not built"
    if argv[:1] == ["--random"]:
        rng = random.Random(20)
        seeds = corpus()
        for _ in range(int(argv[1])):
            one_input(mutate(rng, rng.choice(seeds)))
        print(f"{argv[1]} mutated frames: no difference")
        return
    harness.run(one_input)


if __name__ == "__main__":
    main(sys.argv[1:])
