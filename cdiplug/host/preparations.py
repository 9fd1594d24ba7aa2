"""Preparation and release of one backend's devices: serialized per group, idempotent, remembered.

:class:`Preparations` is the one place that calls a backend's :class:`~cdiplug.backend.Preparer`
and :class:`~cdiplug.backend.Unpreparer`, whichever front end asks:

- devices are prepared one preparation group at a time (``Device.prepare_group``; no group: a
  group of its own), in a fixed order, under one lock per group, so two Allocates or two claims
  never prepare one group at once and never deadlock;
- what was prepared is remembered with the ``Device`` value given and the value the backend
  returned: asking again for the same device answers from memory. A device whose value changes
  (a rebound driver, new edits) or that goes away is forgotten and prepared again. This is a
  cache of preparation, never an occupancy table: the kubelet and the scheduler alone know which
  devices are taken;
- a preparation keeps running when the caller is cancelled (the kubelet's deadline), holding its
  group's lock, so a half-bound device is never prepared twice at once;
- :meth:`Preparations.release` forgets devices and undoes their preparation under the same locks.

The boundary: no gRPC, no CDI, no kubelet; the front ends decide when to prepare and release.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from cdiplug.backend import Preparer, Unpreparer
from cdiplug.errors import CdiplugError, PreparationError
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.keyedlock import KeyedLock

log = logging.getLogger(__name__)

GroupKey = tuple[str, str]


def group_key(device: Device) -> GroupKey:
    return ("group", device.prepare_group) if device.prepare_group is not None else ("device", device.id)


class Preparations:
    """Prepares and releases the devices of one backend, for every resource it serves."""

    def __init__(
        self,
        backend: str,
        preparer: Preparer | None,
        unpreparer: Unpreparer | None = None,
        recorder: Recorder = NULL_RECORDER,
    ) -> None:
        self.backend = backend
        self.preparer = preparer
        self.unpreparer = unpreparer
        self.recorder = recorder
        # resource -> device ID -> (the value asked for, the value the backend returned)
        self._prepared: dict[str, dict[str, tuple[Device, Device]]] = {}
        self._locks: KeyedLock[GroupKey] = KeyedLock()
        self._running: set[asyncio.Task[None]] = set()

    @property
    def needed(self) -> bool:
        """Whether preparing does anything for this backend."""
        return self.preparer is not None

    def prepared_ids(self, resource: str) -> frozenset[str]:
        return frozenset(self._prepared.get(resource, ()))

    # -- snapshots --

    def on_snapshot(self, snapshot: DeviceSnapshot) -> None:
        """Forget preparations of devices that went away or changed: they are prepared again."""
        prepared = self._prepared.get(snapshot.resource)
        if not prepared:
            return
        for device_id, (given, done) in list(prepared.items()):
            now = snapshot.get(device_id)
            if now is None or (now != done and now != given):
                del prepared[device_id]

    # -- prepare --

    def _cached(self, resource: str, device: Device) -> Device | None:
        entry = self._prepared.get(resource, {}).get(device.id)
        if entry is None:
            return None
        given, done = entry
        return done if device is given or device is done or device == given or device == done else None

    async def prepare(self, resource: str, devices: Sequence[Device]) -> tuple[Device, ...]:
        """``devices`` as they are once prepared, in the order given; PreparationError on failure."""
        if self.preparer is None:
            return tuple(devices)
        todo = [d for d in devices if self._cached(resource, d) is None]
        if todo:
            groups: dict[GroupKey, list[Device]] = {}
            for device in todo:
                groups.setdefault(group_key(device), []).append(device)
            # One group at a time, in a fixed order: never two locks held at once, so no deadlock.
            for key in sorted(groups):
                task = asyncio.create_task(self._prepare_group(resource, key, groups[key]), name=f"prepare:{resource}:{key[1]}")
                self._running.add(task)
                task.add_done_callback(self._preparation_done)
                await asyncio.shield(task)
        result = []
        for device in devices:
            done = self._cached(resource, device)
            # Forgotten meanwhile (the device changed under us): answer with what was asked for.
            result.append(done if done is not None else device)
        return tuple(result)

    def _preparation_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here so that a preparation whose caller was cancelled is still logged.
            log.warning("%s failed: %s", task.get_name(), task.exception())

    async def _prepare_group(self, resource: str, key: GroupKey, devices: list[Device]) -> None:
        async with self._locks(key):
            todo = [d for d in devices if self._cached(resource, d) is None]  # done meanwhile?
            if not todo:
                return
            assert self.preparer is not None
            try:
                done = tuple(await self.preparer.prepare(resource, todo))
            except PreparationError:
                self.recorder.preparation_failed(resource)
                raise
            except Exception as exc:
                self.recorder.preparation_failed(resource)
                if isinstance(exc, CdiplugError):
                    raise
                raise PreparationError(todo[0].id, f"{type(exc).__name__}: {exc}") from exc
            if len(done) != len(todo) or any(a.id != b.id for a, b in zip(todo, done)):
                self.recorder.preparation_failed(resource)
                raise PreparationError(todo[0].id, f"backend {self.backend} returned other devices than it was asked to prepare")
            prepared = self._prepared.setdefault(resource, {})
            for given, result in zip(todo, done):
                prepared[given.id] = (given, result)

    # -- release --

    async def release(self, resource: str, devices: Sequence[Device]) -> None:
        """Forget ``devices`` and undo their preparation (the backend's Unpreparer, if any)."""
        prepared = self._prepared.get(resource, {})
        for device in devices:
            prepared.pop(device.id, None)
        if self.unpreparer is None or not devices:
            return
        groups: dict[GroupKey, list[Device]] = {}
        for device in devices:
            groups.setdefault(group_key(device), []).append(device)
        for key in sorted(groups):
            async with self._locks(key):
                await self.unpreparer.unprepare(resource, [d.id for d in groups[key]])
