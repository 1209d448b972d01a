"""Messages through the record matcher (probe.match._matchrec: RecordTable on a MsgBatch, into a TxBatch) and its
Python reference (TransactionTable, on the same messages as tuples), in the batches and with the table bounds
the first 3 bytes pick: the same transactions in the same order after every batch and at flush, the same
pending queries, the same counters. The high bit of the second byte picks the messages: crafted ones
(fuzz/crafted.py: 8 bytes each, so that IDs, ports and names collide, queries repeat, zone transfers open and
close and timeouts fire), or those decoded from fuzz frames (fuzz/stages.py)."""

import stages
from crafted import messages
from harness import check, run, typed
from stages import match_input

from probe import _records
from probe.match import RecordTable, TransactionTable
from probe.stats import Stats


def one_input(data):
    cfg, msgs = match_input(data, stages.messages if len(data) > 1 and data[1] & 0x80 else messages)
    if not msgs:
        return
    rec, py = RecordTable(cfg, Stats()), TransactionTable(cfg, Stats())
    batch, out = _records.MsgBatch(), _records.TxBatch()
    step = data[0] // 8 % 5 + 1
    for i in range(0, len(msgs) + 1, step):
        part = msgs[i : i + step]
        if i < len(msgs):
            batch.clear()
            batch.extend(part)
            rec.add(batch, out)
            got, want = out.to_tuples(), py.add(part)
        else:
            rec.flush(out)
            got, want = out.to_tuples(), py.flush()
        out.clear()
        check(typed(got) == typed(want), "transactions", data, got, want)
        check((len(rec), rec.held, rec.open_transfers) == (len(py.pending), py.held, py.open_transfers), "pending",
              data, (len(rec), rec.held, rec.open_transfers), (len(py.pending), py.held, py.open_transfers))
        check(rec.stats.as_dict() == py.stats.as_dict(), "counters", data, rec.stats.as_dict(), py.stats.as_dict())


if __name__ == "__main__":
    run(one_input)
