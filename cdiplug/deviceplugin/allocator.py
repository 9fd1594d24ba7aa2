"""The allocator: what the gRPC edge calls for Allocate, GetPreferredAllocation and PreStartContainer.

For one resource it keeps the backend's latest snapshot and the one it advertises (replicas
expanded), and turns the kubelet's requests into :class:`ContainerAllocation` values:

- **validation** per container request: no IDs, unknown IDs or IDs listed twice (in one request
  or in two containers of one Allocate) are an :class:`InvalidRequest` naming the IDs and the
  request (0-based); GetPreferredAllocation with IDs we do not advertise or a size that cannot
  be met likewise. Messages name a few IDs, each cut (``cdiplug.brief``): a request may hold
  10,000 IDs of a megabyte each. The checks cost set lookups; the naming is on the error path. A device that turned Unhealthy
  after the kubelet chose it is still handed out, with a warning, as NVIDIA's plugin does: the
  kubelet decided while it was healthy, and failing the pod would not make the device healthier.
- **preparation** through the host's :class:`~cdiplug.host.Preparations` (serialized per group,
  idempotent, remembered); the answer and the spec are built from the devices it returns.
- **CDI**: when the resource sends ``cdi-cri`` or ``cdi-annotations``, the resource's
  :class:`~cdiplug.host.SpecKeeper` makes sure the spec holding these devices is on disk (a
  :class:`CdiError` propagates). The allocator never writes a spec itself.
- **the answer**, per the resource's ``allocate`` parts, built from the underlying devices
  (replica IDs mapped back, each device once, in request order).

A repeated Allocate for prepared devices with an unchanged spec is dictionary lookups and one
``lstat``; for one container request of healthy devices that needs no preparation (the kubelet
asks per container), one lookup of the answer checked before against this snapshot and the
``lstat``. gRPC status codes are chosen by ``cdiplug.deviceplugin.server`` from the class of the
error raised here.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence

from ..backend import Abilities
from ..brief import format_ids
from ..cdi.annotations import annotations as cdi_annotations
from ..errors import InvalidRequest
from ..host import Preparations, SpecKeeper
from ..model import (
    AllocatePart,
    ContainerAllocation,
    ContainerEdits,
    Device,
    DeviceSnapshot,
    PreferredRequest,
)
from ..names import device_name, qualified_name
from ..replicas import expand, replica_id
from ..resource import ResourceConfig
from ..telemetry import NULL_RECORDER, Recorder
from .preferred import Affinity, nodes_by_device, preferred_allocation

log = logging.getLogger(__name__)

MAX_CACHED_ANSWERS = 4096  # answers kept per snapshot: repeated Allocates of the same devices
PLUGIN_NAME = "cdiplug"  # the plugin part of cdi.k8s.io/<plugin>_<id> annotation keys


class Allocator:
    """Allocate, GetPreferredAllocation and PreStartContainer for one resource."""

    def __init__(
        self,
        resource: ResourceConfig[object],
        abilities: Abilities,
        preparations: Preparations | None = None,
        spec: SpecKeeper | None = None,
        recorder: Recorder = NULL_RECORDER,
    ) -> None:
        self.resource = resource
        self.abilities = abilities
        self.preparations = preparations
        self.spec = spec
        self.recorder = recorder
        empty = DeviceSnapshot(resource=resource.name)
        self._snapshot = empty
        self._advertised = empty
        self._underlying: Mapping[str, Device] = {}
        self._answers_for: DeviceSnapshot | None = None
        self._answers: dict[tuple[str, ...], ContainerAllocation] = {}
        # Of those, the answers for one container request of healthy devices: checked once against
        # this snapshot, so asking again is one lookup (the kubelet asks per container).
        self._checked: dict[tuple[str, ...], ContainerAllocation] = {}
        self._node_sets: tuple[DeviceSnapshot, Mapping[str, frozenset[int]]] | None = None  # per advertised snapshot
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
            underlying: Mapping[str, Device] = snapshot.by_id
        else:
            underlying = {replica_id(d.id, i): d for d in snapshot.devices for i in range(self.resource.replicas)}
        self._snapshot, self._advertised, self._underlying = snapshot, advertised, underlying

    @property
    def snapshot(self) -> DeviceSnapshot:
        """The backend's latest snapshot (underlying devices)."""
        return self._snapshot

    @property
    def advertised(self) -> DeviceSnapshot:
        """The snapshot as the kubelet sees it: replicas expanded."""
        return self._advertised

    @property
    def _preparing(self) -> bool:
        return self.preparations is not None and self.preparations.needed

    @property
    def _spec_to_ensure(self) -> SpecKeeper | None:
        """The keeper to ask before answering: answers name CDI devices (or annotations), whose spec must be on disk."""
        return self.spec if self._send_cdi or self._send_annotations else None

    @property
    def pre_start_required(self) -> bool:
        return self.abilities.pre_starter is not None

    # -- Allocate ----------------------------------------------------------------------------

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """One :class:`ContainerAllocation` per container request, in order."""
        started = time.perf_counter()
        ok = False
        try:
            snapshot = self._snapshot
            if len(requests) == 1 and snapshot is self._answers_for and not self._preparing:
                answer = self._checked.get(tuple(requests[0]))
                if answer is not None:
                    if (keeper := self._spec_to_ensure) is not None:
                        await keeper.ensure(snapshot)
                    ok = True
                    return [answer]
            if not requests:
                raise InvalidRequest(f"{self.resource.name}: Allocate names no container requests")
            per_request = [self._devices_for(i, ids) for i, ids in enumerate(requests)]
            if len(requests) > 1:
                self._check_disjoint(requests)
            if self._preparing:
                snapshot, per_request = await self._prepare(snapshot, per_request)
            if (keeper := self._spec_to_ensure) is not None:
                await keeper.ensure(snapshot)
            answers = [self._cached_answer(snapshot, ids, devices) for ids, devices in zip(requests, per_request)]
            if len(requests) == 1 and snapshot is self._snapshot and all(d.healthy for d in per_request[0]):
                self._checked[tuple(requests[0])] = answers[0]
            ok = True
            return answers
        finally:
            self.recorder.allocate_observed(self.resource.name, time.perf_counter() - started, ok)

    async def _prepare(
        self, snapshot: DeviceSnapshot, per_request: list[list[Device]]
    ) -> tuple[DeviceSnapshot, list[list[Device]]]:
        """Prepare every requested device once; the snapshot and requests with the prepared values.

        Preparing may change a device (a bound function gains its ``/dev/vfio/devices/vfioN``):
        the answer and the spec then hold the device as prepared, before the backend reports it.
        """
        assert self.preparations is not None
        unique = list({d.id: d for ds in per_request for d in ds}.values())
        prepared = await self.preparations.prepare(self.resource.name, unique)
        changed = {d.id: p for d, p in zip(unique, prepared) if p is not d and p != d}
        if not changed:
            return snapshot, per_request
        snapshot = snapshot.with_devices(changed.get(d.id, d) for d in snapshot.devices)
        return snapshot, [[changed.get(d.id, d) for d in ds] for ds in per_request]

    def _devices_for(self, index: int, ids: Sequence[str]) -> list[Device]:
        """The underlying devices of one container request, each once, in request order."""
        what = f"{self.resource.name}: container request {index}"
        if not ids:
            raise InvalidRequest(f"{what} asks for no devices")
        underlying = self._underlying
        unknown = [i for i in ids if i not in underlying]
        if unknown:
            raise InvalidRequest(f"{what}: unknown device IDs {format_ids(unknown)}")
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            twice: list[str] = []
            for i in ids:
                if i in seen:
                    twice.append(i)
                seen.add(i)
            raise InvalidRequest(f"{what}: device IDs listed more than once: {format_ids(twice)}")
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

    def _check_disjoint(self, requests: Sequence[Sequence[str]]) -> None:
        """No advertised ID in two container requests (each request is free of repeats already)."""
        if len(set().union(*requests)) == sum(map(len, requests)):
            return
        first: dict[str, int] = {}
        shared: dict[str, tuple[int, int]] = {}
        for index, ids in enumerate(requests):
            for i in ids:
                earlier = first.setdefault(i, index)
                if earlier != index and i not in shared:
                    shared[i] = (earlier, index)
        (a, b) = next(iter(shared.values()))
        raise InvalidRequest(
            f"{self.resource.name}: device IDs in more than one container request "
            f"(first in requests {a} and {b}): {format_ids(shared)}"
        )

    # -- the answer --------------------------------------------------------------------------

    def _cached_answer(self, snapshot: DeviceSnapshot, ids: Sequence[str], devices: list[Device]) -> ContainerAllocation:
        """The answer for these IDs, made once per snapshot (an answer depends on nothing else)."""
        if snapshot is not self._answers_for:
            self._answers_for, self._answers, self._checked = snapshot, {}, {}
        key = tuple(ids)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answer(snapshot, ids, devices)
            if len(self._answers) >= MAX_CACHED_ANSWERS:
                self._answers.clear()
                self._checked.clear()
            self._answers[key] = answer
        return answer

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
        """The suggested IDs per container request: the backend's own choice, else the core policy.

        Every ID must be one we advertise, and the size must be met: at least the must-include
        IDs, at most every ID offered, one at least.
        """
        for index, request in enumerate(requests):
            self._check_preferred(index, request)
        return [self._preferred_one(r) for r in requests]

    def _check_preferred(self, index: int, request: PreferredRequest) -> None:
        underlying = self._underlying
        what = f"{self.resource.name}: GetPreferredAllocation container request {index}"
        unknown = [i for i in request.available if i not in underlying]
        unknown += [i for i in request.must_include if i not in underlying]
        if unknown:
            raise InvalidRequest(f"{what}: device IDs not advertised {format_ids(unknown)}")
        must = len(set(request.must_include))
        offered = len(set(request.available).union(request.must_include))
        if not max(must, 1) <= request.size <= offered:
            raise InvalidRequest(
                f"{what}: allocation size {request.size} cannot be met with {offered} devices offered, {must} of them required"
            )

    def _preferred_one(self, request: PreferredRequest) -> tuple[str, ...]:
        backend = self.abilities.preferred
        if backend is not None:
            answer = backend.preferred_allocation(self.resource.name, self._advertised, request)
            if answer is not None:
                return tuple(answer)
        advertised = self._advertised
        if self._node_sets is None or self._node_sets[0] is not advertised:
            self._node_sets = (advertised, nodes_by_device(advertised))
        return preferred_allocation(
            request,
            advertised,
            affinity=self._affinity_fn(),
            underlying=self._underlying_id if self.resource.replicas > 1 else None,
            node_sets=self._node_sets[1],
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
            raise InvalidRequest(f"{self.resource.name}: PreStartContainer for unknown device IDs {format_ids(unknown)}")
        devices = list({d.id: d for d in (self._underlying[i] for i in ids)}.values())
        await starter.pre_start(self.resource.name, devices)
