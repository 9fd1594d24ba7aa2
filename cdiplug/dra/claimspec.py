"""The CDI spec of one prepared claim: ``cdiplug-claim-<claim uid>.json`` in the CDI folder.

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

The per-resource :class:`~cdiplug.cdi.writer.SpecWriter` leaves ``cdiplug-claim-*`` files alone;
the DRA front end removes those its checkpoint does not know (:func:`remove_stale`). Blocking
functions: call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from cdiplug.cdi.build import build_spec
from cdiplug.cdi.spec import to_json
from cdiplug.cdi.sweep import sweep
from cdiplug.errors import CdiError
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot, Mount
from cdiplug.toolkit.atomic import make_dirs, write_atomic
from cdiplug.toolkit.tally import CDI_WRITE_FAILURES

CLAIM_PREFIX = "cdiplug-claim-"
FILE_MODE = 0o644
DIR_MODE = 0o755
_UID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?")


def check_uid(uid: str) -> str:
    """A claim UID fit for file and device names (Kubernetes UIDs are UUIDs); CdiError otherwise."""
    if not _UID.fullmatch(uid):
        raise CdiError(f"claim UID {uid[:80]!r} is not a UUID-like name")
    return uid


def claim_kind(driver: str) -> str:
    return f"k8s.{driver}/claim"


def file_name(uid: str) -> str:
    return f"{CLAIM_PREFIX}{check_uid(uid)}.json"


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


def write(cdi_dir: Path, uid: str, content: bytes) -> Path:
    """Write the claim's spec atomically; CdiError on failure (no half-written file).

    Without fsync: the rename is atomic for the runtime, which reads it after our answer, and for
    a process that dies; a power loss is a reboot, after which the start-up restore writes every
    prepared claim's spec again from the checkpoint (:mod:`.restore`), so a durable spec would
    buy nothing and cost two fsyncs on every prepare where the CDI folder is on a disk.
    """
    path = Path(cdi_dir) / file_name(uid)
    try:
        make_dirs(Path(cdi_dir), DIR_MODE)
        write_atomic(path, content, FILE_MODE, durable=False)
    except OSError as exc:
        CDI_WRITE_FAILURES.add("claim")
        raise CdiError(f"cannot write CDI spec {path}: {exc.strerror or exc}") from exc
    return path


def remove(cdi_dir: Path, uid: str) -> bool:
    """Remove the claim's spec; False when it was not there."""
    path = Path(cdi_dir) / file_name(uid)
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CdiError(f"cannot remove CDI spec {path}: {exc.strerror}") from exc


def remove_stale(cdi_dir: Path, keep_uids: Iterable[str]) -> list[Path]:
    """Remove claim specs whose claim is not in ``keep_uids`` (a crash between write and checkpoint)."""
    keep = {f"{CLAIM_PREFIX}{u}.json" for u in keep_uids}
    return sweep(cdi_dir, lambda name: name.startswith(CLAIM_PREFIX) and name.endswith(".json") and name not in keep)


def exists(cdi_dir: Path, uid: str) -> bool:
    """Whether the claim's spec is there."""
    return (Path(cdi_dir) / file_name(uid)).exists()
