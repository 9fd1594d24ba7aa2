"""Building a CDI spec from the device model: :func:`build_spec` for one kind and one snapshot.

The boundary: :mod:`.spec` holds the spec's types and JSON form, :mod:`.version` the lowest
version a spec needs, :mod:`.validate` the checks; this module turns our model into a spec and
refuses one a runtime would reject. It is the only one of them that knows :mod:`cdiplug.models.devices`.
"""

from __future__ import annotations

from typing import Any

import attrs

from cdiplug.cdi.spec import CdiContainerEdits, CdiDevice, CdiDeviceNode, CdiHook, CdiMount, CdiSpec, to_dict, to_json
from cdiplug.cdi.validate import check_document
from cdiplug.cdi.version import minimal_version
from cdiplug.errors import CdiError
from cdiplug.models import devices as model
from cdiplug.models.names import cdi_device_name, check_kind


def device_node(node: model.DeviceNode) -> CdiDeviceNode:
    host_path = node.host_path if node.host_path and node.host_path != node.path else None
    return CdiDeviceNode(
        path=node.path,
        host_path=host_path,
        type=node.type,
        major=node.major,
        minor=node.minor,
        file_mode=node.file_mode,
        permissions=node.permissions or None,
        uid=node.uid,
        gid=node.gid,
    )


def mount(m: model.Mount) -> CdiMount:
    options = list(m.options)
    # Without a type, runc needs "bind" to know this is a bind mount (as the CDI examples do).
    if m.type in (None, "bind") and "bind" not in options and "rbind" not in options:
        options.append("bind")
    if m.read_only and "ro" not in options:
        options.insert(0, "ro")
    return CdiMount(host_path=m.host_path, container_path=m.container_path, options=options, type=m.type)


def hook(h: model.Hook) -> CdiHook:
    return CdiHook(hook_name=h.hook_name, path=h.path, args=h.args, env=h.env, timeout=h.timeout)


def container_edits(edits: model.ContainerEdits) -> CdiContainerEdits:
    return CdiContainerEdits(
        env=[f"{k}={v}" for k, v in edits.env],
        device_nodes=[device_node(n) for n in edits.device_nodes],
        hooks=[hook(h) for h in edits.hooks],
        mounts=[mount(m) for m in edits.mounts],
        additional_gids=edits.additional_gids,
    )


def build_spec(kind: str, snapshot: model.DeviceSnapshot) -> CdiSpec:
    """The spec of one kind for every device of ``snapshot`` (see :func:`build_checked`)."""
    return build_checked(kind, snapshot)[0]


def render_spec(kind: str, snapshot: model.DeviceSnapshot) -> bytes:
    """The file's bytes for :func:`build_spec` (its JSON form made once, for the checks and the file)."""
    spec, data = build_checked(kind, snapshot)
    return to_json(spec, data)


def build_checked(kind: str, snapshot: model.DeviceSnapshot) -> tuple[CdiSpec, dict[str, Any]]:
    """The spec of one kind for every device of ``snapshot``, with the lowest version it needs.

    Raises CdiError when the kind is not a valid CDI kind, a device has no edits (the spec forbids
    it; a runtime would reject the whole file), two device IDs map to the same CDI name, or the
    result fails :mod:`cdiplug.cdi.validate` in any other way.
    """
    check_kind(kind)
    devices: list[CdiDevice] = []
    owners: dict[str, str] = {}
    for d in snapshot.devices:
        name = cdi_device_name(d.id)  # always a valid name; check_spec below checks it again
        if name in owners:
            raise CdiError(f"resource {snapshot.resource}: devices {owners[name]!r} and {d.id!r} both map to CDI name {name!r}")
        owners[name] = d.id
        edits = container_edits(d.edits)
        if edits.is_empty():
            raise CdiError(
                f"resource {snapshot.resource}: device {d.id!r} has no container edits; a CDI device needs at least one"
            )
        devices.append(CdiDevice(name=name, container_edits=edits))
    draft = CdiSpec(cdi_version="", kind=kind, devices=devices, container_edits=container_edits(snapshot.common_edits))
    spec = attrs.evolve(draft, cdi_version=minimal_version(draft))
    # Never hand out a spec a runtime would refuse (an env var without a name, a bad node type
    # from a backend): check it as strictly as `cdiplug cdi validate` would.
    data = to_dict(spec)
    problems = check_document(data, f"spec of {kind}", spec)
    if problems:
        raise CdiError(f"resource {snapshot.resource}: " + "; ".join(f"{p.message} @ {p.path}" for p in problems))
    return spec, data
