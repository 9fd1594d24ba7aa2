"""docs/configuration.md against the configuration classes (hack/gen-config-docs.py): the page is what
the generator writes now, every key of every class it reaches is a row of its section, and a class
that gains a field gains a row without any edit to the generator."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import attrs
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "gen-config-docs.py"
PAGE = REPO / "docs" / "configuration.md"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_config_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_the_page_is_current() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr


def test_every_option_of_every_class_is_on_the_page(gen: ModuleType) -> None:
    page = PAGE.read_text()
    found = gen.sections()
    # the file, a resource, and every installed backend's options at least
    assert {
        "The file",
        "The file: resources[]",
        "Backend fake: options",
        "Backend pci: options",
        "Backend nvidia: options",
    } <= set(found)
    for title, keys in found.items():
        heading = f"\n## {title}\n"
        assert heading in page, f"no section {title!r}"
        section = page.split(heading, 1)[1].split("\n## ", 1)[0]
        for key in keys:
            assert f"\n| `{key}` |" in section, f"{title}: no row for {key!r}"
        assert "| type | default | example |" in section


@attrs.frozen
class Inner:
    size: int


@attrs.frozen
class Options:
    # how many there are
    count: int = 2
    inner: tuple[Inner, ...] = ()
    mode: str | None = attrs.field(default=None, metadata={"example": "fast"})


def test_a_new_field_gets_its_row(gen: ModuleType) -> None:
    walker = gen.Walker()
    walker.add(Options, "Backend new: options", "resources[].options")
    assert [title for title, _, _ in walker.order] == ["Backend new: options", "Backend new: options: inner[]"]
    rows = {row[0]: row for row in gen.rows(walker, Options)}
    assert rows["count"] == ("count", "integer", "`2`", "`count: 2`", "how many there are")
    assert rows["inner"][1] == "list of [Backend new: options: inner[]](#backend-new-options-inner)"
    assert rows["inner"][3] == '`inner: [{"size": 1}]`'
    assert rows["mode"][1:4] == ("string (optional)", "none", '`mode: "fast"`')
