"""The CDI spec of one prepared claim: ``cdiplug-claim-<claim uid>.json`` in the CDI folder
(``cdiplug.<instance>.claim-<claim uid>.json`` for a named instance: :mod:`cdiplug.models.instance`).

Each claim gets a spec of its own holding exactly its devices and the claim-level env a
container of the claim needs (the backend's ``ids_env`` with the claim's device IDs:
``FAKE_FPGA_DEVICES``, ``PCI_RESOURCE_*``, ``NVIDIA_VISIBLE_DEVICES``), built with the same
builder and checks as the per-resource specs (:func:`cdiplug.cdi.build.build_spec`: lowest
``cdiVersion``, runtime-safe names) and written the same way (0644, atomic).

Names: kind ``k8s.<driver>/claim`` (``k8s.fpga.example.com/claim``), device
``<claim uid>-<device name>``: a qualified name such as
``k8s.fpga.example.com/claim=5f1c...-fpga-0`` that no per-resource spec of the device-plugin
front end can hold (their kinds are resource names; the configuration refuses a kind whose file
would start ``cdiplug-claim-``), so runtimes never see two definitions of one device.

The files go through the one owner of the CDI folder, the backend host's
:class:`~cdiplug.host.SpecKeepers`: written atomically, kept (a claim spec deleted or changed
while the claim is prepared is written again by the folder's watch, as a resource's is), and
removed, by this instance only. The DRA front end removes those its checkpoint does not know
(:func:`remove_stale`) and keeps those it does (:func:`adopt`) at start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from cdiplug.cdi.build import build_spec
from cdiplug.cdi.spec import to_json
from cdiplug.errors import CdiError
from cdiplug.host.specs import SpecKeepers
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot, Mount
from cdiplug.models.instance import Instance

_UID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?")


def check_uid(uid: str) -> str:
    """A claim UID fit for file and device names (Kubernetes UIDs are UUIDs); CdiError otherwise."""
    if not _UID.fullmatch(uid):
        raise CdiError(f"claim UID {uid[:80]!r} is not a UUID-like name")
    return uid


def claim_kind(driver: str) -> str:
    return f"k8s.{driver}/claim"


def file_name(names: Instance, uid: str) -> str:
    """The claim's spec file name, this instance's (the UID checked)."""
    return names.claim_spec(check_uid(uid))


def cdi_name(driver: str, uid: str, device: str) -> str:
    """The qualified CDI name of one device of a claim."""
    return f"{claim_kind(driver)}={uid}-{device}"


def render(
    driver: str,
    uid: str,
    snapshot: DeviceSnapshot,
    devices: Sequence[tuple[str, Device]],
    mounts: Mapping[str, Sequence[Mount]] | None = None,
) -> bytes:
    """The spec of a claim holding ``devices`` (slice name, prepared device) of ``snapshot``'s resource.

    ``mounts`` (slice name -> mounts) are added to those devices' edits: the device metadata
    files of the requests each serves (:mod:`.metadata`), so a container sees only its requests'.

    Raises CdiError when the spec cannot be built (a device without container edits, say).
    """
    check_uid(uid)
    common = snapshot.common_edits
    if snapshot.ids_env:
        ids = ",".join(dict.fromkeys(d.id for _, d in devices))
        common = common.merge(ContainerEdits(env={snapshot.ids_env: ids}))
    extra = mounts or {}
    renamed = [
        attrs.evolve(d, id=f"{uid}-{name}", edits=d.edits.merge(ContainerEdits(mounts=tuple(extra[name]))))
        if extra.get(name)
        else attrs.evolve(d, id=f"{uid}-{name}")
        for name, d in devices
    ]
    claim_snapshot = DeviceSnapshot(resource=snapshot.resource, devices=renamed, common_edits=common)
    return to_json(build_spec(claim_kind(driver), claim_snapshot))


async def write(specs: SpecKeepers, uid: str, content: bytes) -> None:
    """Write the claim's spec atomically and keep it so (the CDI folder's watch writes it again
    should it go while the claim is prepared); CdiError on failure (no half-written file).

    Without fsync: the rename is atomic for the runtime, which reads it after our answer, and for
    a process that dies; a power loss is a reboot, after which the start-up restore writes every
    prepared claim's spec again from the checkpoint (:mod:`.restore`), so a durable spec would
    buy nothing and cost two fsyncs on every prepare where the CDI folder is on a disk.
    """
    await specs.keep_file(file_name(specs.names, uid), content, durable=False)


async def remove(specs: SpecKeepers, uid: str) -> bool:
    """Stop keeping the claim's spec and remove it; False when it was not there."""
    return await specs.drop_file(file_name(specs.names, uid))


async def remove_stale(specs: SpecKeepers, keep_uids: Iterable[str]) -> list[Path]:
    """Remove this instance's claim specs whose claim is not in ``keep_uids`` (a crash between
    write and checkpoint); CdiError when one cannot be."""
    keep = {file_name(specs.names, u) for u in keep_uids}
    return await specs.remove_stale_files(lambda name: specs.names.is_claim_spec(name) and name not in keep)


async def adopt(specs: SpecKeepers, uids: Iterable[str]) -> int:
    """Keep the specs an earlier run wrote for these claims as they are on disk; how many were there."""
    return sum([await specs.adopt_file(file_name(specs.names, u)) for u in uids])


def exists(specs: SpecKeepers, uid: str) -> bool:
    """Whether the claim's spec is there."""
    return (specs.cdi_dir / file_name(specs.names, uid)).exists()
