"""Doubles for testing DRA claim preparation without an API server or a kubelet.

- :class:`ClaimsAtSeam`: the API at the preparer's client seam: ResourceClaims as the scheduler
  leaves them, by (namespace, name), the reads counted and the status written kept.
- :class:`RecordingBackend`: a backend that publishes a snapshot and records every preparation
  and release the host asks of it (``hook`` is awaited inside each prepare, after the record).
- :func:`hosted_backend`: a real :class:`~cdiplug.host.BackendHost` running one resource, yielded
  once its backend has reported its devices.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import msgspec
from lightkube.models.resource_v1 import ResourceClaim

from cdiplug.backend import BackendPlugin, SnapshotSink
from cdiplug.dra.claims import ClaimRef
from cdiplug.dra.settings import DraSettings
from cdiplug.errors import KubernetesError
from cdiplug.host import BackendHost
from cdiplug.models.devices import ContainerEdits, Device, DeviceNode, DeviceSnapshot
from cdiplug.models.resource import Api, ResourceConfig
from cdiplug.models.world import World
from cdiplug.toolkit.supervisor import Supervisor


class ClaimsAtSeam:
    """ResourceClaims of ``driver`` allocated in ``pool``, served as the Kubernetes client does."""

    def __init__(self, driver: str, pool: str, namespace: str = "ns") -> None:
        self.driver = driver
        self.pool = pool
        self.namespace = namespace
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.statuses: list[list[dict[str, Any]]] = []  # each status write's devices

    def result(
        self,
        device: str,
        request: str = "nic",
        *,
        admin: bool | None = None,
        share: str | None = None,
        consumed: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One allocation result: ``device`` for ``request``, an admin-access one, a share's ID and consumed capacity."""
        r: dict[str, Any] = {"request": request, "driver": self.driver, "pool": self.pool, "device": device}
        if admin is not None:
            r["adminAccess"] = admin
        if share is not None:
            r["shareID"] = share
        if consumed is not None:
            r["consumedCapacity"] = dict(consumed)
        return r

    def put(self, uid: str, results: Sequence[Mapping[str, Any]], *, name: str = "", config: Any = None) -> ClaimRef:
        """The claim ``uid`` (named ``c-<uid[:4]>`` unless told) allocated to ``results``; ``config``: its opaque parameters."""
        name = name or f"c-{uid[:4]}"
        devices: dict[str, Any] = {"results": [dict(r) for r in results]}
        if config is not None:
            devices["config"] = [{"source": "FromClaim", "opaque": {"driver": self.driver, "parameters": config}}]
        self.claims[(self.namespace, name)] = {
            "metadata": {"name": name, "namespace": self.namespace, "uid": uid},
            "status": {"allocation": {"devices": devices}},
        }
        return ClaimRef(self.namespace, name, uid)

    def add(self, uid: str, devices: Sequence[str], config: Any = None, *, admin: bool | None = None) -> ClaimRef:
        """The claim ``uid`` allocated to ``devices``, each for the request ``nic``."""
        return self.put(uid, [self.result(d, admin=admin) for d in devices], config=config)

    async def get_claim(self, namespace: str, name: str) -> ResourceClaim:
        """The claim as the client returns it: lightkube's model (a field of the wrong type fails here)."""
        self.reads += 1
        try:
            claim = self.claims[(namespace, name)]
        except KeyError:
            raise KubernetesError(f"resourceclaims {name} not found", 404) from None
        return msgspec.convert(claim, ResourceClaim)

    async def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any], manager: str) -> ResourceClaim:
        self.statuses.append(list(body.get("status", {}).get("devices") or []))
        return msgspec.convert(body, ResourceClaim)


@attrs.frozen
class NoOptions:
    """The options of a :class:`RecordingBackend`: none."""


class RecordingBackend:
    """A backend publishing :meth:`snapshot` and recording what the host prepares and releases.

    A preparation adds a device node ``/dev/<id>`` to each device (as a VFIO bind adds its node);
    subclasses say otherwise in :meth:`prepared_device`. The last one made is ``type(self).last``.
    :meth:`plugin` is the subclass as the plugin ``rec``, :meth:`dra_resource` a DRA resource of it.
    """

    last: ClassVar[Any]

    @classmethod
    def plugin(cls) -> BackendPlugin[NoOptions]:
        return BackendPlugin(name="rec", options_type=NoOptions, create=cls)

    @staticmethod
    def dra_resource(name: str, driver: str) -> ResourceConfig[NoOptions]:
        return ResourceConfig(name, "rec", NoOptions(), api=Api.DRA, settings=DraSettings(dra_driver=driver))

    def __init__(self, resources: Sequence[ResourceConfig[Any]], world: World) -> None:
        self.resources = resources
        self.prepared: list[list[str]] = []
        self.released: list[list[str]] = []
        self.hook: Callable[[Sequence[Device]], Awaitable[None]] | None = None
        type(self).last = self

    def snapshot(self) -> DeviceSnapshot:
        raise NotImplementedError

    def prepared_device(self, device: Device) -> Device:
        return attrs.evolve(device, edits=device.edits.merge(ContainerEdits(device_nodes=[DeviceNode(f"/dev/{device.id}")])))

    async def run(self, sink: SnapshotSink) -> None:
        sink.publish(self.snapshot())

    async def prepare(self, resource: str, devices: Sequence[Device]) -> Sequence[Device]:
        self.prepared.append([d.id for d in devices])
        if self.hook is not None:
            await self.hook(devices)
        return [self.prepared_device(d) for d in devices]

    def release_interval(self, resource: str) -> float | None:
        return None

    async def releasable(self, resource: str) -> Sequence[str]:
        return []

    async def unprepare(self, resource: str, device_ids: Sequence[str]) -> None:
        self.released.append(list(device_ids))


@contextlib.asynccontextmanager
async def hosted_backend(
    world: World, resource: ResourceConfig[Any], plugins: Mapping[str, BackendPlugin[Any]], timeout: float = 10.0
) -> AsyncIterator[BackendHost]:
    """A started host running ``resource``, once its backend has reported; stopped when the block ends."""
    supervisor = Supervisor()
    host = BackendHost(world, supervisor, plugins=plugins)
    host.create([resource])
    reported = asyncio.Event()

    class Listener:
        def offer(self, snapshot: DeviceSnapshot) -> None:
            reported.set()

    host.attach(resource.name, Listener())
    host.start()
    try:
        await asyncio.wait_for(reported.wait(), timeout)
        yield host
    finally:
        await host.stop()
        await supervisor.close()
