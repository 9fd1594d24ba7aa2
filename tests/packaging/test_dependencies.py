"""Every third-party package the code imports is declared in pyproject.toml.

The product (cdiplug and the backends, but cdiplug.testing) in ``dependencies``; the test kit
(cdiplug.testing, tests/, hack/, bench/) in ``dependencies`` or the ``test`` extra. A package that
is only there because another one pulls it in breaks when that one stops doing so.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OURS = {"cdiplug", "cdiplug_backends"}


def _name(requirement: str) -> str:
    """``lightkube>=1.0,<2`` -> ``lightkube``; names compared as PEP 503 normalises them."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {_name(r) for r in project["dependencies"]}, {_name(r) for r in project["optional-dependencies"]["test"]}


def _local_modules() -> set[str]:
    """Names of the checkout's own modules and folders (bench scripts, test helpers imported by path)."""
    mine = [p.relative_to(REPO) for folder in ("tests", "hack", "bench") for p in (REPO / folder).rglob("*")]
    return {p.stem for p in mine if p.suffix == ".py"} | {p.name for p in mine if (REPO / p).is_dir()}


def _imported(files: Iterable[Path]) -> dict[str, Path]:
    """Top-level module names of every absolute import, with one file importing each."""
    found: dict[str, Path] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path)
    return found


def _undeclared(files: list[Path], allowed: set[str]) -> list[str]:
    assert files, "no Python files found"
    distributions = importlib.metadata.packages_distributions()
    local = _local_modules()
    out = []
    for module, path in sorted(_imported(files).items()):
        if module in OURS or module in sys.stdlib_module_names or module in local or module == "__future__":
            continue
        names = {_name(d) for d in distributions.get(module, [])}
        assert names, f"{module} (imported by {path.relative_to(REPO)}) is installed by no distribution"
        if not names & allowed:
            out.append(f"{module} ({' or '.join(sorted(names))}), imported by {path.relative_to(REPO)}")
    return out


def _python_files(*folders: str) -> list[str]:
    return [str(p) for folder in folders for p in sorted((REPO / folder).rglob("*.py"))]


def test_the_product_imports_only_its_declared_dependencies() -> None:
    runtime, _ = _declared()
    files = [Path(p) for p in _python_files("cdiplug", "backends") if "/cdiplug/testing/" not in p]
    assert _undeclared(files, runtime) == []


def test_the_test_kit_imports_only_declared_dependencies() -> None:
    runtime, test = _declared()
    files = [Path(p) for p in _python_files("cdiplug/testing", "tests", "hack", "bench")]
    assert _undeclared(files, runtime | test) == []
