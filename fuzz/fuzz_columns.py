"""Transactions through the C column pass (export.parquet._columns.extract) and its Python twin
(columns.extract_python), with every column spec of the Parquet records: equal Arrow arrays, or the same
error from both."""

from harness import check, run
from stages import transactions

from export.parquet import columns
from export.parquet.records import _CLIENT, _FIELDS

SPECS = list(_FIELDS.values()) + list(_CLIENT.values())


def outcome(extract, rows):
    try:
        return extract(rows, SPECS), None
    except (TypeError, ValueError, OverflowError, IndexError) as exc:
        return None, type(exc)


def one_input(data):
    rows = transactions(data, keep_raw=False)
    if not rows:
        return
    (got, got_error), (want, want_error) = outcome(columns.extract, rows), outcome(columns.extract_python, rows)
    check(got_error == want_error, "error", data, got_error, want_error)
    if got is not None:
        for spec, a, b in zip(SPECS, got, want):
            check(a.equals(b), f"column {spec}", data, a, b)


if __name__ == "__main__":
    run(one_input)
