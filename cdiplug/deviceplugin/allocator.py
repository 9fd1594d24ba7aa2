"""The allocator: what the gRPC edge calls for Allocate and GetPreferredAllocation.

For one resource it keeps the backend's latest snapshot and the one it advertises (replicas
expanded), and turns the kubelet's requests into :class:`ContainerAllocation` values:

- **validation** per container request: no IDs, unknown IDs or IDs listed twice (in one request
  or in two containers of one Allocate) are an :class:`InvalidRequest` naming the IDs and the
  request (0-based); GetPreferredAllocation with IDs we do not advertise or a size that cannot
  be met likewise. Messages name a few IDs, each cut (``cdiplug.toolkit.brief``): a request may hold
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

One cache, because ``bench/`` shows it (building an answer afresh costs about 30 µs, which put
Allocate p50 at 1.2-1.4x the floor instead of about 1x): the answers to single container requests
of healthy devices that need no preparation (the kubelet asks per container), checked once against
the current snapshot, so asking again is one lookup and the ``lstat`` of the spec. It holds at most
:data:`MAX_CACHED_ANSWERS` answers and starts afresh with every snapshot, so memory stays flat
under any load (random device sets fill it once; ``bench/bench_daemon.py``'s
``rss_after_random_sets_mib``). Everything else is checked and answered afresh. gRPC status codes are chosen by :func:`cdiplug.wire.lenient.status_for` from the class of the
error raised here.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence

from cdiplug.backend import Abilities
from cdiplug.cdi.annotations import annotations as cdi_annotations
from cdiplug.deviceplugin.preferred import Affinity, preferred_allocation
from cdiplug.deviceplugin.settings import settings_of
from cdiplug.errors import InvalidRequest
from cdiplug.host import Preparations, SpecKeeper
from cdiplug.models.devices import AllocatePart, ContainerAllocation, ContainerEdits, Device, DeviceSnapshot, PreferredRequest
from cdiplug.models.names import cdi_device_name, qualified_name
from cdiplug.models.replicas import expand, replica_id
from cdiplug.models.resource import ResourceConfig
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.brief import format_ids

log = logging.getLogger(__name__)

MAX_CACHED_ANSWERS = 256  # per resource: past it, the cache starts afresh (memory stays flat)
PLUGIN_NAME = "cdiplug"  # the plugin part of cdi.k8s.io/<plugin>_<id> annotation keys


class Allocator:
    """Allocate and GetPreferredAllocation for one resource."""

    def __init__(
        self,
        resource: ResourceConfig[object],
        abilities: Abilities,
        preparations: Preparations | None = None,
        spec: SpecKeeper | None = None,
        recorder: Recorder = NULL_RECORDER,
    ) -> None:
        self.resource = resource
        self.replicas = settings_of(resource).replicas
        self.abilities = abilities
        self.preparations = preparations
        self.spec = spec
        self.recorder = recorder
        empty = DeviceSnapshot(resource=resource.name)
        self._snapshot = empty
        self._advertised = empty
        self._underlying: Mapping[str, Device] = {}
        # Answers to one container request of healthy devices, checked against _answers_for.
        self._answers_for: DeviceSnapshot | None = None
        self._answers: dict[tuple[str, ...], ContainerAllocation] = {}
        parts = settings_of(resource).allocate
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
        advertised = expand(snapshot, self.replicas)
        if advertised is snapshot:
            underlying: Mapping[str, Device] = snapshot.by_id
        else:
            underlying = {replica_id(d.id, i): d for d in snapshot.devices for i in range(self.replicas)}
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

    # -- Allocate ----------------------------------------------------------------------------

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """One :class:`ContainerAllocation` per container request, in order."""
        started = time.perf_counter()
        ok = False
        try:
            snapshot = self._snapshot
            if len(requests) == 1 and snapshot is self._answers_for and not self._preparing:
                answer = self._answers.get(tuple(requests[0]))
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
            answers = [self._answer(snapshot, ids, devices) for ids, devices in zip(requests, per_request)]
            if len(requests) == 1 and snapshot is self._snapshot and all(d.healthy for d in per_request[0]):
                self._remember(snapshot, tuple(requests[0]), answers[0])
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

    def _remember(self, snapshot: DeviceSnapshot, key: tuple[str, ...], answer: ContainerAllocation) -> None:
        if snapshot is not self._answers_for or len(self._answers) >= MAX_CACHED_ANSWERS:
            self._answers_for, self._answers = snapshot, {}
        self._answers[key] = answer

    def _answer(self, snapshot: DeviceSnapshot, ids: Sequence[str], devices: list[Device]) -> ContainerAllocation:
        """The answer for one container request (it depends on the snapshot and the devices alone)."""
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
        return tuple(qualified_name(kind, cdi_device_name(d.id)) for d in devices)

    def _annotations(self, devices: list[Device], names: tuple[str, ...]) -> dict[str, str]:
        # The key must be the same for a repeated Allocate and differ between resources and
        # device sets of one container, so it is derived from both rather than random.
        digest = hashlib.sha256("\0".join([self.resource.name, *(d.id for d in devices)]).encode())
        return dict(cdi_annotations(PLUGIN_NAME, digest.hexdigest()[:16], names))

    # -- GetPreferredAllocation -------------------------------------------------------------

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
        return preferred_allocation(
            request,
            self._advertised,
            affinity=self._affinity_fn(),
            underlying=self._underlying_id if self.replicas > 1 else None,
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
