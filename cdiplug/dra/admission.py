"""Admission-time checks of the opaque configuration that names one of our DRA drivers.

The admission webhook (``cdiplug webhook``, :mod:`.webhook`) asks :func:`review` about each
ResourceClaim, ResourceClaimTemplate and DeviceClass created or changed. The answer comes from the
very decoders the prepare path uses (:mod:`.claim_config`): the same parameters classes, the same
merge of a request's entries (its classes' first, then the claim's), the same messages::

    unknown field "shairng" @ $.parameters (claim default/gpu-claim, request gpu)

so what the webhook refuses is exactly what a prepare would refuse, said the same way (a
template is named as ``ResourceClaimTemplate ns/name``, a class as ``DeviceClass name``). Entries
for other drivers, and objects without any of ours, are never looked at: they are allowed. The
prepare path keeps checking whatever the webhook let through (it may be down: ``failurePolicy:
Ignore``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from attrs import frozen
from lightkube.models.resource_v1 import DeviceClass

from cdiplug.backend import ClaimConfigurable
from cdiplug.dra.claim_config import decode, merge
from cdiplug.dra.claims import MAX_DEPTH, MAX_PARAMETERS, ClaimRef
from cdiplug.errors import InvalidRequest
from cdiplug.toolkit.brief import brief

KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass")


@frozen
class Driver:
    """One of our DRA drivers: the resource it serves and its backend's claim configuration
    (None: the backend takes none, and any entry naming the driver is refused)."""

    resource: str
    configurable: ClaimConfigurable[Any] | None


ClassReader = Callable[[str], Awaitable[DeviceClass]]
"""DeviceClass name -> the class as the API server has it (raises when it cannot be read)."""


@frozen
class _ConfigEntry:
    driver: str
    requests: tuple[str, ...]
    parameters: Mapping[str, Any]

    def applies_to(self, request: str) -> bool:
        return not self.requests or request in self.requests or request.partition("/")[0] in self.requests


def _depth(value: Any, depth: int = 1) -> int:
    if isinstance(value, Mapping):
        return max((_depth(v, depth + 1) for v in value.values()), default=depth)
    if isinstance(value, list):
        return max((_depth(v, depth + 1) for v in value), default=depth)
    return depth


def _entry(driver: str, requests: Sequence[Any], params: Any, at: str, where: str) -> _ConfigEntry:
    """One opaque entry naming one of our drivers; InvalidRequest when its parameters are no
    JSON object, too large or nested too deep."""
    if not isinstance(params, Mapping):
        raise InvalidRequest(f"must be an object, got {brief(params)} @ {at} {where}")
    size = len(json.dumps(params, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_PARAMETERS:
        raise InvalidRequest(f"is {size:,} bytes as JSON, more than {MAX_PARAMETERS:,} @ {at} {where}")
    if _depth(params) > MAX_DEPTH:
        raise InvalidRequest(f"nests deeper than {MAX_DEPTH} levels @ {at} {where}")
    return _ConfigEntry(driver, tuple(str(r) for r in requests), params)


def _entries(config: Any, path: str, drivers: Mapping[str, Driver], where: str) -> list[_ConfigEntry]:
    """The opaque entries of ``config`` (a ``config`` list as the object under review has it) that name one of ``drivers``."""
    out = []
    for i, entry in enumerate(config if isinstance(config, list) else ()):
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") not in drivers:
            continue
        at = f"$.{path}[{i}].opaque.parameters"
        out.append(_entry(opaque["driver"], entry.get("requests") or (), opaque.get("parameters"), at, where))
    return out


def _requests(devices: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(request name, its DeviceClass) for each request and first-available subrequest."""
    out: list[tuple[str, str | None]] = []
    for r in devices.get("requests") or ():
        if not isinstance(r, Mapping):
            continue
        name = str(r.get("name", ""))
        exactly = r.get("exactly")
        if isinstance(exactly, Mapping):
            out.append((name, exactly.get("deviceClassName")))
        for sub in r.get("firstAvailable") or ():
            if isinstance(sub, Mapping):
                out.append((f"{name}/{sub.get('name', '')}", sub.get("deviceClassName")))
    return out


def _configurable(drivers: Mapping[str, Driver], entry: _ConfigEntry, count: int, where: str) -> ClaimConfigurable[Any]:
    driver = drivers[entry.driver]
    if driver.configurable is None:
        raise InvalidRequest(
            f"the backend of resource {driver.resource} takes no claim configuration, yet "
            f"{count} entr{'y names' if count == 1 else 'ies name'} its driver {where}"
        )
    return driver.configurable


def _check(
    entries: Sequence[_ConfigEntry], drivers: Mapping[str, Driver], ref: ClaimRef, request: str, where: str, merged: bool
) -> None:
    """Each entry decoded on its own; with ``merged``, each driver's entries merged and checked
    across fields, as the prepare of a device serving ``request`` does."""
    for name in dict.fromkeys(e.driver for e in entries):
        mine = [e for e in entries if e.driver == name]
        configurable = _configurable(drivers, mine[0], len(mine), where)
        resource = drivers[name].resource
        config_type, kind = configurable.claim_config_type(resource), configurable.claim_config_kind(resource)
        for e in mine:
            decode(e.parameters, config_type, kind, ref, request, check_values=False, where=where)
        if merged:
            decode(merge([e.parameters for e in mine]), config_type, kind, ref, request, check_type=False, where=where)


async def _class_entries(name: str | None, drivers: Mapping[str, Driver], read_class: ClassReader | None) -> list[_ConfigEntry]:
    if not name or read_class is None:
        return []
    try:
        found = await read_class(name)
    except Exception:  # no such class (yet), or unreadable: the claim's own entries still count
        return []
    configs = (found.spec.config if found.spec is not None else None) or ()
    try:
        return [
            _entry(c.opaque.driver, (), c.opaque.parameters, f"$.spec.config[{i}].opaque.parameters", f"(DeviceClass {name})")
            for i, c in enumerate(configs)
            if c.opaque is not None and c.opaque.driver in drivers
        ]
    except InvalidRequest:
        return []  # the class's own fault, refused or reported where the class is


async def review(
    obj: Mapping[str, Any], kind: str, drivers: Mapping[str, Driver], read_class: ClassReader | None = None
) -> str | None:
    """Why ``obj`` (a ``kind`` of :data:`KINDS`) must be refused, or None when it may be admitted."""
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    name = str(meta.get("name") or meta.get("generateName", ""))
    ref = ClaimRef(namespace, name, str(meta.get("uid", "")))
    spec = obj.get("spec") or {}
    try:
        if kind == "DeviceClass":
            where = f"(DeviceClass {name})"
            entries = _entries(spec.get("config"), "spec.config", drivers, where)
            _check(entries, drivers, ref, "", where, merged=False)  # merged with a claim's at prepare
            return None
        if kind == "ResourceClaimTemplate":
            spec, path = spec.get("spec") or {}, "spec.spec.devices.config"
        else:
            path = "spec.devices.config"
        devices = spec.get("devices") or {}
        label = f"ResourceClaimTemplate {namespace}/{name}" if kind == "ResourceClaimTemplate" else f"claim {namespace}/{name}"
        entries = _entries(devices.get("config"), path, drivers, f"({label})")
        if not entries:
            return None
        requests = _requests(devices)
        served: set[int] = set()
        for request, class_name in requests:
            mine = [e for e in entries if e.applies_to(request)]
            served.update(i for i, e in enumerate(entries) if e.applies_to(request))
            if not mine:
                continue
            classes = [e for e in await _class_entries(class_name, drivers, read_class) if e.driver in {m.driver for m in mine}]
            _check([*classes, *mine], drivers, ref, request, f"({label}, request {request})", merged=True)
        for i, e in enumerate(entries):  # entries that name no request of the claim: on their own
            if i not in served:
                request = ", ".join(e.requests)
                _check([e], drivers, ref, request, f"({label}, request {request})", merged=False)
    except InvalidRequest as exc:
        return str(exc)
    return None
