"""Preparing and unpreparing claims for one driver: what NodePrepareResources and NodeUnprepareResources do.

:class:`ClaimPreparer` is the :class:`~cdiplug.dra.handler.ClaimHandler` of one resource served
as a DRA driver:

- **prepare**: a claim the checkpoint has as ``PrepareCompleted`` is answered from it (a repeated
  call, or one after a restart, redoes nothing; a spec file removed meanwhile is written again; a
  claim prepared with a configuration is read again first, and one whose configuration changed
  is an error).
  Otherwise the ResourceClaim is read from the API server and decoded (:mod:`.claims`: our
  results on this node's pool, our configuration entries), its configuration and admin access
  turned into how each device is prepared (:mod:`.claim_config`: a wrong one fails the claim
  before anything is touched), then, in this order:

  1. ``PrepareStarted`` is checkpointed, naming every device the claim will touch;
  2. the devices to prepare (not those of admin access or configured not to, PCI ``vfio: false``)
     are prepared through the host's :class:`~cdiplug.host.Preparations` (the same
     serialized, journaled, idempotent preparation as the device-plugin Allocate: VFIO binding
     included);
  3. the claim's CDI spec is written (:mod:`.claimspec`);
  4. ``PrepareCompleted`` is checkpointed and the CDI devices answered per allocation result.

  A failure in 2 or 3 rolls the claim back before the error is answered (the kubelet retries
  with a fresh prepare), and so does a call the kubelet cancels there (it restarted, or gave up). A claim left ``PrepareStarted`` (the process died, or the call was
  cancelled) is prepared afresh by a repeated prepare, released by unprepare, and rolled back by
  :func:`~cdiplug.dra.rollback.roll_back_started` when the daemon starts, before any driver serves.
- **unprepare**: the claim's spec is removed, its devices released through the host (the
  backend's Unpreparer: PCI ``release: restore`` gives the device back to its driver) and the
  claim forgotten — whether it completed or only started. A claim we do not know is already
  unprepared.
- **drain** (the resource leaves DRA on this node while claims are prepared): claims not prepared
  yet are refused, prepared ones still answered and unprepared, and the front end is told once
  none of the driver's claims is left, so it can stop the driver's sockets only then (the kubelet
  needs them to unprepare: without, a pod using a claim would stay Terminating).

- **restore** (at start, on the driver's first snapshot): a reboot wipes the CDI folder (a tmpfs)
  and undoes what preparation did (a VFIO bind) while the checkpoint survives. Every
  ``PrepareCompleted`` claim of the driver that was prepared in another boot (the boot ID in the
  checkpoint differs from ``/proc/sys/kernel/random/boot_id``, or is unknown) or whose spec is
  missing is prepared again through the host (idempotent) and its spec written again; the claim
  keeps its record, so the kubelet's unprepare after the reboot still releases it. Prepares wait
  (at most :data:`RESTORE_WAIT` seconds) until the restore is done, so no answer names a spec
  that is not there.

Why roll back at start rather than after a grace period: a started claim was never answered as
prepared, so no container holds its devices and releasing them is safe; the kubelet retries an
unanswered prepare anyway and gets a fresh preparation; and doing it before the sockets serve
means no prepare or unprepare can race the rollback and no timer decides. The cost, one release
and one preparation again for a claim the kubelet still wants, is paid only after a crash.

One claim is prepared or unprepared at a time (:class:`~cdiplug.toolkit.keyedlock.KeyedLock` per claim
UID); different claims run concurrently, their devices serialized by the host. Errors are
cdiplug's own; :mod:`.service` turns them into the per-claim error strings of the answer.

Test hook: ``CDIPLUG_DRA_PAUSE_AFTER=<step>`` (a :class:`Step` value) makes a prepare or unprepare
stop for good right after that step, logging ``cdiplug-test-hook: DRA paused after <step>``, so a
test can kill the daemon there (as ``CDIPLUG_PCI_PAUSE_AFTER`` does inside a VFIO bind).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from cdiplug.backend import ClaimConfigurable, Configured
from cdiplug.dra import claim_config, claimspec, metadata, shares, status
from cdiplug.dra.checkpoint import ClaimState, ClaimStore, PreparedClaim, PreparedDevice
from cdiplug.dra.claims import AllocatedClaim, AllocatedDevice, ClaimRef, allocated
from cdiplug.dra.handler import ClaimHandler
from cdiplug.dra.rollback import Step, undo
from cdiplug.dra.settings import driver_of, settings_of
from cdiplug.dra.slices import names_to_ids
from cdiplug.errors import DeviceUnavailable, InvalidRequest
from cdiplug.host import BackendHost
from cdiplug.kube.client import KubeClient
from cdiplug.models.devices import Device, DeviceSnapshot, Mount
from cdiplug.models.resource import ResourceConfig
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.keyedlock import KeyedLock

log = logging.getLogger(__name__)

PAUSE_ENV = "CDIPLUG_DRA_PAUSE_AFTER"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
RESTORE_WAIT = 10.0  # seconds a prepare waits for the start-up restore; the kubelet's deadline is longer
DEVICES_WAIT = 10.0  # seconds a prepare waits for the backend's first snapshot (the kubelet may call at once)


def read_boot_id(path: Path) -> str | None:
    """The node's boot ID (a UUID) from ``path``; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            value = f.read(64).decode("ascii", "replace").strip()
    except OSError as exc:
        log.warning("cannot read the boot ID from %s (%s): a reboot cannot be told", path, exc.strerror or exc)
        return None
    return value or None


class ClaimPreparer(ClaimHandler):
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
        pause_after: str | None = None,
        boot_id: str | None = None,
        plugins_dir: Path | None = None,
        instance: str = "",
    ) -> None:
        self.resource = resource
        self.plugins_dir = plugins_dir  # device metadata (``device_metadata: true``) goes below it
        self.driver = driver_of(resource)
        self.node = node
        self.host = host
        self.store = store
        self.client = client
        self.cdi_dir = Path(cdi_dir)
        self.recorder = recorder
        self.pause_after = pause_after if pause_after is not None else os.environ.get(PAUSE_ENV) or None
        self._locks: KeyedLock[str] = KeyedLock()
        self._status_writes: dict[str, asyncio.Task[None]] = {}  # the last status write per claim UID
        self.boot_id = boot_id
        self.instance = instance  # our pod UID, recorded as the owner of what we start preparing
        # The completed claims of this driver to check once its devices are known (restore).
        self._to_restore = [c.uid for c in store.all() if c.completed and c.driver == self.driver and c.devices]
        self._restored = asyncio.Event()
        self._restoring = False
        self._known = asyncio.Event()  # set by devices_known(): the backend has reported
        if not self._to_restore:
            self._restored.set()
        self._drained: Callable[[], None] | None = None  # set while draining: called once none is left

    @property
    def resource_name(self) -> str:
        return self.resource.name

    def drain(self, drained: Callable[[], None]) -> None:
        """The driver leaves this node: refuse claims not prepared here, go on unpreparing, and
        call ``drained`` once no claim of the driver is in the checkpoint (at once when none is)."""
        self._drained = drained
        self._check_drained()

    def _check_drained(self) -> None:
        if self._drained is not None and not any(c.driver == self.driver for c in self.store.all()):
            drained, self._drained = self._drained, None
            drained()

    def _prepared_now(self) -> int:
        """This driver's claims prepared now (``cdiplug_dra_claims_prepared``)."""
        return sum(c.completed and c.driver == self.driver for c in self.store.all())

    async def _read_shared(self) -> None:
        # Only with --pod-uid may another daemon serve this driver and change the checkpoint (a
        # rolling update); without it every change went through this store: memory is the file.
        if self.instance:
            await self.store.refresh()

    async def _step(self, step: Step, uid: str) -> None:
        if self.pause_after == step.value:
            log.warning("cdiplug-test-hook: DRA paused after %s (claim %s)", step.value, uid)
            await asyncio.Event().wait()  # the test kills us here

    # -- prepare --

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        started = time.perf_counter()
        ok = False
        try:
            claimspec.check_uid(ref.uid)
            await self._wait_devices()
            await self._wait_restored()
            async with self._locks(ref.uid):
                await self._read_shared()
                done = self.store.get(ref.uid)
                if done is not None and done.driver == self.driver and done.completed:
                    await self._same_configuration(ref, done)
                    await self._ensure_spec(done)
                    ok = True
                    return done
                if self._drained is not None:
                    raise DeviceUnavailable(
                        f"{self.driver}: claim {ref} not prepared: {self.resource.name} is no longer served by DRA on this node"
                    )
                prepared = await self._prepare(ref)
                ok = True
                return prepared
        finally:
            self.recorder.prepare_observed(self.resource.name, self.driver, time.perf_counter() - started, ok)
            self.recorder.claims_prepared(self.resource.name, self.driver, self._prepared_now())

    async def _prepare(self, ref: ClaimRef) -> PreparedClaim:
        obj = await self.client().get_claim(ref.namespace, ref.name)
        claim = allocated(obj, ref, self.driver, self.node)
        name = self.resource.name
        if not claim.results:
            empty = PreparedClaim(ref.uid, ref.namespace, ref.name, self.driver, name, (), "", configs=claim.configs)
            await self.store.put(empty)
            return empty
        snapshot = self.host.latest(name)
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
        # Before any side effect: a wrong configuration fails this claim alone (InvalidRequest).
        shapes = self._shape(claim, wanted)
        record = self._record(claim, wanted, shapes)
        # Before any side effect: refuses names no path may hold.
        pod_claim = metadata.pod_claim_name(obj) if settings_of(self.resource).device_metadata else None
        mounts = self._metadata_mounts(record, pod_claim)
        # PrepareStarted, before anything is touched. Not fsynced: it guards against the process
        # dying; what a power loss resets (VFIO bindings, the tmpfs CDI folder) needs no guard, and
        # the PCI backend journals its own steps durably.
        await self.store.put(record, durable=False)
        try:
            await self._step(Step.STARTED, ref.uid)
            prepared = await self._prepare_shaped(claim, wanted, shapes)
            await self._step(Step.PREPARED, ref.uid)
            devices = self._with_consumed(record, prepared)
            content = claimspec.render(self.driver, ref.uid, claim_config.for_claim(snapshot, shapes), devices, mounts)
            await self._write_metadata(record, devices, pod_claim)
            await asyncio.to_thread(claimspec.write, self.cdi_dir, ref.uid, content)
            await self._step(Step.SPEC, ref.uid)
        except asyncio.CancelledError:  # the kubelet gave up (restarted, timed out): never answered, so undone
            await asyncio.shield(self._roll_back(record, "its prepare call was cancelled"))
            log.warning("claim %s: the prepare call was cancelled (the kubelet went away); rolled back", ref)
            raise
        except Exception as exc:
            await self._roll_back(record, "its preparation failed")
            failed = status.Failure(status.PREPARE_FAILED, str(exc))
            await self._status(
                ref, [_entry(self.driver, self.node, d, w, failed) for d, w in zip(record.devices, wanted.values())]
            )
            raise
        done = attrs.evolve(record, state=ClaimState.COMPLETED)
        await self.store.put(done)
        await self._step(Step.COMPLETED, ref.uid)
        await self._status(ref, [_entry(self.driver, self.node, d, device) for d, (_, device) in zip(record.devices, devices)])
        log.info("prepared claim %s: %s", ref, ", ".join(d.device for d in done.devices), extra={"resource": name})
        return done

    @staticmethod
    def _with_consumed(record: PreparedClaim, prepared: list[Device]) -> list[tuple[str, Device]]:
        """The record's devices as prepared, named as in its spec, with what each share consumed in
        its env (:mod:`.shares`)."""
        return shares.with_consumed([(_entry_name(d), p, d.consumed_capacity) for d, p in zip(record.devices, prepared)])

    async def _status(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """Our entries of the claim's ``status.devices`` (KEP-4817), written in the background so that
        the kubelet's answer never waits for the API server; in order per claim (a clear never
        overtakes the write before it); a failure is logged (:mod:`.status`)."""
        previous = self._status_writes.get(ref.uid)

        async def write() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            await status.publish(self.client, self.driver, ref.namespace, ref.name, ref.uid, entries)

        task = asyncio.create_task(write(), name=f"dra-status:{self.driver}:{ref.uid}")
        self._status_writes[ref.uid] = task
        task.add_done_callback(lambda t: self._status_writes.pop(ref.uid) if self._status_writes.get(ref.uid) is t else None)

    async def status_settled(self) -> None:
        """Until every status write begun so far has ended (tests; a clean stop)."""
        while self._status_writes:
            await asyncio.gather(*self._status_writes.values(), return_exceptions=True)

    # -- per-claim configuration and admin access (claim_config) --

    def _configurable(self) -> ClaimConfigurable[Any] | None:
        return self.host.abilities(self.resource.name).configurable

    def _shape(self, claim: AllocatedClaim, wanted: dict[str, Device]) -> dict[str, Configured]:
        return claim_config.configure(claim, wanted, self.resource.name, self._configurable())

    async def _prepare_shaped(
        self, claim: AllocatedClaim, wanted: dict[str, Device], shapes: dict[str, Configured]
    ) -> list[Device]:
        preparations = self.host.preparations(self.resource.name)
        return await claim_config.prepare(preparations, self.resource.name, claim, wanted, shapes, self._configurable())

    async def _same_configuration(self, ref: ClaimRef, done: PreparedClaim) -> None:
        if done.configs:  # else answered from the checkpoint without a read, as ever
            await claim_config.check_unchanged(lambda: self.client().get_claim(ref.namespace, ref.name), ref, done, self.node)

    def _record(self, claim: AllocatedClaim, wanted: dict[str, Device], shapes: dict[str, Configured]) -> PreparedClaim:
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
        spec_file = claimspec.file_name(ref.uid)
        return PreparedClaim(
            ref.uid,
            ref.namespace,
            ref.name,
            self.driver,
            self.resource.name,
            devices,
            spec_file,
            ClaimState.STARTED,
            claim.configs,
            self.boot_id,
            self.instance,
        )

    # -- device metadata (KEP-5304), with device_metadata: true --

    def _metadata_mounts(self, record: PreparedClaim, pod_claim: str | None) -> dict[str, tuple[Mount, ...]] | None:
        if not settings_of(self.resource).device_metadata or self.plugins_dir is None:
            return None
        by_device = metadata.mounts(self.plugins_dir, record, pod_claim)
        return {_entry_name(d): by_device[d.device] for d in record.devices if d.device in by_device}  # shares: by entry

    async def _write_metadata(self, record: PreparedClaim, devices: list[tuple[str, Device]], pod_claim: str | None) -> None:
        if settings_of(self.resource).device_metadata and self.plugins_dir is not None:
            by_device = {d.device: device for d, (_, device) in zip(record.devices, devices)}
            await asyncio.to_thread(metadata.write, self.plugins_dir, record, by_device, pod_claim)

    async def _remove_metadata(self, record: PreparedClaim) -> None:
        # Whatever the setting is now: it may have been on when the claim was prepared.
        if self.plugins_dir is None or not record.devices:
            return
        try:
            metadata.check_names(record.namespace, record.name, record.driver)
        except InvalidRequest:
            return  # no path was ever built from these names: nothing written
        await asyncio.to_thread(metadata.remove, self.plugins_dir, record.driver, record.namespace, record.name, record.uid)

    async def _roll_back(self, record: PreparedClaim, why: str) -> None:
        try:
            await self._remove_metadata(record)
            await undo(record, self.host, self.store, self.cdi_dir)
        except Exception as exc:  # kept as started: unprepare or the next start tries again
            log.error("claim %s/%s (%s): %s, and rolling it back failed: %s", record.namespace, record.name, record.uid, why, exc)

    async def _ensure_spec(self, done: PreparedClaim) -> None:
        """Write the spec of a checkpointed claim again if it went missing; DeviceUnavailable when it cannot be."""
        if not done.spec_file or (self.cdi_dir / done.spec_file).exists():
            return
        snapshot = self.host.latest(self.resource.name)
        if snapshot is None:  # never answer CDI names whose spec is not there: the kubelet retries
            raise DeviceUnavailable(f"{self.driver}: the CDI spec of claim {done.uid} is missing and no devices are known yet")
        await self._respec(done, snapshot)

    async def _respec(self, record: PreparedClaim, snapshot: DeviceSnapshot) -> None:
        """Prepare a completed claim's devices again through the host (idempotent) and write its spec."""
        gone = [d.device for d in record.devices if snapshot.get(d.device_id) is None]
        if gone:
            raise DeviceUnavailable(f"{self.driver}: claim {record.uid} names devices this node no longer has: {', '.join(gone)}")
        name = self.resource.name
        wanted: dict[str, Device] = {}
        for d in record.devices:
            device = snapshot.get(d.device_id)
            assert device is not None  # checked above
            wanted[_entry_name(d)] = device
        claim = claim_config.recorded_claim(record)
        shapes = claim_config.configure(claim, wanted, name, self._configurable())
        shapes = {n: attrs.evolve(s, prepare=d.prepared) for n, s, d in zip(wanted, shapes.values(), record.devices)}
        named = self._with_consumed(record, await self._prepare_shaped(claim, wanted, shapes))
        snapshot = claim_config.for_claim(snapshot, shapes)
        pod_claim = None
        if settings_of(self.resource).device_metadata and self.plugins_dir is not None:
            pod_claim = await asyncio.to_thread(metadata.written_pod_claim, self.plugins_dir, record)
        content = claimspec.render(self.driver, record.uid, snapshot, named, self._metadata_mounts(record, pod_claim))
        await self._write_metadata(record, named, pod_claim)
        await asyncio.to_thread(claimspec.write, self.cdi_dir, record.uid, content)
        log.info("prepared claim %s/%s (%s) again and wrote its CDI spec", record.namespace, record.name, record.uid)

    # -- restore at start --

    @property
    def restore_pending(self) -> bool:
        return not self._restored.is_set()

    def devices_known(self) -> None:
        """The backend has reported its first snapshot: prepares waiting for it go on."""
        self._known.set()

    async def _wait_devices(self) -> None:
        # The kubelet calls as soon as we register, which may be before the backend's first
        # scan; a prepare then waits for it rather than fail and wait for the kubelet's retry.
        if self._known.is_set() or self.host.latest(self.resource.name) is not None:
            return
        try:
            await asyncio.wait_for(self._known.wait(), DEVICES_WAIT)
        except TimeoutError:
            pass  # the prepare answers "no devices known yet"

    async def _wait_restored(self) -> None:
        if self._restored.is_set():
            return
        snapshot = self.host.latest(self.resource.name)
        if not self._restoring and snapshot is not None:
            await self.restore(snapshot)  # the devices are known: restore now rather than wait
            return
        try:
            await asyncio.wait_for(self._restored.wait(), RESTORE_WAIT)
        except TimeoutError:
            log.warning("%s: answering a prepare before the start-up restore is done (no devices yet)", self.driver)

    async def restore(self, snapshot: DeviceSnapshot) -> int:
        """Prepare again, and write the specs of, this driver's completed claims that a reboot undid.

        A claim needs it when it was prepared in another boot (or one not known) or its spec is
        missing. A claim that cannot be restored is logged and kept (its next prepare tries
        again, its unprepare releases it). Returns how many were restored.
        """
        if self._restoring or self._restored.is_set():
            await self._restored.wait()
            return 0
        self._restoring = True
        restored = 0
        try:
            for uid in self._to_restore:
                async with self._locks(uid):
                    record = self.store.get(uid)
                    if record is None or not record.completed or not record.spec_file:
                        continue  # unprepared meanwhile
                    new_boot = self.boot_id is not None and record.boot_id != self.boot_id
                    if not new_boot and (self.cdi_dir / record.spec_file).exists():
                        continue
                    why = (
                        f"prepared in an earlier boot ({record.boot_id or 'unknown'})" if new_boot else "its CDI spec is missing"
                    )
                    try:
                        await self._respec(record, snapshot)
                        if new_boot:
                            await self.store.put(attrs.evolve(record, boot_id=self.boot_id))
                    except Exception as exc:
                        log.error("cannot restore claim %s/%s (%s), %s: %s", record.namespace, record.name, uid, why, exc)
                        continue
                    restored += 1
                    log.warning(
                        "restored claim %s/%s (%s): %s",
                        record.namespace,
                        record.name,
                        uid,
                        why,
                        extra={"resource": record.resource},
                    )
        finally:
            self._to_restore = []
            self._restored.set()
        return restored

    # -- unprepare --

    async def unprepare(self, ref: ClaimRef) -> None:
        started = time.perf_counter()
        ok = False
        try:
            claimspec.check_uid(ref.uid)
            async with self._locks(ref.uid):
                await self._read_shared()
                record = self.store.get(ref.uid)
                if record is not None:  # else never prepared here, or already unprepared
                    await self._remove_metadata(record)
                    await undo(record, self.host, self.store, self.cdi_dir, self._step)
                    log.info("unprepared claim %s (%s)", ref, record.state.value, extra={"resource": record.resource})
                await self._status(ref, [])  # also what a failed prepare wrote
            ok = True
            self._check_drained()
        finally:
            self.recorder.unprepare_observed(self.resource.name, self.driver, time.perf_counter() - started, ok)
            self.recorder.claims_prepared(self.resource.name, self.driver, self._prepared_now())


def _entry_name(d: PreparedDevice) -> str:
    return shares.entry_name(d.device, d.share_id)


def _entry(driver: str, node: str, d: PreparedDevice, device: Device, failed: status.Failure | None = None) -> dict[str, Any]:
    """The claim status entry of one device or share (a share's entry carries its ``shareID``)."""
    entry = status.device_status(driver, node, d.device, device, failed)
    if d.share_id is not None:
        entry["shareID"] = d.share_id
    return entry
