"""The Public Suffix List in C (export/enrich/_psl.c) against the publicsuffixlist package, its reference and
Python twin: every QNAME of the test captures, names made from every rule of the list (ICANN section and all of
it), an edge-case list, odd list files; the rules read as the package reads them."""

import pyarrow as pa
import pytest
from support.captures import bench_mix
from support.data import ROOT, SHARED_CAPTURES

from export.enrich.psl import PublicSuffixes, read_list, read_rules
from probe.errors import ConfigError
from probe.native import load

_psl = load("export.enrich._psl")
pytestmark = pytest.mark.skipif(_psl is None, reason="export.enrich._psl not built")


@pytest.fixture(scope="module")
def steps():
    return {False: PublicSuffixes(), True: PublicSuffixes(private=True)}


def check(step, names):
    """The C columns equal the package's answers, name by name (None: a null QNAME, "" both)."""
    got = list(zip(*(c.to_pylist() for c in step.columns(pa.array(names, pa.string())))))
    want = [("", "") if n is None else step.suffixes(n) for n in names]
    bad = [(n, g, w) for n, g, w in zip(names, got, want) if g != w]
    assert not bad, bad[:10]
    return got


def capture_qnames(path):
    from probe.capture.pcapfile import read_capture
    from probe.config import load_config
    from probe.decode.ipfilter import IpFilter
    from probe.decode.packets import PacketDecoder
    from probe.model import M
    from probe.stats import Stats

    cfg = load_config()
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats(), IpFilter(cfg.filter))
    names = {m[M.QNAME] for batch in read_capture(path, 4096) for m in decoder.decode(batch, str(path))}
    decoder.flush()
    return names


def test_every_qname_of_the_captures(steps):
    names = set()
    for path in SHARED_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz", bench_mix()]:
        if path.exists():
            names |= capture_qnames(path)
    names = sorted(names, key=lambda n: (n is None, n or ""))
    assert len(names) > 5000
    for step in steps.values():
        check(step, names + [n.upper() for n in names if n])


@pytest.mark.parametrize("private", [False, True])
def test_names_made_from_every_rule(steps, private):
    """Each rule, its wildcard's children, its exception's parent, above and below it, in both cases."""
    rules, maxlabel = read_rules(read_list(None), private)
    assert len(rules) > 7000 and maxlabel >= 4
    names = []
    for rule in sorted(rules):
        base = rule.lstrip("!").replace("*.", "")
        names += [rule, base, "x." + base, "a.b." + base, "X.Y." + base.upper(), base + ".", "*." + base,
                  "!" + base, "a.*." + base, "a.b.c.d.e.f.g.h." + base]
    check(steps[private], names)


EDGE_CASES = [
    None, "", ".", "..", "a.", ".a", "a..b", "A.B.", "com.", "com..", "x.com.", "COM", "www.Example.Co.Uk",
    # internationalised: Python's str.lower (not just ASCII), punycode, UTF-8 labels
    "İstanbul.com.tr", "www.ПРИМЕР.РФ", "пример.рф", "xn--p1ai", "a.xn--80ak6aa92e.com", "\u212aom", "x.\u212aom",
    "ǅ.xn--p1ai", "Straße.de", "ΣΊΣΥΦΟΣ.gr", "a\u3002com", "a.ｃｏｍ", "ab.公司.cn", "AB.公司.CN",
    # what the qname column holds besides names: escapes of bytes that are not UTF-8, odd characters
    "a\\xff.com", "a.b\\x00.uk", "a b.com", "a\nb.example.com", "a\tb.co.uk", "a*b.kawasaki.jp", "\x00.com",
    "*.kawasaki.jp", "x.*.kawasaki.jp", "!city.kawasaki.jp", "city.kawasaki.jp", "www.city.kawasaki.jp",
    "kawasaki.jp", "a.b.kawasaki.jp", "ck", "www.ck", "a.www.ck", "x.ck", "a.x.ck",
    # long: many labels, long labels, a name beyond 255 bytes as a broken message could give
    ".".join(["a"] * 200) + ".co.uk", "x" * 300 + ".com", ("y" * 63 + ".") * 8 + "jp",
]


def test_edge_cases(steps):
    for step in steps.values():
        check(step, EDGE_CASES)


def test_known_answers(steps):
    """A few answers spelt out (the package agrees with them: test_edge_cases)."""
    got = check(steps[False], ["WWW.Example.CO.UK", "www.city.kawasaki.jp", "x.y.kawasaki.jp", "a..b.com",
                               "İstanbul.com.tr", "foo.blogspot.com", "localhost", ""])
    assert got == [("co.uk", "example.co.uk"), ("kawasaki.jp", "city.kawasaki.jp"),
                   ("y.kawasaki.jp", "x.y.kawasaki.jp"), ("", ""), ("com.tr", "i̇stanbul.com.tr"),
                   ("com", "blogspot.com"), ("localhost", ""), ("", "")]
    assert check(steps[True], ["foo.blogspot.com"]) == [("blogspot.com", "foo.blogspot.com")]


def test_slices_chunks_and_nulls(steps):
    step = steps[False]
    names = pa.array(["a.example.com", None, "b.co.uk", "", "c.kawasaki.jp"] * 30, pa.string())
    for col in (names.slice(3), names.slice(1, 7), pa.chunked_array([names.slice(0, 4), names.slice(4)]),
                pa.nulls(3, pa.string())):
        got = step.columns(col)
        want = step.columns_python(col)
        assert all(a.equals(b) and a.null_count == 0 for a, b in zip(got, want))


ODD_LIST = (
    "// a list file with odd lines\r\n"
    "outside\r\n"  # before the ICANN section: private only
    "// ===BEGIN ICANN DOMAINS===\r\n"
    "com\n"
    "Example.COM  trailing words\n"
    "\tindented\n"
    "  spaced\n"
    "*.wild.test\n"
    "!keep.wild.test\n"
    "!lonely.test\n"
    "a.*.middle.test\n"
    "*\n"
    "公司.cn\n"
    "// ===END ICANN DOMAINS===\n"
    "private.test\n"
    "// ===BEGIN ICANN DOMAINS===  \n"
    "again.test\n"
    "// ===END ICANN DOMAINS===\n"
)
ODD_NAMES = ["x.com", "a.example.com", "b.indented", "\tindented", "x.\tindented", "b.spaced", "a.b.wild.test",
             "b.wild.test", "wild.test", "a.keep.wild.test", "a.lonely.test", "lonely.test", "test",
             "x.a.b.middle.test", "a.*.middle.test", "*", "x.*", "a.公司.cn", "a.xn--55qx5d.cn", "a.private.test",
             "a.again.test", "a.outside", "x.y.z"]


@pytest.mark.parametrize("private", [False, True])
def test_an_odd_list_file(tmp_path, private):
    path = tmp_path / "list.dat"
    path.write_bytes(ODD_LIST.encode())
    check(PublicSuffixes(path, private), ODD_NAMES + EDGE_CASES)


def test_bad_list_files_are_config_errors(tmp_path):
    for text, message in (("com\n", "no ICANN DOMAINS section"),
                          ("// ===BEGIN ICANN DOMAINS===\n" + "é" * 70 + ".com\n", "a rule that is not a name")):
        path = tmp_path / "bad.dat"
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"enrich.public_suffix_file.*{message}"):
            PublicSuffixes(path)
    with pytest.raises(ConfigError, match="enrich.public_suffix_file"):
        PublicSuffixes(tmp_path / "missing.dat")


def test_the_rules_are_the_packages():
    """read_rules gives the rule set and label count the package builds from the same text (its private fields,
    looked at here only)."""
    from publicsuffixlist import PublicSuffixList

    for data in (read_list(None), ODD_LIST.encode()):
        for private in (False, True):
            package = PublicSuffixList(data.splitlines(), only_icann=not private)
            assert read_rules(data, private) == (set(package._publicsuffix), package._maxlabel)
