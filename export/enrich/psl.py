"""registered_domain and public_suffix of the QNAME from the Public Suffix List: the snapshot bundled with the
publicsuffixlist package, or enrich.public_suffix_file.

The ICANN section of the list is used by default: public_suffix is then what a registry delegates (co.uk, com,
kawasaki.jp's wildcard children), and registered_domain the name a registrant holds there. The PRIVATE section
(enrich.public_suffix_private) adds the suffixes companies offer to their users (blogspot.com, github.io): a
different question, asked on purpose. A name with no rule (an unknown TLD) takes its last label as its suffix
(the list's '*' rule). Both are lower-cased; registered_domain is "" for a suffix itself, for the root and for a
name the list cannot take (an empty label); public_suffix is "" for the root. domainname keeps DNS Probe's
meaning (the last two labels).

The names of a batch go through the C extension export.enrich._psl in one pass, without a cache (QNAMEs repeat
far less than addresses, and a name costs a few probes of its rule table); it takes the rules as read_rules reads
them. The publicsuffixlist package is the reference and the Python twin (used when the extension was not built,
through a per-name cache); tests/export/test_psl.py compares the two.
"""

from publicsuffixlist import PSLFILE, PublicSuffixList, encode_idn

from export.lookup import LookupCache, text_array, text_buffers
from probe.errors import ConfigError
from probe.native import load, say_not_built

_psl = load("export.enrich._psl")

FILE_KEY = "enrich.public_suffix_file"
ICANN_BEGIN, ICANN_END = "// ===BEGIN ICANN DOMAINS===", "// ===END ICANN DOMAINS==="


def read_list(path=None):
    """The bytes of the list file (None: the package's snapshot); a ConfigError naming the key when it cannot be
    read or is not the list."""
    try:
        with open(PSLFILE if path is None else path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(f"config key '{FILE_KEY}': {path}: {exc.strerror}") from None
    # Its sections are marked (the ICANN-only choice needs the marks): a file without them is not the list.
    if ICANN_BEGIN.encode() not in data:
        raise ConfigError(f"config key '{FILE_KEY}': {path}: not a Public Suffix List (no ICANN DOMAINS section)")
    return data


def read_rules(data, private=False):
    """(rules, maxlabel) of the list's text as the publicsuffixlist package reads it (PublicSuffixList._parse):
    the first word of each line that is not a comment, lower-cased, also in its punycode form (IDNA) for an
    internationalised rule; the ICANN section only unless private; maxlabel: the most labels of a rule."""
    rules, maxlabel, icann = set(), 0, None
    marks = (ICANN_BEGIN.encode(), ICANN_END.encode())
    for line in data.splitlines():
        if line[:2] == b"//":  # a comment (its first word starts with //), or a section mark
            if not private and line.startswith(b"// ===") and (mark := _text(line).rstrip().encode()) in marks:
                icann = mark == marks[0]
            continue
        if not line or (not private and not icann):
            continue
        rule = _text(line).lower().split(" ")[0].rstrip()
        if rule == "":
            continue
        maxlabel = max(maxlabel, rule.count(".") + 1)
        rules.add(rule)
        bare = rule.lstrip("!")
        # The IDNA codec gives an ASCII name of labels of 1 to 63 characters back as it is: its call spared.
        if not (bare.isascii() and len(bare) < 64 and bare[:1] != "." and bare[-1:] != "." and ".." not in bare):
            encoded = encode_idn(bare)
            rules.add("!" + encoded if rule[0] == "!" else encoded)
    return rules, maxlabel


def _text(line):
    return line.decode("utf8", "surrogateescape")


def _rules_error(path, exc):
    return ConfigError(f"config key '{FILE_KEY}': {path or PSLFILE}: a rule that is not a name ({exc})")


class PublicSuffixes:
    """table → table with public_suffix and registered_domain filled."""

    def __init__(self, path=None, private=False, cache_size=200_000):
        self.path, self.private = path, private
        self.data = read_list(path)
        self._psl = None  # the package's reader: made for the twin (and the tests) only
        self.native = None
        if _psl is not None:
            try:
                self.native = _psl.SuffixRules(*read_rules(self.data, private))
            except UnicodeError as exc:
                raise _rules_error(path, exc) from None
        else:
            say_not_built("export.enrich._psl")
            self.psl  # noqa: B018 (a list the package refuses is a ConfigError now, not at the first batch)
        self.cache = None  # the twin's (made when it first runs)
        self.cache_size = cache_size

    @property
    def psl(self):
        """The publicsuffixlist package's reader of the same list."""
        if self._psl is None:
            try:
                self._psl = PublicSuffixList(self.data.splitlines(), only_icann=not self.private)
            except UnicodeError as exc:
                raise _rules_error(self.path, exc) from None
        return self._psl

    def suffixes(self, qname):
        """(public suffix, registered domain) of a QNAME as the qname column writes it: the reference."""
        psl = self.psl
        suffix = psl.publicsuffix(qname)
        if suffix is None:
            return "", ""
        return suffix, psl.privatesuffix(qname) or ""

    def columns(self, qnames):
        """(public_suffix, registered_domain) string Arrays of a qname column."""
        if self.native is None:
            return self.columns_python(qnames)
        length, offset, buffers = text_buffers(qnames)
        return [text_array(length, r) for r in self.native.columns(length, offset, buffers)]

    def columns_python(self, qnames):
        """The twin: the package, name by name, through a cache."""
        if self.cache is None:
            self.cache = LookupCache(self.suffixes, self.cache_size, width=2, python=True)
        return self.cache.columns_python(qnames, null="")

    def __call__(self, table):
        schema = table.schema
        for column, values in zip(("public_suffix", "registered_domain"), self.columns(table.column("qname"))):
            table = table.set_column(schema.get_field_index(column), column, values)
        return table
