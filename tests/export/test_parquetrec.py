"""The record column pass (export.parquet._parquetrec, RowBuilder.build on a TxBatch) must give the table the
Python reference builds from the same transactions as tuples (RowBuilder.build: columns.extract_python, then
Arrow kernels), column for column, types and nulls included; with the answers column too.

Transactions: those of every shared capture (DNS Probe's, compactor's: malformed messages, zone transfers,
TCP, IPv6, EDNS options), the sample, the live-capture test's generated traffic and the benchmark mix, matched
by the Python loop and copied into a TxBatch.
"""

import pyarrow.compute as pc
import pytest
from support.captures import columnar_captures
from support.stages import transactions

import export.parquet.rows as rows
from export.parquet.rows import RowBuilder
from export.parquet.schema import SCHEMA
from probe import _records


@pytest.fixture(scope="module")
def captures(traffic_pcap):
    return columnar_captures(traffic_pcap)


def test_extension_is_built():
    from export.parquet import _parquetrec

    assert callable(_parquetrec.parquet_arrays)


def test_every_schema_column_and_no_other():
    from export.parquet import _parquetrec

    (made,) = rows._import(_records.TxBatch(), rows._C_NAMES_RAW, rows._MADE_RAW, False)
    assert made.num_columns == len(SCHEMA) and made.num_rows == 0  # (all but answers, and r_raw)
    with pytest.raises(ValueError, match="no Parquet column"):
        _parquetrec.parquet_arrays(_records.TxBatch(), ["id", "nope"])
    with pytest.raises(ValueError, match="no Parquet column"):
        _parquetrec.parquet_arrays(_records.TxBatch(), ["answers"])


def test_the_arrays_outlive_the_batch_and_are_freed_in_any_thread(captures):
    """The pass hands its buffers to Arrow (the C data interface): a table stays right once the TxBatch is gone,
    a capsule never imported frees its arrays, and the last reference may go in another thread (release only
    frees memory: no GIL needed)."""
    import threading

    from export.parquet import _parquetrec

    path = max(captures, key=lambda p: p.stat().st_size)
    txs = transactions(path)
    batch = _records.TxBatch()
    for t in txs:
        batch.append(t)
    tables = RowBuilder().build_from_records(batch)
    _parquetrec.parquet_arrays(batch, rows._C_NAMES, True)  # (never imported: the capsules release them)
    del batch
    assert tables[0].equals(RowBuilder().build(txs))
    thread = threading.Thread(target=tables.clear)  # (the last reference to the arrays)
    thread.start()
    thread.join()
    assert not tables


@pytest.mark.parametrize("answers", [False, True], ids=["plain", "answers"])
def test_tables_equal_python_builder(captures, answers):
    rows = with_answers = 0
    for path in captures:
        txs = transactions(path, keep_raw=answers)
        batch = _records.TxBatch()
        for t in txs:
            batch.append(t)
        (got,) = RowBuilder(answers=answers).build_from_records(batch)
        want = RowBuilder(answers=answers).build(txs)
        got.validate(full=True)
        assert got.schema == want.schema
        for name in want.column_names:
            assert got.column(name).equals(want.column(name)), f"{path.name}: column {name}"
        rows += got.num_rows
        with_answers += got.num_rows - got.column("answers").null_count
    assert rows > 10000 and (with_answers > 5000 if answers else with_answers == 0)


def test_the_late_rows_and_the_others_apart_equal_python_builder(captures):
    """export.time_order makes the rows of late transactions (queries without response, not malformed) and the
    others apart, in one pass: the C pass selects them as the reference does, each part the rows of the whole table
    that are late, or not, in the order they came."""
    counts = {False: 0, True: 0}
    malformed_queries = 0
    for path in captures:
        txs = transactions(path)
        batch = _records.TxBatch()
        for t in txs:
            batch.append(t)
        everything = RowBuilder().build(txs)
        late_mask = pc.and_not(pc.and_not(everything.column("query_present"), everything.column("response_present")),
                               everything.column("malformed"))
        made = RowBuilder().build_from_records(batch, apart=True)
        for late, got, want in zip((False, True), made, RowBuilder().build_apart(txs)):
            got.validate(full=True)
            assert got.equals(want), f"{path.name}: late={late}"
            assert got.equals(everything.filter(late_mask if late else pc.invert(late_mask))), path.name
            counts[late] += got.num_rows
        malformed_queries += pc.sum(pc.and_(everything.column("malformed"),
                                            pc.invert(everything.column("response_present")))).as_py() or 0
    assert counts[True] > 100 and counts[False] > 10000 and malformed_queries > 0


@pytest.mark.parametrize("late_share", [0.97, 0.5], ids=["flood", "half"])
def test_many_late_rows_apart_equal_python_builder(late_share):
    """A batch of mostly (or half) unanswered queries, as a flood of them makes: the late rows' table grows chunk
    after chunk, the others' room, made for the whole batch, is given back; both equal the reference's."""
    from support.captures import bench_mix

    from probe.model import M

    txs = [tx for tx in transactions(bench_mix(), keep_raw=False) if tx[0] is not None and tx[1] is not None]
    every = round(1 / (1 - late_share))  # (one transaction in `every` keeps its response)
    txs = [tx if k % every == 0 else (tx[0], None, 0) for k, tx in enumerate(txs)]
    batch = _records.TxBatch()
    for t in txs:
        batch.append(t)
    made = RowBuilder().build_from_records(batch, apart=True)
    wanted = RowBuilder().build_apart(txs)
    late = sum(1 for q, r, _ in txs if r is None and not q[M.MALFORMED])
    assert [t.num_rows for t in made] == [len(txs) - late, late] and late > 2000
    for got, want in zip(made, wanted):
        got.validate(full=True)
        assert got.equals(want)
