"""The record column pass (export.parquet._parquetrec, RecordBuilder.build on a TxBatch) must give the table the
Python reference builds from the same transactions as tuples (columns.extract_python, then RecordBuilder's
Arrow kernels), column for column, types and nulls included; with client privacy too.

Transactions: those of every shared capture (DNS Probe's, compactor's: malformed messages, zone transfers,
TCP, IPv6, EDNS options), the sample, the live-capture test's generated traffic and the benchmark mix, matched
by the Python loop and copied into a TxBatch.
"""

import pytest
from support import columnar_captures, transactions

import export.parquet.records as records
from export.anonymise import client_privacy
from export.parquet import columns
from export.parquet.records import RecordBuilder
from export.parquet.schema import SCHEMA
from probe import _records
from probe.config import load_config


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    return columnar_captures(tmp_path_factory.mktemp("parquetrec"))


def test_extension_is_built():
    from export.parquet import _parquetrec

    assert callable(_parquetrec.parquet_columns)


def test_every_schema_column_and_no_other():
    from export.parquet import _parquetrec

    assert len(_parquetrec.parquet_columns(_records.TxBatch(), SCHEMA.names, False)) == len(SCHEMA)
    with pytest.raises(ValueError, match="no Parquet column"):
        _parquetrec.parquet_columns(_records.TxBatch(), ["id", "nope"], False)


@pytest.mark.parametrize("private", [False, True], ids=["clear", "private"])
def test_tables_equal_python_builder(captures, private, monkeypatch):
    overrides = {"privacy.client_ipv4_prefix": 24, "privacy.client_ipv6_prefix": 48} if private else {}
    cfg = load_config(overrides=overrides)
    monkeypatch.setattr(records, "extract", columns.extract_python)  # the tuple path's pure-Python reference
    rows = 0
    for path in captures:
        txs = transactions(path)
        batch = _records.TxBatch()
        for t in txs:
            batch.append(t)
        got = RecordBuilder(client=client_privacy(cfg.privacy)).build(batch)
        want = RecordBuilder(client=client_privacy(cfg.privacy)).build(txs)
        got.validate(full=True)
        assert got.schema == want.schema
        for name in want.column_names:
            assert got.column(name).equals(want.column(name)), f"{path.name}: column {name}"
        rows += got.num_rows
    assert rows > 10000
