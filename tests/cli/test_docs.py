"""The README's reference tables are generated from the code; they must be current."""

from support import ROOT

from probe.cli.docs import TABLES, block


def test_readme_tables_are_current():
    text = (ROOT / "README.md").read_text()
    for name in TABLES:
        assert block(name) in text, f"README {name} table is stale: run python -m probe.cli.docs --update README.md"


def test_readme_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
