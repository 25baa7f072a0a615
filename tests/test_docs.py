"""The Markdown pages read as one document each: one title, no section heading twice (a pasted
copy of a section is found here, not by a reader)."""

from __future__ import annotations

import collections

import pytest

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def headings(text: str) -> list[str]:
    """The '#' and '##' headings outside fenced code blocks."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith(("# ", "## ")):
            found.append(line.strip())
    return found


def test_headings_skip_fenced_code():
    text = "# Title\n\n```bash\n# a comment\n```\n\n## Part\n"
    assert headings(text) == ["# Title", "## Part"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_a_page_has_one_title_and_no_section_twice(page):
    found = headings(page.read_text())
    titles = [heading for heading in found if heading.startswith("# ")]
    repeated = [heading for heading, count in collections.Counter(found).items() if count > 1]
    assert len(titles) == 1, f"{page.name}: titles {titles}"
    assert not repeated, f"{page.name}: sections written twice: {repeated}"
