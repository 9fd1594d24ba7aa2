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

import cattrs
from attrs import NOTHING, field, fields, frozen
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ..errors import CdiError


def _pairs(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)


@frozen
class DeviceNode:
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
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    type: str | None = None


@frozen
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    env: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    timeout: int | None = None


@frozen
class IntelRdt:
    clos_id: str | None = None
    l3_cache_schema: str | None = None
    mem_bw_schema: str | None = None
    schemata: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    enable_monitoring: bool = False


@frozen
class NetDevice:
    """``netDevices`` items (CDI 1.1.0): move a host network interface into the container."""

    host_interface_name: str
    name: str


@frozen
class ContainerEdits:
    env: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    device_nodes: tuple[DeviceNode, ...] = field(default=(), converter=tuple[DeviceNode, ...])
    net_devices: tuple[NetDevice, ...] = field(default=(), converter=tuple[NetDevice, ...])
    hooks: tuple[Hook, ...] = field(default=(), converter=tuple[Hook, ...])
    mounts: tuple[Mount, ...] = field(default=(), converter=tuple[Mount, ...])
    intel_rdt: IntelRdt | None = None
    additional_gids: tuple[int, ...] = field(default=(), converter=tuple[int, ...])

    def is_empty(self) -> bool:
        return self == _EMPTY_EDITS


_EMPTY_EDITS = ContainerEdits()


@frozen
class Device:
    name: str
    container_edits: ContainerEdits
    annotations: tuple[tuple[str, str], ...] = field(default=(), converter=_pairs, kw_only=True)


@frozen
class Spec:
    cdi_version: str
    kind: str
    devices: tuple[Device, ...] = field(converter=tuple[Device, ...])
    container_edits: ContainerEdits = ContainerEdits()
    annotations: tuple[tuple[str, str], ...] = field(default=(), converter=_pairs, kw_only=True)

    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)


# JSON keys that are not plain camelCase of the attribute name.
_KEYS = {"cdi_version": "cdiVersion", "clos_id": "closID", "additional_gids": "additionalGids"}
# Order of keys in the JSON, as the reference library marshals them (Go struct field order).
_JSON_ORDER = {
    Spec: ("cdi_version", "kind", "annotations", "devices", "container_edits"),
    Device: ("name", "annotations", "container_edits"),
}


def json_key(name: str) -> str:
    if name in _KEYS:
        return _KEYS[name]
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def json_keys(cls: type) -> dict[str, str]:
    """JSON key -> attribute name for one of the classes above."""
    return {json_key(a.name): a.name for a in fields(cls)}


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    for cls in (DeviceNode, Mount, Hook, IntelRdt, NetDevice, ContainerEdits, Device, Spec):
        overrides: dict[str, Any] = {}
        for a in fields(cls):
            # Fields with a default are omitted when empty (Go's omitempty); required ones never.
            required = a.default is NOTHING
            unstruct_hook = dict if a.name == "annotations" else None
            overrides[a.name] = override(rename=json_key(a.name), omit_if_default=not required, unstruct_hook=unstruct_hook)
        unstructure = make_dict_unstructure_fn(cls, conv, **overrides)
        order = _JSON_ORDER.get(cls)
        if order:
            keys = [json_key(n) for n in order]
            unstructure = _ordered(unstructure, keys)
        conv.register_unstructure_hook(cls, unstructure)
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


def _ordered(fn: Any, keys: list[str]) -> Any:
    def unstructure(obj: Any) -> dict[str, Any]:
        d = fn(obj)
        return {k: d[k] for k in keys if k in d}

    return unstructure


converter = _make_converter()


def to_dict(spec: Spec) -> dict[str, Any]:
    """The spec's JSON object (an empty spec-level ``containerEdits`` is left out, as Go does)."""
    out: dict[str, Any] = converter.unstructure(spec)
    return out


def to_json(spec: Spec) -> bytes:
    """The bytes cdiplug writes: 2-space indented JSON, keys in the reference order, a final newline."""
    return (json.dumps(to_dict(spec), indent=2) + "\n").encode()


def from_dict(data: Mapping[str, Any]) -> Spec:
    """Structure a spec's JSON; raises CdiError on unknown keys or wrong types (no name checks)."""
    try:
        return converter.structure(dict(data), Spec)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        raise CdiError(f"not a CDI spec: {exc}") from exc


def from_json(text: str | bytes) -> Spec:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CdiError(f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CdiError("a CDI spec must be a JSON object")
    return from_dict(data)
