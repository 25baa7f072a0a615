"""The Markdown pages read as one document each: one title, no section heading twice (a pasted
copy of a section is found here, not by a reader); and every page a file cites is in the
repository, every cited section of docs/method.md written, and the task recipe of
docs/architecture.md names every method a task writes."""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest

from bidswarm.envs import TASKS, TextEnv  # importing it sets library variables: before the guard
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


SOURCES = [
    path
    for folder in ("src", "tests", "scripts", "conf", "docs")
    for path in sorted((ROOT / folder).rglob("*"))
    if path.suffix in (".py", ".yaml", ".md", ".sh", ".txt") and path.is_file()
] + [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
"""Every text file of the repository that can cite a page (code, configs, tests, pages)."""

DOCS_PAGE = re.compile(r"(?<![\w/.-])docs/([\w-]+)\.md\b")
"""A cited page of docs/, e.g. ``docs/method.md`` (an absolute path is not a citation)."""
ROOT_PAGE = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_]*)\.md\b")
"""A cited page at the repository's root, named in capitals as README.md is."""
METHOD_SECTION = re.compile(r"docs/method\.md,?\s+sections?\s+(\d+)(?:\s*(?:-|and)\s*(\d+))?")
"""``docs/method.md section 4``, ``sections 3-5``, ``sections 3 and 7`` (across a line break)."""


def cited_pages(text: str) -> set[str]:
    """The Markdown pages ``text`` cites, as paths from the repository's root."""
    return {f"docs/{name}.md" for name in DOCS_PAGE.findall(text)} | {
        f"{name}.md" for name in ROOT_PAGE.findall(text)
    }


def test_cited_pages_are_read_from_code_and_prose():
    absent = "NOTES" + ".md"  # spelled in two parts: this file cites no such page
    text = f"see docs/method.md section 2, README.md and {absent}; not /tmp/docs/x.md or a.md"
    assert cited_pages(text) == {"docs/method.md", "README.md", absent}


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_page_a_file_cites_is_in_the_repository(source):
    missing = sorted(
        page for page in cited_pages(source.read_text()) if not (ROOT / page).is_file()
    )
    assert not missing, f"{source.relative_to(ROOT)} cites pages the repository lacks: {missing}"


def test_every_cited_section_of_the_method_page_exists():
    numbered = {
        int(heading.split()[1].rstrip("."))
        for heading in headings((ROOT / "docs" / "method.md").read_text())
        if re.match(r"## \d+\. ", heading)
    }
    cited = {}
    for source in SOURCES:
        for first, last in METHOD_SECTION.findall(source.read_text()):
            for section in range(int(first), int(last or first) + 1):
                cited.setdefault(section, str(source.relative_to(ROOT)))
    assert cited, "no file cites a section of docs/method.md"
    missing = {section: where for section, where in cited.items() if section not in numbered}
    assert not missing, f"sections of docs/method.md cited but not written: {missing}"


def section(page: Path, title: str) -> str:
    """The text of ``page``'s ``## <title>...`` section, up to the next ``##`` heading."""
    text = page.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_task_recipe_names_each_method_a_task_writes_and_each_file_it_cites():
    recipe = section(ROOT / "docs" / "architecture.md", "Adding a task")
    required = set(TextEnv.__abstractmethods__)
    overridden = {  # the optional ones: a registered task overrides the base's default
        name
        for name in vars(TextEnv)
        if not name.startswith("_") and name not in required and name != "Config"
        for task in TASKS.values()
        if any(name in vars(cls) for cls in task.__mro__[: task.__mro__.index(TextEnv)])
    }
    assert overridden, "no registered task overrides an optional method"
    unnamed = sorted(name for name in required | overridden if f"`{name}" not in recipe)
    assert not unnamed, f'docs/architecture.md "Adding a task" does not name {unnamed}'
    cited = re.findall(r"`((?:src|tests)/[\w/.-]+)`", recipe)
    assert cited and all((ROOT / path).exists() for path in cited), cited
