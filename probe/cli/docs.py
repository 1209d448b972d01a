"""Reference tables for the README, generated from the code's own declarative tables.

`python -m probe.cli.docs` prints them; tests/test_docs.py checks that README.md contains each one
verbatim, so the documentation cannot drift from the schema, the options or the counters.
"""

from export.parquet.schema import COLUMNS, DNSPROBE_COLUMNS
from probe.config import options
from probe.stats import COUNTERS


def schema_table():
    lines = ["| # | column | Arrow type | meaning |", "|---|---|---|---|"]
    for i, (name, typ, meaning) in enumerate(COLUMNS, 1):
        origin = "" if i <= len(DNSPROBE_COLUMNS) else " *(dnsprobe)*"
        lines.append(f"| {i} | `{name}` | {typ} | {meaning}{origin} |")
    return "\n".join(lines)


def config_table():
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key, f, _ in options():
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        default = "null" if default is None else default
        lines.append(f"| `{key}` | `{default}` | {f.metadata['help']} |")
    return "\n".join(lines)


def counters_table():
    lines = ["| counter | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in COUNTERS]
    return "\n".join(lines)


TABLES = {"schema": schema_table, "config": config_table, "counters": counters_table}


def block(name):
    """The README block for one table, between its markers."""
    begin = f"<!-- BEGIN {name} (generated: python -m probe.cli.docs --update README.md) -->"
    return f"{begin}\n{TABLES[name]()}\n<!-- END {name} -->"


def update(path):
    import re
    from pathlib import Path

    text = Path(path).read_text()
    for name in TABLES:
        pattern = re.compile(rf"<!-- BEGIN {name} .*?<!-- END {name} -->", re.S)
        text = pattern.sub(lambda _m, n=name: block(n), text)
    Path(path).write_text(text)


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        update(sys.argv[2])
    else:
        for table in TABLES:
            print(block(table) + "\n")
