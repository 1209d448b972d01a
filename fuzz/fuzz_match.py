"""Decoded messages through the C matching loop (probe.match._match) and its Python twin
(TransactionTable.add_python), in the batches and with the table bounds the first bytes pick: equal
transactions in the same order, equal pending tables (in the same order) and counters."""

from harness import check, run, typed
from stages import match_input, messages

from probe.match import TransactionTable
from probe.stats import Stats


def state(table):
    return list(table.pending.items()), sorted(table.transfers), table.held, table.now_ns, table.stats.as_dict()


def one_input(data):
    cfg, msgs = match_input(data, messages)
    if not msgs:
        return
    c, py = TransactionTable(cfg, Stats()), TransactionTable(cfg, Stats(), python=True)
    step = data[0] % 5 + 1
    for i in range(0, len(msgs), step):
        got, want = c.add(msgs[i : i + step]), py.add(msgs[i : i + step])
        check(typed(got) == typed(want), "transactions", data, got, want)
        check(typed(state(c)) == typed(state(py)), "table", data, state(c), state(py))
    got, want = c.flush(), py.flush()
    check(typed(got) == typed(want), "flush", data, got, want)


if __name__ == "__main__":
    run(one_input)
