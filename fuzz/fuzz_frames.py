"""Frames through the decoder with the C frame loop (parser fast: probe.decode._fastwire.decode_frames, which
hands TCP segments to the stream step) and without it (parser wire: the Python frame code and walker): equal
messages, counters and C-DNS address events. The first byte picks the link type (every one supported)."""

from harness import check, run, split_frames, typed

from probe.config import DecodeConfig
from probe.decode.link import LINK_NAMES
from probe.decode.packets import PacketDecoder
from probe.model import FrameBatch
from probe.stats import Stats

LINKTYPES = sorted(LINK_NAMES)


def decode(parser, batch):
    stats = Stats()
    decoder = PacketDecoder(DecodeConfig(parser=parser), (53,), stats)
    assert decoder.parser == parser
    msgs = decoder.decode(batch, "fuzz")
    decoder.flush()
    return msgs, stats.as_dict(), decoder.address_events


def one_input(data):
    if not data:
        return
    frames = split_frames(data[1:])
    linktype = LINKTYPES[data[0] % len(LINKTYPES)]
    ts = [1_700_000_000_000_000_000 + 1000 * i for i in range(len(frames))]
    batch = lambda: FrameBatch(linktype, list(ts), [len(f) for f in frames], list(frames))  # noqa: E731
    want = decode("wire", batch())
    got = decode("fast", batch())
    check(typed(got) == typed(want), "decoded frames", data, got, want)


if __name__ == "__main__":
    run(one_input)
