"""Fuzz bytes → frames → messages → transactions, through the reference stages (message tuples: the Python frame
loop with the C walker where built, TransactionTable), for the harnesses of the later stages. Returns [] for
inputs that give nothing."""

from harness import split_frames

from probe.config import DecodeConfig, MatchConfig
from probe.decode.packets import PacketDecoder
from probe.match import TransactionTable
from probe.model import FrameBatch
from probe.stats import Stats

T0 = 1_700_000_000_000_000_000


def messages(data, keep_raw=True):
    """Ethernet frames (harness.split_frames), 1 ms apart, decoded: the message tuples."""
    frames = split_frames(data)
    if not frames:
        return []
    decoder = PacketDecoder(DecodeConfig(), (53,), Stats(), keep_raw=keep_raw)
    batch = FrameBatch(1, [T0 + 1_000_000 * i for i in range(len(frames))], [len(f) for f in frames], frames)
    msgs = decoder.decode(batch, "fuzz")
    decoder.flush()
    return msgs


def transactions(data, keep_raw=True):
    table = TransactionTable(MatchConfig(), Stats())
    msgs = messages(data, keep_raw)
    return table.add(msgs) + table.flush() if msgs else []



def match_input(data, make_messages):
    """(matching bounds the first 3 bytes pick: a 1 to 8 ms timeout, 1 to 16 pending, 1 to 4 a key, 1 to 4 open
    transfers; the messages make_messages makes of the rest), or (None, []) when there are none."""
    msgs = make_messages(data[3:]) if len(data) >= 3 else []
    if not msgs:
        return None, []
    return MatchConfig(query_timeout=(data[0] % 8 + 1) * 0.001, max_pending=data[1] % 16 + 1,
                       max_pending_per_key=data[2] % 4 + 1, max_transfers=(data[2] >> 2) % 4 + 1), msgs
