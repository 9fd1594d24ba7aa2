"""The package's shape as a new engineer meets it: layers that are folders, a short top level, and
a package that explains itself from inside the repository."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "cdiplug"


def layers() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [name.strip() for layer in contract["layers"] for name in layer.split("|")]


def test_the_top_of_the_package_holds_at_most_twelve_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 12, modules


def test_every_layer_is_a_folder_or_a_top_level_module_and_every_part_of_the_package_has_a_layer() -> None:
    named = layers()
    for name in named:
        parts = name.split(".")
        assert len(parts) == 2 and parts[0] == "cdiplug", f"{name}: a layer is a folder or a module at the top of cdiplug"
        assert (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file(), f"{name} does not exist"
    present = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert present - {n.split(".")[1] for n in named} == set(), "every folder and module of cdiplug sits in a layer"


def test_nothing_in_the_package_cites_a_file_outside_the_repository() -> None:
    outside = re.compile(r"DESIGN\.md|\.\./shared|/work/")
    cited = [
        f"{p.relative_to(REPO)}:{n}"
        for p in PACKAGE.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert cited == []
    assert (REPO / "docs" / "architecture.md").is_file()  # what the code cites instead
    for p in PACKAGE.rglob("*.py"):
        for doc in re.findall(r"docs/[\w./-]+\.md", p.read_text()):
            assert (REPO / doc).is_file(), f"{p.relative_to(REPO)} cites {doc}, which is not in the repository"
