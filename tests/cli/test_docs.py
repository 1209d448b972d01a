"""The documentation: generated reference tables current in every page, relative links that lead somewhere,
a short README that shows the two set-up commands and links every page of docs/."""

import re
import shutil

import pytest
from support.data import ROOT

from probe.cli.docs import PAGES, TABLES, block, stale_pages, update

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250


def test_generated_tables_are_current():
    assert not stale_pages(ROOT), "run: python -m probe.cli.docs --update"
    assert sorted(name for names in PAGES.values() for name in names) == sorted(TABLES), "a table without a page"
    for page, names in PAGES.items():
        text = (ROOT / page).read_text()
        for name in names:
            assert block(name) in text


def test_update_rewrites_a_stale_table(tmp_path):
    for page in PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    page = "docs/configuration.md"
    good = (tmp_path / page).read_text()
    (tmp_path / page).write_text(good.replace("| `match.query_timeout` | `5.0` |", "| `match.query_timeout` | `7` |"))
    assert stale_pages(tmp_path) == [page]
    assert update(tmp_path) == [page]
    assert (tmp_path / page).read_text() == good
    assert stale_pages(tmp_path) == []


def test_a_page_without_its_markers_is_an_error(tmp_path):
    for page in PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    (tmp_path / "docs/statistics.md").write_text("# Statistics\n\nno table here\n")
    with pytest.raises(ValueError, match="docs/statistics.md.*counters"):
        stale_pages(tmp_path)


# -- links ------------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose(text):
    """The text without code blocks and code spans, where a [x](y) is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text):
    body = prose(text)
    return LINK.findall(body) + REFERENCE.findall(body)


def slug(heading):
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, out = {}, set(HTML_ANCHOR.findall(path.read_text()))
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(doc):
    broken = []
    for target in links(doc.read_text()):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:, file:: not checked here
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(doc):
    broken = broken_links(doc)
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_checker_finds_broken_links(tmp_path):
    (tmp_path / "b.md").write_text("# A title, with `code`\n\n## Same\n\n## Same\n")
    doc = tmp_path / "a.md"
    doc.write_text(
        "[ok](b.md) [ok](b.md#a-title-with-code) [ok](b.md#same-1) [ok](#here) [web](https://example.org/x)\n"
        "# Here\n`[not a link](nowhere.md)`\n```\n[not a link](nowhere.md)\n```\n"
        "[bad](missing.md) [bad](b.md#nothing) [bad](#nowhere)\n[ref]: gone/file.md\n"
    )
    assert [b.split(":")[0] for b in broken_links(doc)] == ["missing.md", "b.md#nothing", "#nowhere", "gone/file.md"]


# -- the README ---------------------------------------------------------------------------------------------


def test_readme_is_short_and_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert len(text.splitlines()) <= README_MAX_LINES, "the README is an overview; details belong in docs/"


def test_readme_links_every_page_of_docs():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links((ROOT / "README.md").read_text())}
    unlinked = [p.name for p in DOC_FILES[1:] if p.resolve() not in linked]
    assert not unlinked, f"pages of docs/ the README does not link: {unlinked}"
