"""The README, docs/ and bench/README.md: every link inside the repository resolves, every page says what it is for,
and no page speaks of the project's tracker or of a test kit outside the repository (the
developers' page describes the kit as something a developer brings, by its variable)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "bench" / "README.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HISTORY = re.compile(r"closing note|\bissue \d+|\bissues? #\d+|\bround \d\b|#\d{2}\b", re.IGNORECASE)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def test_there_are_pages() -> None:
    assert len(PAGES) >= 10, _ids(PAGES)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for line in page.read_text().splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_link_inside_the_repository_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_no_page_speaks_of_the_tracker_or_the_kit_outside(page: Path) -> None:
    text = page.read_text()
    assert HISTORY.findall(text) == []
    assert "../shared" not in text


@pytest.mark.parametrize(
    "page", [p for p in PAGES if p.parent.name == "docs"], ids=_ids([p for p in PAGES if p.parent.name == "docs"])
)
def test_every_page_opens_with_what_it_is_for(page: Path) -> None:
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ")
    opening = " ".join(lines[1:8])
    assert re.search(r"\bThis page\b|\bis for\b", opening), f"{page.name} does not say what it is for"


def test_the_readme_is_a_front_page() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 250
