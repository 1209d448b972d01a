"""Response messages through the C answers walker (export.parquet._answers, via answers.answers_column) and its
Python twin (answers_column_python): equal columns and counts of capped records, records up to a message's damage
included; and the text within its caps: a message's owner names and RDATA texts at most the message cap of its
length, a record's RDATA text at most the record cap of the message's length (answers.py: a few bytes of pointers
must not make a column a hundred times their size).

Input: DNS messages as harness.split_frames splits them (2-byte length, bytes); an empty one is a null (no
response)."""

import pyarrow as pa
from harness import check, run, split_frames

from export.parquet import answers

assert answers._WALKER is not None, "export.parquet._answers is not built"


def one_input(data):
    messages = [m or None for m in split_frames(data)] or [data]
    column = pa.array(messages, pa.binary())
    (got, got_capped), (want, want_capped) = answers.answers_column(column), answers.answers_column_python(column)
    check(got.equals(want) and got_capped == want_capped, "answers", data, (got.to_pylist(), got_capped),
          (want.to_pylist(), want_capped))
    for message, entry in zip(messages, got.to_pylist()):
        if not entry:
            continue
        text = sum(len(r["name"]) + len(r["data"]) for r in entry)
        longest = max(len(r["data"]) for r in entry)
        within = text <= answers.MESSAGE_TEXT_BASE + answers.MESSAGE_TEXT_PER_BYTE * len(message) and \
            longest <= answers.RECORD_TEXT_BASE + answers.RECORD_TEXT_PER_BYTE * len(message)
        check(within, "answers text over its caps", data, (len(message), text, longest), "within the caps")


if __name__ == "__main__":
    run(one_input)
