"""Public resolvers: whether the client (src) is a resolver of Google Public DNS, Cloudflare, Quad9 or OpenDNS,
from prefix lists kept as data files (export/enrich/resolvers/NAME.txt; enrich.resolver_lists replaces the
directory). Fills public_resolver (the operator's name, else ""), and DNS Probe's is_google and is_opendns.

A list is one prefix (or address) per line, '#' starts a comment; a line `# name: Google` names the operator
(else the file's stem). Where the source of each list is and how to refresh them: docs/enrichment.md and
contrib/refresh-resolver-lists.py. The client is looked up, as ENTRADA does: on an authoritative server the
client of a query is the resolver that sent it.
"""

import bisect
import ipaddress
import sys
from pathlib import Path

import pyarrow.compute as pc

from export.enrich import lookup_address
from export.lookup import LookupCache
from probe.errors import ConfigError
from probe.native import load, say_not_built

_resolvers = load("export.enrich._resolvers")

BUNDLED = Path(__file__).resolve().parent / "resolvers"
KEY = "enrich.resolver_lists"


def read_list(path):
    """(operator name, [ip_network, ...]) of one list file; ValueError naming the line of a bad prefix."""
    name = path.stem
    networks = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text, _, comment = line.partition("#")
        if comment.strip().startswith("name:"):
            name = comment.strip()[5:].strip()
        text = text.strip()
        if text:
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise ValueError(f"{path}:{number}: {text!r} is not an address or prefix") from None
    return name, networks


class PrefixTable:
    """Address → operator name: the prefixes of one family as sorted, disjoint
    ranges (overlaps are merged, the first list read winning), searched with bisect."""

    def __init__(self, lists):
        self.tables = {}
        for version in (4, 6):
            ranges = sorted(
                (int(n.network_address), int(n.broadcast_address), name)
                for name, networks in lists for n in networks if n.version == version
            )
            starts, ends, names = [], [], []
            for start, end, name in ranges:
                if ends and start <= ends[-1]:
                    ends[-1] = max(ends[-1], end)  # overlapping prefixes: one range, the first one's name
                    continue
                starts.append(start)
                ends.append(end)
                names.append(name)
            self.tables[version] = (starts, ends, names)

    def name(self, text):
        address = lookup_address(text)
        if not address:
            return ""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return ""
        starts, ends, names = self.tables[ip.version]
        value = int(ip)
        i = bisect.bisect_right(starts, value) - 1
        return names[i] if i >= 0 and value <= ends[i] else ""

    def function(self):
        """name, or the same table in C (export/enrich/_resolvers.c, its twin being name) where it is built: what
        the client cache runs for a client it has not seen."""
        if _resolvers is None:
            say_not_built("export.enrich._resolvers")
            return self.name
        families = [[(s.to_bytes(size, "big"), e.to_bytes(size, "big"), name) for s, e, name in zip(*self.tables[v])]
                    for v, size in ((4, 4), (6, 16))]
        return _resolvers.PrefixTable(*families, self.name)


def load_lists(directory):
    """The lists of a directory (None: the bundled ones), in name order; ConfigError naming the key."""
    path = Path(directory) if directory else BUNDLED
    if not path.is_dir():
        raise ConfigError(f"config key '{KEY}': {path} is not a directory")
    files = sorted(path.glob("*.txt"))
    if not files:
        raise ConfigError(f"config key '{KEY}': no prefix lists (NAME.txt) in {path}")
    try:
        return [read_list(f) for f in files]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"config key '{KEY}': {exc}") from None


class PublicResolvers:
    """table → table with public_resolver, is_google and is_opendns filled."""

    def __init__(self, directory=None, cache_size=200_000):
        self.directory = directory
        self.stamp = self._stamp()
        self.table = PrefixTable(load_lists(directory))
        self.cache = LookupCache(self.table.function(), cache_size)

    def __call__(self, table):
        (names,) = self.cache.columns(table.column("src"), null="")
        schema = table.schema
        for column, value in (("public_resolver", names), ("is_google", pc.equal(names, "Google")),
                              ("is_opendns", pc.equal(names, "OpenDNS"))):
            table = table.set_column(schema.get_field_index(column), column, value)
        return table

    def _stamp(self):
        path = Path(self.directory) if self.directory else BUNDLED
        try:
            return sorted((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in path.glob("*.txt"))
        except OSError:
            return None

    def reload(self):
        """Read the lists again when a file of the directory changed, was added or removed."""
        stamp = self._stamp()
        if stamp == self.stamp:
            return
        try:
            table = PrefixTable(load_lists(self.directory))
        except ConfigError as exc:
            print(f"dnsprobe: {exc}; keeping the lists loaded before", file=sys.stderr)
            return
        self.table, self.stamp = table, stamp
        self.cache = LookupCache(table.function(), self.cache.size)


