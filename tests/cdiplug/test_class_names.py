"""One name, one class: no two classes of the cdiplug package share a name (generated protobuf
stubs aside), so that a name read in a traceback, a log line or a review means one thing. The CDI
wire model is the CDI layer's own (``CdiDevice``, ``CdiMount``, ...); the domain model keeps its
names (``Device``, ``Mount``, ...)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import cdiplug

PACKAGE = Path(cdiplug.__file__).parent


def classes() -> dict[str, list[str]]:
    """Class name -> where each class of that name is defined (``module.py:line``)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_no_two_classes_share_a_name() -> None:
    found = classes()
    assert len(found) > 100  # the walk sees the package
    shared = {name: where for name, where in found.items() if len(where) > 1}
    assert shared == {}


def test_the_cdi_wire_model_is_the_cdi_layer_s_own() -> None:
    found = classes()
    for name in ("Device", "DeviceNode", "Mount", "Hook", "ContainerEdits"):
        assert found[name] == [w for w in found[name] if w.startswith("cdiplug/models/")]
        assert found[f"Cdi{name}"][0].startswith("cdiplug/cdi/spec.py")
