"""Restoring a driver's prepared claims at start: what a reboot undid while the checkpoint survived.

A reboot wipes the CDI folder (a tmpfs) and undoes what preparation did (a VFIO bind). On the
driver's first snapshot, :class:`Restorer` prepares again every ``PrepareCompleted`` claim of the
driver that was prepared in another boot (the boot ID in the checkpoint differs from
``/proc/sys/kernel/random/boot_id``, or is unknown) or whose spec is missing, through the same
plan and :func:`~cdiplug.dra.plan.materialize` as a prepare; the claim keeps its record, so the
kubelet's unprepare after the reboot still releases it. Prepares wait (at most
:data:`RESTORE_WAIT` seconds) until the restore is done, so no answer names a spec that is not there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import attrs

from cdiplug.dra import claimspec
from cdiplug.dra.checkpoint import ClaimStore, PreparedClaim
from cdiplug.host.specs import SpecKeepers
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.toolkit.keyedlock import KeyedLock

log = logging.getLogger(__name__)

RESTORE_WAIT = 10.0  # seconds a prepare waits for the start-up restore; the kubelet's deadline is longer


class Restorer:
    """The start-up restore of one driver's completed claims (see the module docstring)."""

    def __init__(
        self,
        store: ClaimStore,
        driver: str,
        specs: SpecKeepers,
        boot_id: str | None,
        locks: KeyedLock[str],
        respec: Callable[[PreparedClaim, DeviceSnapshot], Awaitable[None]],
    ) -> None:
        self.store = store
        self.driver = driver
        self.specs = specs
        self.boot_id = boot_id
        self._locks = locks  # the preparer's, per claim UID
        self._respec = respec  # the claim planned again and materialized
        self._to_restore = [c.uid for c in store.all() if c.completed and c.driver == driver and c.devices]
        self._restored = asyncio.Event()
        self._restoring = False
        if not self._to_restore:
            self._restored.set()

    @property
    def pending(self) -> bool:
        return not self._restored.is_set()

    async def wait(self, snapshot: DeviceSnapshot | None) -> None:
        """Until the restore is done (at most :data:`RESTORE_WAIT` s); done now when the devices
        are known (``snapshot``) and nobody restores yet."""
        if self._restored.is_set():
            return
        if not self._restoring and snapshot is not None:
            await self.restore(snapshot)  # the devices are known: restore now rather than wait
            return
        try:
            async with asyncio.timeout(RESTORE_WAIT):
                await self._restored.wait()
        except TimeoutError:
            log.warning("%s: answering a prepare before the start-up restore is done (no devices yet)", self.driver)

    async def restore(self, snapshot: DeviceSnapshot) -> int:
        """Prepare again, and write the specs of, this driver's completed claims that a reboot undid.

        A claim that cannot be restored is logged and kept (its next prepare tries again, its
        unprepare releases it). Returns how many were restored.
        """
        if self._restoring or self._restored.is_set():
            await self._restored.wait()
            return 0
        self._restoring = True
        restored = 0
        try:
            for uid in self._to_restore:
                async with self._locks(uid):
                    restored += await self._restore_one(uid, snapshot)
        finally:
            self._to_restore = []
            self._restored.set()
        return restored

    async def _restore_one(self, uid: str, snapshot: DeviceSnapshot) -> int:
        record = self.store.get(uid)
        if record is None or not record.completed or not record.spec_file:
            return 0  # unprepared meanwhile
        new_boot = self.boot_id is not None and record.boot_id != self.boot_id
        if not new_boot and claimspec.exists(self.specs, uid):
            return 0
        why = f"prepared in an earlier boot ({record.boot_id or 'unknown'})" if new_boot else "its CDI spec is missing"
        try:
            await self._respec(record, snapshot)
            if new_boot:
                await self.store.put(attrs.evolve(record, boot_id=self.boot_id))
        except Exception as exc:
            log.error("cannot restore claim %s/%s (%s), %s: %s", record.namespace, record.name, uid, why, exc)
            return 0
        log.warning("restored claim %s/%s (%s): %s", record.namespace, record.name, uid, why, extra={"resource": record.resource})
        return 1
