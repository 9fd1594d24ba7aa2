"""JSON Patch (RFC 6902) and JSON merge patch (RFC 7386) on plain JSON values, as the API server applies them.

Only what the stand-ins need: ``add``, ``remove``, ``replace`` and ``test`` on objects; a path that
does not apply is a :class:`PatchError` (the API server answers 422).
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A patch that does not apply to the document."""


def _pointer(path: str) -> list[str]:
    if path and not path.startswith("/"):
        raise PatchError(f"JSON Patch path {path!r} does not start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def json_patch(obj: Any, ops: Any) -> Any:
    """``obj`` with the RFC 6902 ``ops`` applied (add, remove, replace, test); 422 when one does not apply."""
    if not isinstance(ops, list):
        raise PatchError("a JSON Patch is a list of operations")
    obj = copy.deepcopy(obj)
    for op in ops:
        *parents, last = _pointer(str(op.get("path", ""))) or [""]
        target: Any = obj
        for token in parents:
            target = target.get(token) if isinstance(target, dict) else None
        kind = op.get("op")
        if not isinstance(target, dict) or (kind in ("remove", "replace", "test") and last not in target):
            raise PatchError(f"jsonpatch {kind} operation does not apply: doc is missing path: {op.get('path')}")
        if kind in ("add", "replace"):
            target[last] = copy.deepcopy(op.get("value"))
        elif kind == "remove":
            del target[last]
        elif kind == "test":
            if target[last] != op.get("value"):
                raise PatchError(f"testing value {op.get('path')} failed")
        else:
            raise PatchError(f"unknown JSON Patch operation {kind!r}")
    return obj


def merge_patch(obj: Any, patch: Any) -> Any:
    """RFC 7386: mappings merge, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(obj) if isinstance(obj, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out
