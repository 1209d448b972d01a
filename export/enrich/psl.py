"""registered_domain and public_suffix of the QNAME from the Public Suffix List, through the publicsuffixlist
package (its bundled snapshot, or enrich.public_suffix_file).

The ICANN section of the list is used by default: public_suffix is then what a registry delegates (co.uk, com,
kawasaki.jp's wildcard children), and registered_domain the name a registrant holds there. The PRIVATE section
(enrich.public_suffix_private) adds the suffixes companies offer to their users (blogspot.com, github.io): a
different question, asked on purpose. A name with no rule (an unknown TLD) takes its last label as its suffix
(the list's '*' rule). Both are lower-cased; registered_domain is "" for a suffix itself, for the root and for a
name the list cannot take (an empty label); public_suffix is "" for the root. domainname keeps DNS Probe's
meaning (the last two labels).
"""

from publicsuffixlist import PublicSuffixList

from export.lookup import LookupCache, spread
from probe.errors import ConfigError

FILE_KEY = "enrich.public_suffix_file"


def load(path=None, private=False):
    only_icann = not private
    if path is None:
        return PublicSuffixList(only_icann=only_icann)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(f"config key '{FILE_KEY}': {path}: {exc.strerror}") from None
    # Its sections are marked (only_icann needs the marks): a file without them is not the list.
    if b"===BEGIN ICANN DOMAINS===" not in data:
        raise ConfigError(f"config key '{FILE_KEY}': {path}: not a Public Suffix List (no ICANN DOMAINS section)")
    psl = PublicSuffixList(data.splitlines(), only_icann=only_icann)
    return psl


class PublicSuffixes:
    """table → table with public_suffix and registered_domain filled."""

    def __init__(self, path=None, private=False, cache_size=200_000):
        self.psl = load(path, private)
        self.cache = LookupCache(self.suffixes, cache_size)

    def suffixes(self, qname):
        """(public suffix, registered domain) of a QNAME as the qname column writes it."""
        psl = self.psl
        suffix = psl.publicsuffix(qname)
        if suffix is None:
            return "", ""
        return suffix, psl.privatesuffix(qname) or ""

    def __call__(self, table):
        indices, results = self.cache.results(table.column("qname"))
        schema = table.schema
        for k, column in enumerate(("public_suffix", "registered_domain")):
            values = spread(indices, [r[k] for r in results], null="")
            table = table.set_column(schema.get_field_index(column), column, values)
        return table
