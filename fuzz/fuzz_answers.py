"""Response messages through the C answers walker (export.parquet._answers, via answers.answers_column) and its
Python twin (answers_column_python): equal columns, records up to a message's damage included.

Input: DNS messages as harness.split_frames splits them (2-byte length, bytes); an empty one is a null (no
response)."""

import pyarrow as pa
from harness import check, run, split_frames

from export.parquet import answers

assert answers._WALKER is not None, "export.parquet._answers is not built"


def one_input(data):
    messages = [m or None for m in split_frames(data)] or [data]
    column = pa.array(messages, pa.binary())
    got, want = answers.answers_column(column), answers.answers_column_python(column)
    check(got.equals(want), "answers", data, got.to_pylist(), want.to_pylist())


if __name__ == "__main__":
    run(one_input)
