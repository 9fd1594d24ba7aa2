"""Preparing and unpreparing claims for one driver: what NodePrepareResources and NodeUnprepareResources do.

:class:`ClaimPreparer` serves one resource served as a DRA driver:

- **prepare**: a claim already in the checkpoint is answered from it (a repeated call, or one
  after a restart, redoes nothing; a spec file removed meanwhile is written again). Otherwise
  the ResourceClaim is read from the API server, its allocation results for our driver and this
  node's pool picked (:mod:`.claims`), the devices prepared through the host's
  :class:`~cdiplug.host.Preparations` (the same serialized, journaled, idempotent preparation
  as the device-plugin Allocate: VFIO binding included), the claim's CDI spec written
  (:mod:`.claimspec`) and the claim checkpointed (:mod:`.checkpoint`). The answer names the
  CDI devices per allocation result.
- **unprepare**: the claim's spec is removed, its devices released through the host (the
  backend's Unpreparer: PCI ``release: restore`` gives the device back to its driver) and the
  claim forgotten. A claim we do not know is already unprepared.

One claim is prepared or unprepared at a time (a lock per claim UID); different claims run
concurrently, their devices serialized by the host. Errors are cdiplug's own; :mod:`.service`
turns them into the per-claim error strings of the answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ..errors import DeviceUnavailable
from ..host import BackendHost
from ..model import Device
from ..resource import ResourceConfig
from ..telemetry import NULL_RECORDER, Recorder
from . import claimspec
from .checkpoint import ClaimStore, PreparedClaim, PreparedDevice
from .claims import ClaimRef, allocated
from .kubeclient import KubeClient
from .slices import names_to_ids

log = logging.getLogger(__name__)


class ClaimPreparer:
    """NodePrepareResources and NodeUnprepareResources of one driver, as plain calls."""

    def __init__(
        self,
        resource: ResourceConfig[Any],
        node: str,
        host: BackendHost,
        store: ClaimStore,
        client: Callable[[], KubeClient],
        cdi_dir: Path,
        recorder: Recorder = NULL_RECORDER,
    ) -> None:
        self.resource = resource
        self.driver = resource.dra_driver
        self.node = node
        self.host = host
        self.store = store
        self.client = client
        self.cdi_dir = Path(cdi_dir)
        self.recorder = recorder
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def _claim_lock(self, uid: str) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(uid, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[uid]

    # -- prepare --

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        started = time.perf_counter()
        ok = False
        try:
            claimspec.check_uid(ref.uid)
            async with self._claim_lock(ref.uid):
                done = self.store.get(ref.uid)
                if done is not None and done.driver == self.driver:
                    await self._ensure_spec(done)
                    ok = True
                    return done
                prepared = await self._prepare(ref)
                ok = True
                return prepared
        finally:
            self.recorder.allocate_observed(self.resource.name, time.perf_counter() - started, ok)

    async def _prepare(self, ref: ClaimRef) -> PreparedClaim:
        claim = await self.client().get_claim(ref.namespace, ref.name)
        results = allocated(claim, ref, self.driver, self.node)
        name = self.resource.name
        if not results:
            empty = PreparedClaim(ref.uid, ref.namespace, ref.name, self.driver, name, (), "")
            await self.store.put(empty)
            return empty
        snapshot = self.host.latest(name)
        if snapshot is None:
            raise DeviceUnavailable(f"{self.driver}: no devices known yet (the backend has not reported)")
        ids = names_to_ids(snapshot.devices)
        unknown = sorted({r.device for r in results if r.device not in ids})
        if unknown:
            raise DeviceUnavailable(f"{self.driver}: claim {ref} names devices this node does not have: {', '.join(unknown)}")
        # Each device once, in the claim's order (a device may serve several requests).
        wanted: dict[str, Device] = {}
        for r in results:
            device = snapshot.get(ids[r.device])
            assert device is not None
            wanted.setdefault(r.device, device)
        prepared = await self.host.preparations(name).prepare(name, list(wanted.values()))
        by_name = dict(zip(wanted, prepared))
        content = claimspec.render(self.driver, ref.uid, snapshot, list(by_name.items()))
        await asyncio.to_thread(claimspec.write, self.cdi_dir, ref.uid, content)
        requests: dict[str, list[str]] = {}
        for r in results:
            requests.setdefault(r.device, []).append(r.request)
        devices = tuple(
            PreparedDevice(
                request_names=tuple(requests[dev]),
                pool=self.node,
                device=dev,
                device_id=device.id,
                cdi_ids=(claimspec.cdi_name(self.driver, ref.uid, dev),),
                prepare_group=device.prepare_group,
            )
            for dev, device in by_name.items()
        )
        done = PreparedClaim(ref.uid, ref.namespace, ref.name, self.driver, name, devices, claimspec.file_name(ref.uid))
        await self.store.put(done)
        log.info("prepared claim %s: %s", ref, ", ".join(d.device for d in devices), extra={"resource": name})
        return done

    async def _ensure_spec(self, done: PreparedClaim) -> None:
        """Write the spec of a checkpointed claim again if it went missing (and the devices are known)."""
        if not done.spec_file or (self.cdi_dir / done.spec_file).exists():
            return
        snapshot = self.host.latest(self.resource.name)
        if snapshot is None:
            return
        devices = [(d.device, snapshot.get(d.device_id)) for d in done.devices]
        if any(device is None for _, device in devices):
            log.warning("cannot write the CDI spec of claim %s again: some of its devices are gone", done.uid)
            return
        content = claimspec.render(self.driver, done.uid, snapshot, [(n, d) for n, d in devices if d is not None])
        await asyncio.to_thread(claimspec.write, self.cdi_dir, done.uid, content)
        log.info("wrote the missing CDI spec of claim %s/%s again", done.namespace, done.name)

    # -- unprepare --

    async def unprepare(self, ref: ClaimRef) -> None:
        claimspec.check_uid(ref.uid)
        async with self._claim_lock(ref.uid):
            done = self.store.get(ref.uid)
            if done is None:
                return  # never prepared here, or already unprepared
            if done.spec_file:
                await asyncio.to_thread(claimspec.remove, self.cdi_dir, done.uid)
            await self._release(done)
            await self.store.remove(done.uid)
            log.info("unprepared claim %s", ref, extra={"resource": done.resource})

    async def _release(self, done: PreparedClaim) -> None:
        try:
            preparations = self.host.preparations(done.resource)
        except KeyError:
            log.warning("claim %s: resource %s is no longer served; its devices are not released", done.uid, done.resource)
            return
        snapshot = self.host.latest(done.resource)
        # A device another prepared claim still holds (admin access, a shared device) stays prepared.
        held = {d.device_id for c in self.store.all() if c.uid != done.uid and c.resource == done.resource for d in c.devices}
        devices = []
        for d in done.devices:
            if d.device_id in held:
                continue
            current = snapshot.get(d.device_id) if snapshot is not None else None
            devices.append(current if current is not None else Device(id=d.device_id, prepare_group=d.prepare_group))
        await preparations.release(done.resource, devices)
