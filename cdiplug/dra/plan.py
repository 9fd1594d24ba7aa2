"""A claim's plan, decided once before anything is touched, and :func:`materialize`, the one step that carries it out.

A :class:`ClaimPlan` holds everything preparing one claim means: the devices (each device, or
share of one, once, in the claim's order), how each is shaped (its configuration and admin
access: :mod:`.claim_config`), the checkpoint record naming what will be touched, and where its
device metadata go. It is built either from the ResourceClaim the API server has
(:meth:`Planner.fresh`: a prepare) or from the claim's checkpoint record (:meth:`Planner.again`: a
restore after a reboot, or a spec that went missing), and every check that can fail a claim
(devices this node does not have, a wrong configuration, names no path may hold) runs while
planning, so a plan that exists can be carried out.

:func:`materialize` is what both paths then do: the devices prepared through the host's
preparations, the device metadata written, the claim's CDI spec written (atomically, before the
answer: :mod:`.claimspec`). What to checkpoint around it is the caller's (:mod:`.prepare`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from cdiplug.backend import ClaimConfigurable, Configured
from cdiplug.dra import claim_config, claimspec, metadata, shares
from cdiplug.dra.checkpoint import ClaimState, PreparedClaim, PreparedDevice
from cdiplug.dra.claims import AllocatedClaim, AllocatedDevice, ClaimRef, allocated
from cdiplug.dra.rollback import Step
from cdiplug.dra.slices import names_to_ids
from cdiplug.errors import DeviceUnavailable
from cdiplug.host.preparations import Preparations
from cdiplug.host.specs import SpecKeepers
from cdiplug.kube.client import KubeClient
from cdiplug.models.devices import Device, DeviceSnapshot, Mount
from cdiplug.models.instance import Instance


@frozen
class ReadClaim:
    """A ResourceClaim as read from the API server: our allocation, and the pod's name for it."""

    claim: AllocatedClaim
    pod_claim: str | None  # the name the pod gives the claim (a claim made from a template); None otherwise


async def read_claim(client: KubeClient, ref: ClaimRef, driver: str, node: str, pod_claim: bool = False) -> ReadClaim:
    """The one read of a claim from the API server (``pod_claim``: its pod claim name too, for
    device metadata); InvalidRequest when it is not ours to prepare."""
    obj = await client.get_claim(ref.namespace, ref.name)
    return ReadClaim(allocated(obj, ref, driver, node), metadata.pod_claim_name(obj) if pod_claim else None)


async def check_unchanged(client: Callable[[], KubeClient], ref: ClaimRef, done: PreparedClaim, node: str) -> None:
    """A repeated prepare of a claim prepared with a configuration: InvalidRequest when the claim
    has another one now (:func:`~.claim_config.check_unchanged`; the checkpoint answers when it
    cannot be read)."""

    async def read() -> AllocatedClaim:
        return (await read_claim(client(), ref, done.driver, node)).claim

    await claim_config.check_unchanged(read, ref, done)


@frozen
class ClaimPlan:
    """What preparing one claim means (see the module docstring)."""

    record: PreparedClaim  # what the checkpoint holds while and once it is prepared
    claim: AllocatedClaim  # its results and configuration
    wanted: Mapping[str, Device] = attrs.field(eq=False)  # entry name -> the device as the snapshot has it
    shapes: Mapping[str, Configured] = attrs.field(eq=False)  # entry name -> how it is prepared
    snapshot: DeviceSnapshot | None = None  # the resource's, for the spec's common edits; None: no devices
    # Device metadata (``device_metadata: true``): written below ``metadata_dir``, mounted by entry name.
    metadata_dir: Path | None = None
    mounts: Mapping[str, tuple[Mount, ...]] | None = None
    pod_claim: str | None = None

    @property
    def empty(self) -> bool:
        return not self.record.devices


@frozen
class Planner:
    """What a plan of one driver needs to know: fixed per driver, but for the backend's abilities."""

    driver: str
    resource: str
    node: str
    configurable: ClaimConfigurable[Any] | None
    metadata_dir: Path | None = None  # device metadata (``device_metadata: true``) go below it
    boot_id: str | None = None
    instance: str = ""  # the pod UID of this daemon: the owner of what it starts preparing
    names: Instance = Instance()  # of the files of this cdiplug instance (its claim specs)

    def fresh(self, read: ReadClaim, snapshot: DeviceSnapshot | None) -> ClaimPlan:
        """The plan of a claim the kubelet asks us to prepare; DeviceUnavailable or InvalidRequest
        when it cannot be (before anything is touched)."""
        claim = read.claim
        ref = claim.ref
        if not claim.results:
            empty = PreparedClaim(ref.uid, ref.namespace, ref.name, self.driver, self.resource, (), "", configs=claim.configs)
            return ClaimPlan(empty, claim, {}, {})
        if snapshot is None:
            raise DeviceUnavailable(f"{self.driver}: no devices known yet (the backend has not reported)")
        ids = names_to_ids(snapshot.devices)
        unknown = sorted({r.device for r in claim.results if r.device not in ids})
        if unknown:
            raise DeviceUnavailable(f"{self.driver}: claim {ref} names devices this node does not have: {', '.join(unknown)}")
        # Each device (or share of one) once, in the claim's order (a device may serve several requests).
        wanted: dict[str, Device] = {}
        for r in claim.results:
            device = snapshot.get(ids[r.device])
            assert device is not None
            wanted.setdefault(shares.entry_name(r.device, r.share_id), device)
        shapes = claim_config.configure(claim, wanted, self.resource, self.configurable)
        record = self._record(claim, wanted, shapes)
        return self._with_metadata(ClaimPlan(record, claim, wanted, shapes, snapshot), read.pod_claim)

    async def again(self, record: PreparedClaim, snapshot: DeviceSnapshot) -> ClaimPlan:
        """The plan of a completed claim prepared again as its record has it (restore: its device
        metadata name the pod's claim as written then); DeviceUnavailable when a device it names is gone."""
        pod_claim = None
        if (folder := self._metadata_dir_of(record)) is not None:
            pod_claim = await asyncio.to_thread(metadata.written_pod_claim, folder, record)
        gone = [d.device for d in record.devices if snapshot.get(d.device_id) is None]
        if gone:
            raise DeviceUnavailable(f"{self.driver}: claim {record.uid} names devices this node no longer has: {', '.join(gone)}")
        wanted = {entry_name(d): snapshot.get(d.device_id) for d in record.devices}
        claim = claim_config.recorded_claim(record)
        shapes = claim_config.configure(claim, wanted, self.resource, self.configurable)  # type: ignore[arg-type]  # checked above
        # Prepared as it was: a claim's configuration may have changed what the backend prepares.
        shapes = {n: attrs.evolve(s, prepare=d.prepared) for n, s, d in zip(wanted, shapes.values(), record.devices)}
        return self._with_metadata(ClaimPlan(record, claim, wanted, shapes, snapshot), pod_claim)  # type: ignore[arg-type]

    def _metadata_dir_of(self, record: PreparedClaim) -> Path | None:
        """Where the claim's device metadata go; None without. A claim keeps the setting it was
        prepared with (its record says), as its unprepare does."""
        return self.metadata_dir if record.device_metadata else None

    def _with_metadata(self, plan: ClaimPlan, pod_claim: str | None) -> ClaimPlan:
        # Refuses names no path may hold (InvalidRequest): before any side effect.
        folder = self._metadata_dir_of(plan.record)
        if folder is None:
            return plan
        by_device = metadata.mounts(folder, plan.record, pod_claim)
        mounts = {entry_name(d): by_device[d.device] for d in plan.record.devices if d.device in by_device}  # shares: by entry
        return attrs.evolve(plan, metadata_dir=folder, mounts=mounts, pod_claim=pod_claim)

    def _record(self, claim: AllocatedClaim, wanted: Mapping[str, Device], shapes: Mapping[str, Configured]) -> PreparedClaim:
        """The PrepareStarted record: every device the claim will touch, as the answer will name it."""
        ref = claim.ref
        requests: dict[str, list[str]] = {}
        results: dict[str, AllocatedDevice] = {}
        for r in claim.results:
            entry = shares.entry_name(r.device, r.share_id)
            requests.setdefault(entry, []).append(r.request)
            results.setdefault(entry, r)
        admin = claim_config.admin_devices(claim)
        devices = tuple(
            PreparedDevice(
                request_names=tuple(requests[entry]),
                pool=self.node,
                device=results[entry].device,
                device_id=device.id,
                cdi_ids=(claimspec.cdi_name(self.driver, ref.uid, entry),),
                prepare_group=device.prepare_group,
                share_id=results[entry].share_id,
                consumed_capacity=results[entry].consumed_capacity,
                prepared=shapes[entry].prepare,
                release=shapes[entry].release,
                admin_access=entry in admin,
            )
            for entry, device in wanted.items()
        )
        return PreparedClaim(
            ref.uid,
            ref.namespace,
            ref.name,
            self.driver,
            self.resource,
            devices,
            claimspec.file_name(self.names, ref.uid),
            ClaimState.STARTED,
            claim.configs,
            self.boot_id,
            self.instance,
            device_metadata=self.metadata_dir is not None,
        )


async def no_step(step: Step, uid: str) -> None:
    """No test hook: a restore stops at no step."""


async def materialize(
    plan: ClaimPlan,
    preparations: Preparations,
    configurable: ClaimConfigurable[Any] | None,
    specs: SpecKeepers,
    step: Callable[[Step, str], Awaitable[None]] = no_step,
) -> list[tuple[str, Device]]:
    """Carry ``plan`` out: its devices prepared through the host (idempotent), its device metadata
    and its CDI spec written; the devices as the spec names them. Raises what the backend or a
    write raises, having done part of it: the caller rolls back (or keeps the record)."""
    record = plan.record
    prepared = await claim_config.prepare(preparations, record.resource, plan.claim, plan.wanted, plan.shapes, configurable)
    await step(Step.PREPARED, record.uid)
    # What each share consumed goes into its env (:mod:`.shares`).
    devices = shares.with_consumed([(entry_name(d), p, d.consumed_capacity) for d, p in zip(record.devices, prepared)])
    assert plan.snapshot is not None  # a plan with devices has one
    content = claimspec.render(
        record.driver, record.uid, claim_config.for_claim(plan.snapshot, plan.shapes), devices, plan.mounts
    )
    if plan.metadata_dir is not None:
        by_device = {d.device: device for d, (_, device) in zip(record.devices, devices)}
        await asyncio.to_thread(metadata.write, plan.metadata_dir, record, by_device, plan.pod_claim)
    await claimspec.write(specs, record.uid, content)
    await step(Step.SPEC, record.uid)
    return devices


def entry_name(d: PreparedDevice) -> str:
    """The name of a recorded device in the claim's spec: the device, or the share of it."""
    return shares.entry_name(d.device, d.share_id)
