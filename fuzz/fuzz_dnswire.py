"""A DNS message through the C wire walker (probe.decode._fastwire.parse_message) and its Python twin
(probe.decode.dnswire.parse_message): equal tuples of equal types, equal question-name caches."""

from harness import check, run, typed

from probe.decode import dnswire
from probe.decode.parsers import _fastwire

assert _fastwire is not None, "probe.decode._fastwire is not built"


def one_input(data):
    py_names, c_names = {}, {}
    want = dnswire.parse_message(data, py_names)
    got = _fastwire.parse_message(data, c_names)
    check(typed(got) == typed(want), "message", data, got, want)
    check(typed(c_names) == typed(py_names), "names cache", data, c_names, py_names)


if __name__ == "__main__":
    run(one_input)
