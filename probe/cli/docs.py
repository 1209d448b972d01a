"""Reference tables of the documentation, generated from the code's own declarative tables.

Each table sits in one page of docs/ (PAGES), between BEGIN/END markers; so does the C form of the message
tuple's layout, in include/model.h (the C extensions index tuples by it). In the source tree:

    python -m probe.cli.docs            # print the tables
    python -m probe.cli.docs --update   # rewrite them in every page
    python -m probe.cli.docs --check    # name the pages whose tables are stale (exit status 1)

tests/cli/test_docs.py runs the check, so the documentation cannot drift from the schema, the options or
the counters, nor the C code from the message layout.
"""

import re
import sys
from pathlib import Path

from export.parquet.schema import COLUMNS, DNSPROBE_COLUMNS
from probe.config import options
from probe.model import DNS_FIELDS, EDNS_FIELDS, MESSAGE_FIELDS, NET_FIELDS
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


def c_enum(comment, prefix, names, counts):
    """A C enum of the indexes of names (prefix + NAME), then the counts (name -> value), in lines of 116."""
    items = [f"{prefix}{name.upper()} = {i}" for i, name in enumerate(names)]
    items += [f"{name} = {value}" for name, value in counts.items()]
    lines, line = [f"/* {comment} */", "enum {"], "   "
    for item in items:
        if len(line) + len(item) + 2 > 116:
            lines.append(line)
            line = "   "
        line += f" {item},"
    return "\n".join([*lines, line, "};"])


def message_layout():
    """probe.model's message tuple layout as C indexes (include/model.h)."""
    return "\n".join([
        c_enum("MESSAGE_FIELDS (NET_FIELDS, then DNS_FIELDS)", "M_", MESSAGE_FIELDS,
               {"N_NET_FIELDS": len(NET_FIELDS), "N_MESSAGE_FIELDS": len(MESSAGE_FIELDS)}),
        c_enum("DNS_FIELDS: the DNS tuple (probe.decode.dnswire.parse_message)", "D_", DNS_FIELDS,
               {"N_DNS_FIELDS": len(DNS_FIELDS)}),
        c_enum("EDNS_FIELDS: the edns field's tuple", "E_", EDNS_FIELDS, {"N_EDNS_FIELDS": len(EDNS_FIELDS)}),
    ])


TABLES = {"schema": schema_table, "config": config_table, "counters": counters_table, "layout": message_layout}
# page (relative to the source tree) → the tables it holds
PAGES = {
    "docs/configuration.md": ("config",),
    "docs/parquet.md": ("schema",),
    "docs/statistics.md": ("counters",),
    "include/model.h": ("layout",),
}
# a page's markers: a comment of its language
COMMENT = {".md": ("<!--", "-->"), ".h": ("/*", "*/")}


def block(name, page):
    """One table as it stands in its page, between its markers."""
    start, end = COMMENT[Path(page).suffix]
    begin = f"{start} BEGIN {name} (generated: python -m probe.cli.docs --update) {end}"
    return f"{begin}\n{TABLES[name]()}\n{start} END {name} {end}"


def regenerate(text, names, page):
    """The text of a page with its tables generated anew; a page without exactly one pair of markers for
    one of its tables is an error naming the page and the table."""
    start, end = (re.escape(s) for s in COMMENT[Path(page).suffix])
    for name in names:
        pattern = re.compile(rf"{start} BEGIN {name} .*?{start} END {name} {end}", re.S)
        text, found = pattern.subn(lambda _m, n=name: block(n, page), text)
        if found != 1:
            raise ValueError(f"{page}: expected one pair of BEGIN/END markers for the {name} table, found {found}")
    return text


def stale_pages(root=ROOT):
    """The pages whose tables differ from what the code generates."""
    return update(root, write=False)


def update(root=ROOT, write=True):
    """The pages whose tables differ from what the code generates, rewritten with the generated ones (write False:
    left as they are)."""
    changed = []
    for page, names in PAGES.items():
        path = Path(root) / page
        text = path.read_text()
        new = regenerate(text, names, page)
        if new != text:
            if write:
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
        for page, names in PAGES.items():
            for name in names:
                print(block(name, page) + "\n")
        return 0
    print("usage: python -m probe.cli.docs [--update | --check]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
