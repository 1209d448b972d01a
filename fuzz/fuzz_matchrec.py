"""Messages through the record matcher (probe.match._matchrec: RecordTable on a MsgBatch, into a TxBatch), the
tuple matcher in C (probe.match._match) and TransactionTable's Python loop (add_python), in the batches and
with the table bounds the first 3 bytes pick: the same transactions in the same order after every batch and at
flush, the same pending queries, the same counters. The messages are crafted (fuzz/crafted.py: 8 bytes each),
so that IDs, ports and names collide, queries repeat, zone transfers open and close and timeouts fire."""

from crafted import messages
from harness import check, run, typed
from stages import match_input

from probe import _records
from probe.match import RecordTable, TransactionTable
from probe.stats import Stats


def one_input(data):
    cfg, msgs = match_input(data, messages)
    if not msgs:
        return
    rec, c, py = RecordTable(cfg, Stats()), TransactionTable(cfg, Stats()), TransactionTable(cfg, Stats(), python=True)
    batch, out = _records.MsgBatch(), _records.TxBatch()
    step = data[0] // 8 % 5 + 1
    for i in range(0, len(msgs) + 1, step):
        part = msgs[i : i + step]
        if i < len(msgs):
            batch.clear()
            batch.extend(part)
            rec.add(batch, out)
            got, fast, want = out.to_tuples(), c.add(part), py.add(part)
        else:
            rec.flush(out)
            got, fast, want = out.to_tuples(), c.flush(), py.flush()
        out.clear()
        check(typed(got) == typed(want), "transactions (records)", data, got, want)
        check(typed(fast) == typed(want), "transactions (tuples)", data, fast, want)
        check((len(rec), rec.held) == (len(py.pending), py.held), "pending", data, (len(rec), rec.held),
              (len(py.pending), py.held))
        check(c.stats.as_dict() == py.stats.as_dict(), "counters (tuples)", data, c.stats.as_dict(),
              py.stats.as_dict())
    check(rec.stats.as_dict() == py.stats.as_dict(), "counters (records)", data, rec.stats.as_dict(),
          py.stats.as_dict())


if __name__ == "__main__":
    run(one_input)
