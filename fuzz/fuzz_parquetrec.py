"""Transactions through the record column pass (export.parquet._parquetrec: RowBuilder.build_from_records on a
TxBatch) and the Python reference (RowBuilder.build on the same transactions as tuples, its column pass
columns.extract_python): equal tables, column for column, types and nulls included. The first byte turns the
answers column on (the responses' bytes through the pass, then the answers made of them) and picks how the
transactions are made: from fuzz frames decoded and matched (fuzz/stages.py), or from crafted messages
(fuzz/crafted.py) matched with small bounds, and whether the late rows are made apart from the others (in the
same pass, as export.time_order makes them)."""

from crafted import messages
from harness import check, run
from stages import transactions

from export.parquet.rows import RowBuilder
from probe import _records
from probe.config import MatchConfig
from probe.match import TransactionTable
from probe.stats import Stats


def one_input(data):
    if not data:
        return
    answers = bool(data[0] & 1)
    apart = bool(data[0] & 4)
    if data[0] & 2:
        table = TransactionTable(MatchConfig(query_timeout=0.002, max_pending=4), Stats())
        txs = table.add(messages(data[1:])) + table.flush()
    else:
        txs = transactions(data[1:], keep_raw=answers)
    if not txs:
        return
    batch = _records.TxBatch()
    for t in txs:
        batch.append(t)
    builder = RowBuilder(answers=answers)
    made = builder.build_from_records(batch, apart)
    wanted = builder.build_apart(txs) if apart else [builder.build(txs)]
    check(len(made) == len(wanted), "tables", data, len(made), len(wanted))
    for got, want in zip(made, wanted):
        got.validate(full=True)
        check(got.schema == want.schema, "schema", data, got.schema, want.schema)
        for name in want.column_names:
            a, b = got.column(name), want.column(name)
            check(a.equals(b), f"column {name}", data, a, b)


if __name__ == "__main__":
    run(one_input)
