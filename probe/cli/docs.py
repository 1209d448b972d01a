"""Reference tables of the documentation, generated from the code's own declarative tables.

Each table sits in one page of docs/ (PAGES), between BEGIN/END markers. In the source tree:

    python -m probe.cli.docs            # print the tables
    python -m probe.cli.docs --update   # rewrite them in every page
    python -m probe.cli.docs --check    # name the pages whose tables are stale (exit status 1)

tests/cli/test_docs.py runs the check, so the documentation cannot drift from the schema, the options or
the counters.
"""

import re
import sys
from pathlib import Path

from export.parquet.schema import COLUMNS, DNSPROBE_COLUMNS
from probe.config import options
from probe.run.checks import FORMAT_NAMES
from probe.stats import COUNTERS

# The source tree (docs/ is not part of the installed package).
ROOT = Path(__file__).resolve().parents[2]


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
        only = f" *({FORMAT_NAMES[f.metadata['only']]} only)*" if f.metadata["only"] else ""
        lines.append(f"| `{key}` | `{default}` | {f.metadata['help']}{only} |")
    return "\n".join(lines)


def counters_table():
    lines = ["| counter | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in COUNTERS]
    return "\n".join(lines)


TABLES = {"schema": schema_table, "config": config_table, "counters": counters_table}
# page (relative to the source tree) → the tables it holds
PAGES = {
    "docs/configuration.md": ("config",),
    "docs/parquet.md": ("schema",),
    "docs/statistics.md": ("counters",),
}


def block(name):
    """One table as it stands in its page, between its markers."""
    begin = f"<!-- BEGIN {name} (generated: python -m probe.cli.docs --update) -->"
    return f"{begin}\n{TABLES[name]()}\n<!-- END {name} -->"


def regenerate(text, names, page):
    """The text of a page with its tables generated anew; a page without exactly one pair of markers for
    one of its tables is an error naming the page and the table."""
    for name in names:
        pattern = re.compile(rf"<!-- BEGIN {name} .*?<!-- END {name} -->", re.S)
        text, found = pattern.subn(lambda _m, n=name: block(n), text)
        if found != 1:
            raise ValueError(f"{page}: expected one pair of BEGIN/END markers for the {name} table, found {found}")
    return text


def stale_pages(root=ROOT):
    """The pages whose tables differ from what the code generates."""
    stale = []
    for page, names in PAGES.items():
        text = (Path(root) / page).read_text()
        if regenerate(text, names, page) != text:
            stale.append(page)
    return stale


def update(root=ROOT):
    """Rewrite the tables of every page; returns the pages that changed."""
    changed = []
    for page, names in PAGES.items():
        path = Path(root) / page
        text = path.read_text()
        new = regenerate(text, names, page)
        if new != text:
            path.write_text(new)
            changed.append(page)
    return changed


def main(argv):
    if argv == ["--update"]:
        for page in update():
            print(f"updated {page}")
        return 0
    if argv == ["--check"]:
        stale = stale_pages()
        for page in stale:
            print(f"{page}: generated tables are stale; run python -m probe.cli.docs --update", file=sys.stderr)
        return 1 if stale else 0
    if not argv:
        for name in TABLES:
            print(block(name) + "\n")
        return 0
    print("usage: python -m probe.cli.docs [--update | --check]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
