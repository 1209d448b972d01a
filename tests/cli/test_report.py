"""`dnsprobe report` on the bundled sample as `dnsprobe read` writes it (a hive data set of two days and two
servers, C-DNS, Parquet with anonymised clients): the page asks nothing of the network, Debian's Chromium renders
it headless with every plot and no console message, its figures are `inspect --summary`'s, --from/--to and
--server choose hive partitions, anonymised clients stay anonymised, and mistakes are one line."""

import html.parser
import json
import lzma
import re
import shutil
import subprocess

import pytest
from support.data import ROOT
from support.dnsprobe import run_dnsprobe

from probe.cli.report_html import FIGURES_ID, PLOT_TITLES

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"
SAMPLE_RECORDS = 9_473
DAY_US = 86_400 * 1_000_000
CHROMIUM = shutil.which("chromium")  # Debian's package (contrib/install-deps.sh installs it)


def read(out, pcap, *extra):
    out.mkdir(exist_ok=True)
    run_dnsprobe("read", pcap, "-o", out, "-q", "--no-progress", *extra)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A hive data set: the sample on 2024-05-01 for servers probe1 and probe2, and moved a day later (editcap)
    for probe1; the sample as C-DNS; the sample as Parquet with cryptopANT-anonymised clients."""
    top = tmp_path_factory.mktemp("report")
    pcap, later = top / "sample.pcap", top / "later.pcap"
    pcap.write_bytes(lzma.decompress(SAMPLE.read_bytes()))
    subprocess.run(["editcap", "-t", str(DAY_US // 1_000_000), pcap, later], check=True, capture_output=True)
    hive = top / "hive"
    for source, server in ((pcap, "probe1"), (later, "probe1"), (pcap, "probe2")):
        read(hive, source, "--set", "export.layout=hive", "--set", f"export.server_name={server}")
    run_dnsprobe("keygen", top / "key")
    return {"hive": hive, "cdns": read(top / "cdns", pcap, "--format", "cdns"),
            "anonymised": read(top / "anonymised", pcap, "--anonymize-key", top / "key")}


def report(out, *args, check=True):
    proc = run_dnsprobe("report", *args, "-o", out, check=check)
    return proc, out.read_text() if check else None


def summary(*paths):
    return json.loads(run_dnsprobe("inspect", "--summary", *paths, "--json", "--limit", 20).stdout)


class Page(html.parser.HTMLParser):
    """What a page holds: its SVG elements' titles, the (header, value) rows of its tables, its text (SVG's
    too), and every attribute that could load something (src, href, a style's url(...), @import)."""

    def __init__(self, text):
        super().__init__()
        self.svg_titles, self.rows, self.text, self.loads = [], {}, [], []
        self.stack, self.header = [], None
        self.feed(text)
        self.loads += re.findall(r"url\(\s*['\"]?(?!#)[^)]*\)|@import[^;]*", text)

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)
        self.loads += [f"{tag} {k}={v}" for k, v in attrs if k in ("src", "href", "xlink:href", "srcset", "data",
                                                                   "action", "poster") and not v.startswith("#")]
        self.loads += [f"<{tag}>" for t in ("script", "link", "iframe", "object", "embed", "img") if tag == t]

    def handle_endtag(self, tag):
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self.stack[-2:] == ["svg", "title"]:
            self.svg_titles.append(data)
        elif self.stack[-1:] == ["th"]:
            self.header = data
        elif self.stack[-1:] == ["td"] and self.header is not None:
            self.rows[self.header], self.header = data, None


def chromium(page_path, out, height):
    """Chromium's screenshot of the page (1000 × height) and the console messages it logged."""
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size=1000,{height}", f"--screenshot={out}", "--enable-logging=stderr",
                           "--log-level=0", "--v=0", page_path.as_uri()], capture_output=True, text=True, timeout=60)
    assert out.is_file(), proc.stderr
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                                             "(contrib/install-deps.sh installs it)")


@needs_chromium
def test_console_messages_are_seen(tmp_path):
    """The way console messages are found finds them (else the test below could not fail on one)."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>console.error('seen'); notAFunction();</script>")
    messages = chromium(page, tmp_path / "bad.png", 200)
    assert any("seen" in m for m in messages) and any("Uncaught ReferenceError" in m for m in messages)


@pytest.fixture(scope="module")
def full(data, tmp_path_factory):
    """The report of the hive data set and the C-DNS file: (its path, its stdout, its text)."""
    out = tmp_path_factory.mktemp("full") / "report.html"
    proc, text = report(out, data["hive"], data["cdns"])
    return out, proc.stdout, text


@needs_chromium
def test_the_page_shows_every_plot_and_loads_nothing(data, full, tmp_path):
    from PIL import Image

    out, stdout, text = full
    assert stdout == f"{out}: {4 * SAMPLE_RECORDS:,} records of 4 files: {data['hive']} {data['cdns']}\n"
    page = Page(text)
    assert page.loads == []
    assert page.svg_titles == list(PLOT_TITLES) and text.count("<svg") == len(PLOT_TITLES)
    assert "no records for this plot" not in text  # each plot has something to draw
    messages = chromium(out, tmp_path / "report.png", 12_000)
    assert messages == []
    shot = Image.open(tmp_path / "report.png").convert("RGB")
    assert shot.size == (1000, 12_000)
    # The whole page is in the screenshot (white below it), and its plots are drawn: rows of it not white, and
    # matplotlib's first colour (the bars, the first RCODE) among its pixels.
    rows = [shot.crop((0, y, 1000, y + 1)).getextrema() for y in range(0, 12_000, 4)]
    drawn = [i for i, extrema in enumerate(rows) if any(low < 250 for low, _ in extrema)]
    assert drawn and drawn[-1] < len(rows) - 50
    assert len(drawn) * 4 > len(PLOT_TITLES) * 250
    assert (0x1F, 0x77, 0xB4) in {c for _, c in shot.getcolors(1 << 20)}


def test_the_figures_are_the_summarys(data, full):
    """The figures the report and `inspect --summary` both show are the same: one aggregation (the report's top
    lists are as long as `--limit 20`'s, its default)."""
    s = summary(data["hive"], data["cdns"])
    page = Page(full[2])
    tx = s["transactions"]
    assert page.rows["records"] == f"{s['records']:,}" and page.rows["files"] == f"{s['files']:,}"
    assert page.rows["matched"].startswith(f"{tx['matched']:,} (")
    assert page.rows["query only (unanswered)"].startswith(f"{tx['query_only']:,} (")
    assert page.rows["time span"].startswith(f"{s['time']['first']} to {s['time']['last']}")
    assert page.rows["server"] == "probe1 (2 of 4 files); (empty) (1 of 4 files); probe2 (1 of 4 files)"
    assert page.rows["client_anonymised"] == "false"
    text = set(page.text)
    for key, column in (("qnames", "qname"), ("clients", "src")):
        assert {r[column] for r in s[key]["top"]} <= text
    # The figures the page plots, as the JSON it holds (hidden): the summary's, and the report's own besides.
    figures = json.loads(html.unescape(re.search(f'<pre id="{FIGURES_ID}" hidden>(.*?)</pre>', full[2], re.S)[1]))
    assert {key: figures[key] for key in s} == s
    assert {"timeline", "delay_by_transport", "edns", "tc"} <= figures.keys()


def test_partition_filters(data, tmp_path):
    """--server and --from/--to choose hive partitions (stdout: how many files), and the records of the span."""
    out = tmp_path / "r.html"
    # One partition, and within it the records of its first 100 ms.
    proc, text = report(out, data["hive"], "--server", "probe1", "--from", "2024-05-02", "--to",
                        "2024-05-02T12:00:00.100000")
    stdout = re.fullmatch(rf"{re.escape(str(out))}: ([\d,]+) records of 1 file: {re.escape(str(data['hive']))}\n",
                          proc.stdout)
    records = int(stdout[1].replace(",", ""))
    assert 0 < records < SAMPLE_RECORDS
    assert Page(text).rows["time span"].startswith("2024-05-02T12:00:00.")
    proc, text = report(out, data["hive"], "--to", "2024-05-02T00:00Z")
    assert proc.stdout == f"{out}: {2 * SAMPLE_RECORDS:,} records of 2 files: {data['hive']}\n"
    assert Page(text).rows["server"] == "probe1 (1 of 2 files); probe2 (1 of 2 files)"


def test_anonymised_clients_stay_anonymised(data, tmp_path):
    anonymised, clear = summary(data["anonymised"]), summary(data["cdns"])
    page = Page(report(tmp_path / "r.html", data["anonymised"])[1])
    shown = {r["src"] for r in anonymised["clients"]["top"]}
    assert shown <= set(page.text)
    assert not {r["src"] for r in clear["clients"]["top"]} & set(page.text)
    assert page.rows["client_anonymised"] == "true" and page.rows["client_privacy"].startswith("cryptopANT")


@pytest.mark.parametrize("args, status, message", [
    (["--server", "prob1"], 2, "no partition server=prob1 (did you mean 'probe1'?); the servers there: probe1, "
                                "probe2; see dnsprobe report --help"),
    (["--from", "2025-01-01"], 2, "no partition of the data set is in the time span of --from/--to; see dnsprobe "
                                  "report --help"),
    (["--from", "yesterday"], 2, "argument --from: 'yesterday' is not a date (2024-05-01) nor a date and time "
                                 "(2024-05-01T12:30:05) in UTC; see dnsprobe report --help"),
    (["--from", "2024-05-02", "--to", "2024-05-01"], 2, "--from must be before --to; see dnsprobe report --help"),
    (["--limit", "-1"], 2, "--limit must be 0 or more; see dnsprobe report --help"),
])
def test_usage_errors_are_one_line(data, tmp_path, args, status, message):
    proc = run_dnsprobe("report", data["hive"], *args, "-o", tmp_path / "r.html", check=False)
    assert (proc.returncode, proc.stderr, proc.stdout) == (status, f"dnsprobe: error: {message}\n", "")
    assert not (tmp_path / "r.html").exists()


def test_bad_inputs_are_one_line(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_text("junk")
    for path, status, message in ((tmp_path / "none", 2, f"{tmp_path / 'none'}: no such file; see dnsprobe report "
                                                         "--help"),
                                  (junk, 1, f"{junk}: neither a Parquet file nor a C-DNS file (it starts with bytes "
                                            "6a756e6b)")):
        proc = run_dnsprobe("report", path, "-o", tmp_path / "r.html", check=False)
        assert (proc.returncode, proc.stderr) == (status, f"dnsprobe: error: {message}\n")
    proc = run_dnsprobe("report", junk, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("dnsprobe: error: the following arguments are required: "
                                                          "-o/--output")
