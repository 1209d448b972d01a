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

    assert callable(_parquetrec.parquet_columns)


def test_every_schema_column_and_no_other():
    from export.parquet import _parquetrec

    assert len(_parquetrec.parquet_columns(_records.TxBatch(), rows._C_NAMES + ["r_raw"])) == len(SCHEMA) - 3
    with pytest.raises(ValueError, match="no Parquet column"):
        _parquetrec.parquet_columns(_records.TxBatch(), ["id", "nope"])
    with pytest.raises(ValueError, match="no Parquet column"):
        _parquetrec.parquet_columns(_records.TxBatch(), ["answers"])


@pytest.mark.parametrize("answers", [False, True], ids=["plain", "answers"])
def test_tables_equal_python_builder(captures, answers):
    rows = with_answers = 0
    for path in captures:
        txs = transactions(path, keep_raw=answers)
        batch = _records.TxBatch()
        for t in txs:
            batch.append(t)
        got = RowBuilder(answers=answers).build_from_records(batch)
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
    others apart: the C pass selects them as the reference does, each part the rows of the whole table that are
    late, or not, in the order they came."""
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
        for late in (False, True):
            got = RowBuilder().build_from_records(batch, late)
            want = RowBuilder().build(txs, late)
            got.validate(full=True)
            assert got.equals(want), f"{path.name}: late={late}"
            assert got.equals(everything.filter(late_mask if late else pc.invert(late_mask))), path.name
            counts[late] += got.num_rows
        malformed_queries += pc.sum(pc.and_(everything.column("malformed"),
                                            pc.invert(everything.column("response_present")))).as_py() or 0
    assert counts[True] > 100 and counts[False] > 10000 and malformed_queries > 0
