"""QNAMEs through the C Public Suffix List (export.enrich._psl, via PublicSuffixes.columns) and the
publicsuffixlist package, its reference: equal (public suffix, registered domain) for every name, with the ICANN
section and with the whole list.

Input: the first byte picks the list and where the column starts (an Arrow slice); the rest, split at newlines,
are the names, as the qname column writes them (UTF-8, other bytes as \\xNN escapes)."""

import pyarrow as pa
from harness import check, run

from export.enrich.psl import PublicSuffixes

STEPS = (PublicSuffixes(), PublicSuffixes(private=True))
assert all(s.native is not None for s in STEPS), "export.enrich._psl is not built"


def one_input(data):
    if not data:
        return
    step = STEPS[data[0] & 1]
    skip = (data[0] >> 1) & 3
    names = [None if line == b"\x00" else line.decode("utf-8", "backslashreplace") for line in data[1:].split(b"\n")]
    column = pa.array([None] * skip + names, pa.string()).slice(skip)
    got = list(zip(*(c.to_pylist() for c in step.columns(column))))
    want = [("", "") if n is None else step.suffixes(n) for n in names]
    check(got == want, "suffixes", data, got, want)


if __name__ == "__main__":
    run(one_input)
