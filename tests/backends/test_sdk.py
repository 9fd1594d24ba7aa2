"""The backend SDK as backends use it: they import cdiplug only through ``cdiplug.sdk`` (the
``only_through`` import contract, on a made-up graph and on the real one), and each shipped
backend subclasses the ability and options protocols it implements, so ``mypy --strict`` compares
its methods with them.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import grimp
import pytest

import cdiplug.sdk as sdk
from cdiplug_backends.fake import FakeOptions
from cdiplug_backends.fake.backend import FakeBackend
from cdiplug_backends.nvidia import NvidiaBackend, NvidiaOptions
from cdiplug_backends.pci import PciBackend, PciOptions

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {"source_modules": ["mine"], "target_package": "core", "allowed_modules": ["core.sdk"]}


def contracts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_contracts", ROOT / "hack" / "import_contracts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(graph: grimp.ImportGraph, options: dict[str, Any]) -> Any:
    contract = contracts().OnlyThroughContract(name="only", session_options={}, contract_options=options)
    return contract.check(graph, verbose=False)


def made_up_graph() -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for name in ("core", "core.sdk", "core.model", "core.sdk.extra", "mine", "mine.backend", "other"):
        graph.add_module(name)
    graph.add_import(importer="core.sdk", imported="core.model", line_number=1, line_contents="from .model import Device")
    graph.add_import(importer="mine.backend", imported="core.sdk", line_number=3, line_contents="from core.sdk import Device")
    graph.add_import(
        importer="mine.backend", imported="core.sdk.extra", line_number=4, line_contents="from core.sdk.extra import x"
    )
    graph.add_import(importer="mine.backend", imported="other", line_number=5, line_contents="import other")
    return graph


def test_imports_through_the_sdk_only_keep_the_contract() -> None:
    # the SDK importing the rest of the core is not the backend's import
    assert check(made_up_graph(), OPTIONS).kept


def test_a_direct_import_of_any_other_core_module_breaks_it() -> None:
    graph = made_up_graph()
    graph.add_import(importer="mine.backend", imported="core.model", line_number=7, line_contents="from core.model import Device")
    graph.add_import(importer="mine", imported="core", line_number=2, line_contents="import core")
    result = check(graph, OPTIONS)
    assert not result.kept
    assert result.metadata["broken"] == [
        {"importer": "mine", "imported": "core", "lines": [2]},
        {"importer": "mine.backend", "imported": "core.model", "lines": [7]},
    ]


def test_a_module_the_contract_names_must_exist() -> None:
    with pytest.raises(ValueError, match="Module 'core.nope' does not exist"):
        check(made_up_graph(), {**OPTIONS, "allowed_modules": ["core.nope"]})


def test_the_shipped_backends_import_cdiplug_only_through_the_sdk() -> None:
    graph = grimp.build_graph("cdiplug", "cdiplug_backends", cache_dir=None)
    options = {"source_modules": ["cdiplug_backends"], "target_package": "cdiplug", "allowed_modules": ["cdiplug.sdk"]}
    result = check(graph, options)
    assert result.kept, result.metadata["broken"]
    assert graph.find_modules_directly_imported_by("cdiplug_backends.pci.backend") & {"cdiplug.sdk"}


def test_everything_the_sdk_names_is_there() -> None:
    assert len(set(sdk.__all__)) == len(sdk.__all__)
    assert all(hasattr(sdk, name) for name in sdk.__all__)
    assert {"Backend", "BackendPlugin", "SnapshotSink", "Unpreparer", "ReleasePoller", "CheckedOptions"} <= set(sdk.__all__)


@pytest.mark.parametrize(
    ("cls", "abilities"),
    [
        (FakeBackend, {sdk.Backend}),
        (PciBackend, {sdk.Backend, sdk.Preparer, sdk.Unpreparer, sdk.ReleasePoller}),
        (NvidiaBackend, {sdk.Backend, sdk.PreferredAllocator, sdk.PairwiseAffinity}),
    ],
)
def test_each_backend_subclasses_exactly_the_abilities_it_has(cls: type, abilities: set[type]) -> None:
    every = {sdk.Backend, sdk.Preparer, sdk.Unpreparer, sdk.ReleasePoller, sdk.PreferredAllocator, sdk.PairwiseAffinity}
    # declared (in the MRO, so mypy checks the methods), not merely matching by name
    assert {p for p in every if p in cls.__mro__} == abilities
    assert {p for p in every if all(callable(getattr(cls, m, None)) for m in _members(p))} == abilities


def _members(protocol: type) -> list[str]:
    return [m for m in vars(protocol) if not m.startswith("_")]


@pytest.mark.parametrize(
    ("cls", "protocols"),
    [
        (FakeOptions, {sdk.CheckedOptions, sdk.SizedOptions}),
        (PciOptions, {sdk.CheckedOptions}),
        (NvidiaOptions, {sdk.CheckedOptions}),
    ],
)
def test_each_options_class_subclasses_the_options_protocols_it_implements(cls: type, protocols: set[type]) -> None:
    both = {sdk.CheckedOptions, sdk.SizedOptions}
    assert {p for p in both if p in cls.__mro__} == protocols
    assert {p for p in both if all(callable(getattr(cls, m, None)) for m in _members(p))} == protocols


def test_the_backend_guide_names_exactly_the_sdk() -> None:
    text = (ROOT / "docs" / "writing-a-backend.md").read_text()
    block = text[text.index("**The SDK.**") : text.index("**Abilities**")]
    listed = re.findall(r"`([A-Za-z_]+)`", "\n".join(line for line in block.splitlines() if line.startswith(("- ", "  "))))
    assert sorted(listed) == sorted(sdk.__all__)
