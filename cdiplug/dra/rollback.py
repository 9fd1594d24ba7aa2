"""Undoing a claim: removing its spec, releasing its devices, forgetting it; and the start-up rollback.

:func:`undo` is what an unprepare does and what a failed or crashed preparation needs: the claim's
CDI spec removed first (no new container can use it), then its devices released through the host
(a device another claim still holds, or one the claim never prepared, stays as it is), then the
record dropped. :func:`roll_back_started` runs once at start, before any driver serves: every
claim left ``PrepareStarted`` by an earlier run is undone, unless the instance that started it
still runs (a rolling update, :mod:`.instances`). :class:`Step` names the steps of a prepare and
an unprepare, where the test hook (``CDIPLUG_DRA_PAUSE_AFTER``) can stop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdiplug.dra import claimspec, metadata
from cdiplug.dra.checkpoint import ClaimStore, PreparedClaim
from cdiplug.errors import InvalidRequest
from cdiplug.host import BackendHost
from cdiplug.models.devices import Device

log = logging.getLogger(__name__)


class Step(str, enum.Enum):
    """The steps of a prepare and an unprepare, where the test hook can stop."""

    STARTED = "started"  # PrepareStarted checkpointed
    PREPARED = "prepared"  # the backend prepared the devices
    SPEC = "spec"  # the claim's CDI spec written
    COMPLETED = "completed"  # PrepareCompleted checkpointed
    SPEC_REMOVED = "spec-removed"  # unprepare: the spec removed
    RELEASED = "released"  # unprepare: the devices released


async def _no_step(step: Step, uid: str) -> None:
    pass


async def undo(
    record: PreparedClaim,
    host: BackendHost,
    store: ClaimStore,
    step: Callable[[Step, str], Any] = _no_step,
    plugins_dir: Path | None = None,
) -> None:
    """Remove the claim's device metadata (below ``plugins_dir``, if the claim was prepared with
    them, whatever the setting is now) and spec, release its devices through the host, forget the
    claim: in that order.

    A device another claim of the checkpoint still names (admin access, a shared device) stays
    prepared. Raises (keeping the record) when the backend cannot release.
    """
    if plugins_dir is not None:
        await _remove_metadata(record, plugins_dir)
    if record.spec_file:
        await claimspec.remove(host.specs, record.uid)
    await step(Step.SPEC_REMOVED, record.uid)
    await _release(record, host, store)
    await step(Step.RELEASED, record.uid)
    await store.remove(record.uid)


async def _remove_metadata(record: PreparedClaim, plugins_dir: Path) -> None:
    if not record.devices or not record.device_metadata:
        return
    try:
        metadata.check_names(record.namespace, record.name, record.driver)
    except InvalidRequest:
        return  # no path was ever built from these names: nothing written
    await asyncio.to_thread(metadata.remove, plugins_dir, record.driver, record.namespace, record.name, record.uid)


async def _release(record: PreparedClaim, host: BackendHost, store: ClaimStore) -> None:
    try:
        preparations = host.preparations(record.resource)
    except KeyError:
        log.warning("claim %s: resource %s is no longer served; its devices are not released", record.uid, record.resource)
        return
    snapshot = host.latest(record.resource)
    # Only a preparation holds a device: an admin-access claim (or one configured not to prepare,
    # PCI vfio: false) neither releases it nor keeps another claim from releasing it.
    held = {
        d.device_id for c in store.all() if c.uid != record.uid and c.resource == record.resource for d in c.devices if d.prepared
    }
    devices = []
    for d in record.devices:
        if d.device_id in held or not d.prepared or not d.release:
            continue
        held.add(d.device_id)  # two shares of one device: released once
        current = snapshot.get(d.device_id) if snapshot is not None else None
        devices.append(current if current is not None else Device(id=d.device_id, prepare_group=d.prepare_group))
    await preparations.release(record.resource, devices)


async def roll_back_started(store: ClaimStore, host: BackendHost, alive: Callable[[str], bool] = lambda owner: False) -> int:
    """At start, before any driver serves: undo every claim left ``PrepareStarted``; how many were.

    A claim whose owner is ``alive`` (the other daemon of a rolling update, preparing it now) is
    left to it. A claim whose resource is not served now, or whose release fails, is kept
    (logged): its unprepare, or a later start, tries again.
    """
    undone = 0
    for record in store.started():
        if record.owner and alive(record.owner):
            log.info(
                "claim %s/%s (%s) is being prepared by instance %s, which runs: left to it",
                record.namespace,
                record.name,
                record.uid,
                record.owner,
            )
            continue
        try:
            host.preparations(record.resource)
        except KeyError:
            log.warning(
                "claim %s/%s (%s) was left half prepared for %s, which is not served now: kept for later",
                record.namespace,
                record.name,
                record.uid,
                record.resource,
            )
            continue
        try:
            await undo(record, host, store)
        except Exception as exc:
            log.error("cannot roll back claim %s/%s (%s), left half prepared: %s", record.namespace, record.name, record.uid, exc)
            continue
        undone += 1
        log.warning(
            "rolled back claim %s/%s (%s), left half prepared by an earlier run: %s released",
            record.namespace,
            record.name,
            record.uid,
            ", ".join(d.device for d in record.devices) or "no devices",
            extra={"resource": record.resource},
        )
    return undone
