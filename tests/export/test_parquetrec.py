"""The record column pass (export.parquet._parquetrec, RecordBuilder.build on a TxBatch) must give the table the
Python reference builds from the same transactions as tuples (RecordBuilder.build: columns.extract_python, then
Arrow kernels), column for column, types and nulls included; with the answers column too.

Transactions: those of every shared capture (DNS Probe's, compactor's: malformed messages, zone transfers,
TCP, IPv6, EDNS options), the sample, the live-capture test's generated traffic and the benchmark mix, matched
by the Python loop and copied into a TxBatch.
"""

import pytest
from support.captures import columnar_captures
from support.stages import transactions

import export.parquet.records as records
from export.parquet.records import RecordBuilder
from export.parquet.schema import SCHEMA
from probe import _records


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    return columnar_captures(tmp_path_factory.mktemp("parquetrec"))


def test_extension_is_built():
    from export.parquet import _parquetrec

    assert callable(_parquetrec.parquet_columns)


def test_every_schema_column_and_no_other():
    from export.parquet import _parquetrec

    assert len(_parquetrec.parquet_columns(_records.TxBatch(), records._C_NAMES + ["r_raw"])) == len(SCHEMA) - 3
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
        got = RecordBuilder(answers=answers).build_records(batch)
        want = RecordBuilder(answers=answers).build(txs)
        got.validate(full=True)
        assert got.schema == want.schema
        for name in want.column_names:
            assert got.column(name).equals(want.column(name)), f"{path.name}: column {name}"
        rows += got.num_rows
        with_answers += got.num_rows - got.column("answers").null_count
    assert rows > 10000 and (with_answers > 5000 if answers else with_answers == 0)
