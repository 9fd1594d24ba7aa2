"""The allocator: what the gRPC edge calls for Allocate, GetPreferredAllocation and PreStartContainer.

For one resource it keeps the backend's latest snapshot and the one it advertises (replicas
expanded), and turns the kubelet's requests into :class:`ContainerAllocation` values:

- **validation** per container request: no IDs, unknown IDs or IDs listed twice are an
  :class:`InvalidRequest` naming the IDs and the request (0-based). A device that turned Unhealthy
  after the kubelet chose it is still handed out, with a warning, as NVIDIA's plugin does: the
  kubelet decided while it was healthy, and failing the pod would not make the device healthier.
- **preparation** when the backend is a :class:`Preparer`: the devices not prepared yet, grouped by
  ``Device.prepare_group`` (no group: a group of its own), one group at a time under one lock per
  group. Concurrent Allocates for the same devices prepare once: the second waits for the lock
  and then finds the work done. What was prepared is remembered with the ``Device`` value it was
  prepared as; a changed value (a rebound driver, new edits) or a device that went away and came
  back is prepared again. This is a cache of preparation, never an occupancy table: the kubelet
  alone knows which devices are in use. A preparation keeps running when the Allocate that
  started it is cancelled (the kubelet's deadline), holding its group's lock, so a half-bound
  device is never prepared twice at once.
- **CDI**: when the resource sends ``cdi-cri`` or ``cdi-annotations``, the spec of the backend's
  snapshot is made sure to be on disk (written in a thread; a :class:`CdiError` propagates).
- **the answer**, per the resource's ``allocate`` parts, built from the underlying devices
  (replica IDs mapped back, each device once, in request order).

Nothing here does I/O on the hot path beyond a ``stat`` of the spec file: a repeated Allocate for
prepared devices with an unchanged spec is dictionary lookups only. gRPC status codes are chosen by
``cdiplug.server`` from the class of the error raised here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .backend import Abilities
from .cdi.annotations import annotations as cdi_annotations
from .cdi.names import device_name, qualified_name
from .config import ResourceConfig
from .errors import CdiplugError, InvalidRequest, PreparationError
from .model import (
    AllocatePart,
    ContainerAllocation,
    ContainerEdits,
    Device,
    DeviceSnapshot,
    PreferredRequest,
)
from .preferred import Affinity, preferred_allocation
from .replicas import expand

if TYPE_CHECKING:
    from .cdi.writer import SpecWriter
    from .metrics import Metrics

log = logging.getLogger(__name__)

PLUGIN_NAME = "cdiplug"  # the plugin part of cdi.k8s.io/<plugin>_<id> annotation keys

_GroupKey = tuple[str, str]


class _GroupLocks:
    """One asyncio.Lock per preparation group, forgotten once its group is gone and nobody uses it."""

    def __init__(self) -> None:
        self._locks: dict[_GroupKey, tuple[asyncio.Lock, list[int]]] = {}

    def acquire_ref(self, key: _GroupKey) -> asyncio.Lock:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        return lock

    def release_ref(self, key: _GroupKey) -> None:
        self._locks[key][1][0] -= 1

    def prune(self, keep: set[_GroupKey]) -> None:
        for key in [k for k, (_, users) in self._locks.items() if k not in keep and users[0] == 0]:
            del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)


def _group_key(device: Device) -> _GroupKey:
    return ("group", device.prepare_group) if device.prepare_group is not None else ("device", device.id)


class Allocator:
    """Allocate, GetPreferredAllocation and PreStartContainer for one resource."""

    def __init__(
        self,
        resource: ResourceConfig,
        abilities: Abilities,
        cdi: SpecWriter | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.resource = resource
        self.abilities = abilities
        self.cdi = cdi
        self.metrics = metrics
        empty = DeviceSnapshot(resource=resource.name)
        self._snapshot = empty
        self._advertised = empty
        self._underlying: Mapping[str, Device] = {}
        self._prepared: dict[str, Device] = {}
        self._locks = _GroupLocks()
        self._preparations: set[asyncio.Task[None]] = set()
        self._cdi_lock: asyncio.Lock | None = None
        self._cdi_written: DeviceSnapshot | None = None
        parts = resource.allocate
        self._send_env = AllocatePart.ENVVAR in parts
        self._send_specs = AllocatePart.DEVICE_SPECS in parts
        self._send_mounts = AllocatePart.MOUNTS in parts
        self._send_cdi = AllocatePart.CDI_CRI in parts
        self._send_annotations = AllocatePart.CDI_ANNOTATIONS in parts

    # -- state -----------------------------------------------------------------------------

    def update(self, snapshot: DeviceSnapshot) -> None:
        """Take the backend's latest snapshot of this resource."""
        if snapshot is self._snapshot:
            return
        if snapshot.resource != self.resource.name:
            raise ValueError(f"snapshot of {snapshot.resource} given to the allocator of {self.resource.name}")
        advertised = expand(snapshot, self.resource.replicas)
        if advertised is snapshot:
            underlying: Mapping[str, Device] = {d.id: d for d in snapshot.devices}
        else:
            underlying = {a.id: snapshot.get(a.id.rpartition("::")[0]) for a in advertised.devices}  # type: ignore[misc]
        self._snapshot, self._advertised, self._underlying = snapshot, advertised, underlying
        # Forget preparations of devices that went away or changed: they are prepared again.
        self._prepared = {i: d for i, d in self._prepared.items() if snapshot.get(i) == d}
        self._locks.prune({_group_key(d) for d in snapshot.devices})

    @property
    def snapshot(self) -> DeviceSnapshot:
        """The backend's latest snapshot (underlying devices)."""
        return self._snapshot

    @property
    def advertised(self) -> DeviceSnapshot:
        """The snapshot as the kubelet sees it: replicas expanded."""
        return self._advertised

    @property
    def pre_start_required(self) -> bool:
        return self.abilities.pre_starter is not None

    # -- Allocate ----------------------------------------------------------------------------

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """One :class:`ContainerAllocation` per container request, in order."""
        started = time.perf_counter()
        ok = False
        try:
            if not requests:
                raise InvalidRequest(f"{self.resource.name}: Allocate names no container requests")
            snapshot = self._snapshot
            per_request = [self._devices_for(i, ids) for i, ids in enumerate(requests)]
            if self.abilities.preparer is not None:
                await self._prepare(snapshot, per_request)
                if self._snapshot is not snapshot:
                    # Preparing changed what the backend reports (a bound function gains its
                    # /dev/vfio/devices/vfioN): answer and write the spec from the news.
                    snapshot = self._snapshot
                    per_request = [self._devices_for(i, ids) for i, ids in enumerate(requests)]
            if self.cdi is not None and (self._send_cdi or self._send_annotations):
                await self._ensure_cdi(snapshot)
            answers = [self._answer(snapshot, ids, devices) for ids, devices in zip(requests, per_request)]
            ok = True
            return answers
        finally:
            if self.metrics is not None:
                self.metrics.allocate_observed(self.resource.name, time.perf_counter() - started, ok)

    def _devices_for(self, index: int, ids: Sequence[str]) -> list[Device]:
        """The underlying devices of one container request, each once, in request order."""
        what = f"{self.resource.name}: container request {index}"
        if not ids:
            raise InvalidRequest(f"{what} asks for no devices")
        underlying = self._underlying
        unknown = [i for i in ids if i not in underlying]
        if unknown:
            raise InvalidRequest(f"{what}: unknown device IDs {', '.join(map(repr, dict.fromkeys(unknown)))}")
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            twice = [i for i in ids if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
            raise InvalidRequest(f"{what}: device IDs listed more than once: {', '.join(map(repr, dict.fromkeys(twice)))}")
        devices = list({d.id: d for d in (underlying[i] for i in ids)}.values())
        for device in devices:
            if not device.healthy:
                log.warning(
                    "allocating device %s although it is %s now: the kubelet chose it while it was healthy",
                    device.id,
                    device.health.value,
                    extra={"resource": self.resource.name, "device": device.id},
                )
        return devices

    # -- preparation -------------------------------------------------------------------------

    def _unprepared(self, devices: Sequence[Device]) -> list[Device]:
        prepared = self._prepared
        return [d for d in devices if (p := prepared.get(d.id)) is not d and p != d]

    async def _prepare(self, snapshot: DeviceSnapshot, per_request: list[list[Device]]) -> None:
        todo = self._unprepared(list({d.id: d for ds in per_request for d in ds}.values()))
        if not todo:
            return
        groups: dict[_GroupKey, list[Device]] = {}
        for device in todo:
            groups.setdefault(_group_key(device), []).append(device)
        # One group at a time, in a fixed order: never two locks held at once, so no deadlock.
        for key in sorted(groups):
            task = asyncio.create_task(
                self._prepare_group(key, groups[key]), name=f"prepare:{self.resource.name}:{key[1]}"
            )
            self._preparations.add(task)
            task.add_done_callback(self._preparation_done)
            await asyncio.shield(task)

    def _preparation_done(self, task: asyncio.Task[None]) -> None:
        self._preparations.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here so that a preparation whose Allocate was cancelled is still logged.
            log.warning("%s failed: %s", task.get_name(), task.exception(), extra={"resource": self.resource.name})

    async def _prepare_group(self, key: _GroupKey, devices: list[Device]) -> None:
        lock = self._locks.acquire_ref(key)
        try:
            async with lock:
                todo = self._unprepared(devices)  # a concurrent Allocate may have done it meanwhile
                if not todo:
                    return
                preparer = self.abilities.preparer
                assert preparer is not None
                try:
                    await preparer.prepare(self.resource.name, todo)
                except PreparationError:
                    self._preparation_failed()
                    raise
                except Exception as exc:
                    self._preparation_failed()
                    if isinstance(exc, CdiplugError):
                        raise
                    raise PreparationError(todo[0].id, f"{type(exc).__name__}: {exc}") from exc
                for device in todo:
                    self._prepared[device.id] = device
        finally:
            self._locks.release_ref(key)

    def _preparation_failed(self) -> None:
        if self.metrics is not None:
            self.metrics.preparation_failed(self.resource.name)

    # -- CDI ---------------------------------------------------------------------------------

    async def _ensure_cdi(self, snapshot: DeviceSnapshot) -> None:
        assert self.cdi is not None
        if self._cdi_written is snapshot and self._spec_exists():
            return
        if self._cdi_lock is None:
            self._cdi_lock = asyncio.Lock()
        async with self._cdi_lock:
            if self._cdi_written == snapshot and self._spec_exists():
                self._cdi_written = snapshot
                return
            await asyncio.to_thread(self.cdi.write, self.resource.cdi_kind, snapshot)
            self._cdi_written = snapshot

    def _spec_exists(self) -> bool:
        assert self.cdi is not None
        return os.path.exists(self.cdi.path_for(self.resource.cdi_kind))

    # -- the answer --------------------------------------------------------------------------

    def _answer(self, snapshot: DeviceSnapshot, ids: Sequence[str], devices: list[Device]) -> ContainerAllocation:
        edits = ContainerEdits.combine([snapshot.common_edits, *(d.edits for d in devices)])
        env: dict[str, str] = {}
        if self._send_env:
            env.update(edits.env)
            if snapshot.ids_env:
                env[snapshot.ids_env] = ",".join(d.id for d in devices)
        cdi_devices: tuple[str, ...] = ()
        annotations: dict[str, str] = {}
        if self._send_cdi or self._send_annotations:
            names = self._cdi_names(devices)
            if self._send_cdi:
                cdi_devices = names
            if self._send_annotations:
                annotations = self._annotations(devices, names)
        return ContainerAllocation(
            device_ids=ids,
            env=env,
            device_specs=edits.device_nodes if self._send_specs else (),
            mounts=edits.mounts if self._send_mounts else (),
            cdi_devices=cdi_devices,
            annotations=annotations,
        )

    def _cdi_names(self, devices: list[Device]) -> tuple[str, ...]:
        kind = self.resource.cdi_kind
        return tuple(qualified_name(kind, device_name(d.id)) for d in devices)

    def _annotations(self, devices: list[Device], names: tuple[str, ...]) -> dict[str, str]:
        # The key must be the same for a repeated Allocate and differ between resources and
        # device sets of one container, so it is derived from both rather than random.
        digest = hashlib.sha256("\0".join([self.resource.name, *(d.id for d in devices)]).encode())
        return dict(cdi_annotations(PLUGIN_NAME, digest.hexdigest()[:16], names))

    # -- GetPreferredAllocation and PreStartContainer ---------------------------------------------

    def preferred(self, requests: Sequence[PreferredRequest]) -> list[tuple[str, ...]]:
        """The suggested IDs per container request: the backend's own choice, else the core policy."""
        return [self._preferred_one(r) for r in requests]

    def _preferred_one(self, request: PreferredRequest) -> tuple[str, ...]:
        backend = self.abilities.preferred
        if backend is not None:
            answer = backend.preferred_allocation(self.resource.name, self._advertised, request)
            if answer is not None:
                return tuple(answer)
        return preferred_allocation(
            request,
            self._advertised,
            affinity=self._affinity_fn(),
            underlying=self._underlying_id,
        )

    def _underlying_id(self, advertised_id: str) -> str:
        device = self._underlying.get(advertised_id)
        return device.id if device is not None else advertised_id

    def _affinity_fn(self) -> Affinity | None:
        ability = self.abilities.affinity
        if ability is None:
            return None
        snapshot, resource = self._snapshot, self.resource.name

        def affinity(a: str, b: str) -> float:
            da, db = snapshot.get(a), snapshot.get(b)
            if da is None or db is None:
                return 0.0
            return ability.affinity(resource, da, db)

        return affinity

    async def pre_start(self, ids: Sequence[str]) -> None:
        """PreStartContainer: the backend's pre-start for the underlying devices, if it has one."""
        starter = self.abilities.pre_starter
        if starter is None:
            return
        unknown = [i for i in ids if i not in self._underlying]
        if unknown:
            raise InvalidRequest(f"{self.resource.name}: PreStartContainer for unknown device IDs {', '.join(map(repr, unknown))}")
        devices = list({d.id: d for d in (self._underlying[i] for i in ids)}.values())
        await starter.pre_start(self.resource.name, devices)
