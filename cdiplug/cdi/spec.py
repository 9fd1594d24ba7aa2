"""The CDI spec as attrs classes and its JSON form.

The classes mirror the reference Go types (``specs-go``) field for field, in the same order, so
the JSON we write looks like what the reference library writes: keys spelled exactly as the spec
spells them (``cdiVersion``, ``containerEdits``, ``additionalGids``, ``hostInterfaceName``) and
empty fields left out. :func:`to_json`/:func:`from_json` are the only ways in and out.

Building a spec from our device model is :mod:`cdiplug.cdi.build`'s job; checking a spec file
that someone else wrote is :mod:`cdiplug.cdi.validate`'s; this module trusts its input types.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from attrs import NOTHING, field, fields, frozen

from cdiplug.errors import CdiError


def _pairs(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)


@frozen
class CdiDeviceNode:
    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None


@frozen
class CdiMount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    type: str | None = None


@frozen
class CdiHook:
    hook_name: str
    path: str
    args: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    env: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    timeout: int | None = None


@frozen
class CdiIntelRdt:
    clos_id: str | None = None
    l3_cache_schema: str | None = None
    mem_bw_schema: str | None = None
    schemata: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    enable_monitoring: bool = False


@frozen
class CdiNetDevice:
    """``netDevices`` items (CDI 1.1.0): move a host network interface into the container."""

    host_interface_name: str
    name: str


@frozen
class CdiContainerEdits:
    env: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    device_nodes: tuple[CdiDeviceNode, ...] = field(default=(), converter=tuple[CdiDeviceNode, ...])
    net_devices: tuple[CdiNetDevice, ...] = field(default=(), converter=tuple[CdiNetDevice, ...])
    hooks: tuple[CdiHook, ...] = field(default=(), converter=tuple[CdiHook, ...])
    mounts: tuple[CdiMount, ...] = field(default=(), converter=tuple[CdiMount, ...])
    intel_rdt: CdiIntelRdt | None = None
    additional_gids: tuple[int, ...] = field(default=(), converter=tuple[int, ...])

    def is_empty(self) -> bool:
        return self == _EMPTY_EDITS


_EMPTY_EDITS = CdiContainerEdits()


@frozen
class CdiDevice:
    name: str
    container_edits: CdiContainerEdits
    annotations: tuple[tuple[str, str], ...] = field(default=(), converter=_pairs, kw_only=True)


@frozen
class CdiSpec:
    cdi_version: str
    kind: str
    devices: tuple[CdiDevice, ...] = field(converter=tuple[CdiDevice, ...])
    container_edits: CdiContainerEdits = CdiContainerEdits()
    annotations: tuple[tuple[str, str], ...] = field(default=(), converter=_pairs, kw_only=True)

    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)


# JSON keys that are not plain camelCase of the attribute name.
_KEYS = {"cdi_version": "cdiVersion", "clos_id": "closID", "additional_gids": "additionalGids"}
# Order of keys in the JSON, as the reference library marshals them (Go struct field order).
_JSON_ORDER = {
    CdiSpec: ("cdi_version", "kind", "annotations", "devices", "container_edits"),
    CdiDevice: ("name", "annotations", "container_edits"),
}


def json_key(name: str) -> str:
    if name in _KEYS:
        return _KEYS[name]
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def json_keys(cls: type) -> dict[str, str]:
    """JSON key -> attribute name for one of the classes above."""
    return {json_key(a.name): a.name for a in fields(cls)}


def _make_converter() -> Any:
    """The cattrs converter that structures a spec's JSON (reading only: writing is :func:`to_dict`)."""
    import cattrs
    from cattrs.gen import make_dict_structure_fn, override

    conv = cattrs.Converter(forbid_extra_keys=True)
    for cls in (CdiDeviceNode, CdiMount, CdiHook, CdiIntelRdt, CdiNetDevice, CdiContainerEdits, CdiDevice, CdiSpec):
        renames = {
            a.name: override(rename=json_key(a.name), struct_hook=_structure_pairs if a.name == "annotations" else None)
            for a in fields(cls)
        }
        # cattrs takes the per-attribute overrides as **kwargs beside its own flags: mypy cannot tell them apart
        structure = make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True, **renames)  # type: ignore[arg-type]
        conv.register_structure_hook(cls, structure)
    return conv


def _structure_pairs(value: Any, _type: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError("annotations must map strings to strings")
    return _pairs(value)


_converter: Any = None


def _structurer() -> Any:
    """Built on first use: importing cattrs and generating its code costs start-up time."""
    global _converter
    if _converter is None:
        _converter = _make_converter()
    return _converter


# Per class: (attribute, JSON key, default, required) in the order the JSON has them.
_Plan = tuple[tuple[str, str, Any, bool], ...]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        by_name = {a.name: a for a in fields(cls)}
        order = _JSON_ORDER.get(cls, tuple(by_name))
        plan = _PLANS[cls] = tuple((n, json_key(n), by_name[n].default, by_name[n].default is NOTHING) for n in order)
    return plan


_CLASSES = frozenset((CdiDeviceNode, CdiMount, CdiHook, CdiIntelRdt, CdiNetDevice, CdiContainerEdits, CdiDevice, CdiSpec))


def _unstructure(obj: Any) -> dict[str, Any]:
    """One spec object as JSON: keys renamed and ordered, fields at their default left out (Go's omitempty)."""
    out: dict[str, Any] = {}
    for name, key, default, required in _plan(type(obj)):
        value = getattr(obj, name)
        if not required and value == default:
            continue
        if name == "annotations":
            out[key] = dict(value)
        elif type(value) is tuple:
            out[key] = [_unstructure(v) for v in value] if value and type(value[0]) in _CLASSES else list(value)
        elif type(value) in _CLASSES:
            out[key] = _unstructure(value)
        else:
            out[key] = value
    return out


def to_dict(spec: CdiSpec) -> dict[str, Any]:
    """The spec's JSON object (an empty spec-level ``containerEdits`` is left out, as Go does)."""
    return _unstructure(spec)


_BETWEEN_DEVICES = ', {"name": '


def to_json(spec: CdiSpec, data: Mapping[str, Any] | None = None) -> bytes:
    """The bytes cdiplug writes: a JSON object with a key per line, one device per line.

    Keys in the reference order, each value compact (the C encoder: indenting takes Python's
    own, several times slower), a final newline. ``data``: the spec's :func:`to_dict`, when the
    caller has it already.
    """
    data = to_dict(spec) if data is None else data
    parts = []
    for key, value in data.items():
        if key == "devices" and value:
            # One C-encoder call for every device, then a line per device: only a device object
            # starts with "name" (a net device's first key is hostInterfaceName), and a quote
            # inside a string is escaped, so the separator below occurs between devices only.
            body = json.dumps(value)[1:-1].replace(_BETWEEN_DEVICES, ',\n    {"name": ')
            parts.append(f'  "devices": [\n    {body}\n  ]')
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return ("{\n" + ",\n".join(parts) + "\n}\n").encode()


def from_dict(data: Mapping[str, Any]) -> CdiSpec:
    """Structure a spec's JSON; raises CdiError on unknown keys or wrong types (no name checks)."""
    converter = _structurer()
    import cattrs  # imported by _structurer already

    try:
        return converter.structure(dict(data), CdiSpec)  # type: ignore[no-any-return]
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        raise CdiError(f"not a CDI spec: {exc}") from exc


def from_json(text: str | bytes) -> CdiSpec:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CdiError(f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CdiError("a CDI spec must be a JSON object")
    return from_dict(data)
