"""What users and maintainers read speaks of the code, not of a tracker they do not have.

Code, comments, docs, scripts and manifests name no issue numbers ("issue #12", "(#17)") and no
"round N" of work.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("cdiplug", "backends", "tests", "hack", "deploy", "docs", "bench")
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".json", ".txt", ".cfg", ""}
TRACKER = re.compile(r"\b[Ii]ssues? #?[0-9]+|\(#[0-9]+\)|\b[Rr]ound [0-9]+\b")


def test_no_issue_numbers_or_rounds() -> None:
    files = [p for folder in FOLDERS for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    assert len(files) > 100, "the tree was not found"
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        if path != Path(__file__)
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert found == []
