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
- **drain** (the resource leaves DRA on this node while claims are prepared: :mod:`.drain`):
  claims not prepared yet are refused, prepared ones still answered and unprepared.
- **restore** (at start, on the driver's first snapshot: :mod:`.restore`): completed claims a
  reboot undid are planned again from their records and materialized; prepares wait for it.

What a claim means is planned once (:class:`~cdiplug.dra.plan.ClaimPlan`, every check that can
fail it before anything is touched) and carried out by :func:`~cdiplug.dra.plan.materialize`,
the one step a prepare and a restore share; the claim's status is written by
:class:`~cdiplug.dra.statuswriter.StatusWriter`.

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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs

from cdiplug.backend import ClaimConfigurable
from cdiplug.dra import claimspec, status
from cdiplug.dra.checkpoint import ClaimState, ClaimStore, PreparedClaim, PreparedDevice
from cdiplug.dra.claims import ClaimRef
from cdiplug.dra.drain import Drain
from cdiplug.dra.handler import ClaimHandler
from cdiplug.dra.plan import ClaimPlan, Planner, check_unchanged, materialize, no_step, read_claim
from cdiplug.dra.restore import Restorer
from cdiplug.dra.rollback import Step, undo
from cdiplug.dra.settings import driver_of, settings_of
from cdiplug.dra.statuswriter import StatusWriter
from cdiplug.errors import DeviceUnavailable
from cdiplug.host import BackendHost
from cdiplug.kube.client import KubeClient
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.resource import ResourceConfig
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.keyedlock import KeyedLock

log = logging.getLogger(__name__)

PAUSE_ENV = "CDIPLUG_DRA_PAUSE_AFTER"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
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


@attrs.frozen
class NodeContext:
    """Where a driver's claims are prepared: this node, as every claim preparer of the daemon sees it.

    ``name``: the node's name (whose pool's results are ours). ``boot_id``: the node's boot ID
    (:func:`read_boot_id`), recorded with each claim so that a restore can tell a reboot; None
    when it cannot be read. ``plugins_dir``: the kubelet's plugins folder, below which device
    metadata (``device_metadata: true``) is written; None when none is. ``instance``: our pod UID,
    recorded as the owner of what we start preparing (empty without ``--pod-uid``).
    ``pause_after``: the test hook's step (:data:`PAUSE_ENV` when None).
    """

    name: str
    boot_id: str | None = None
    plugins_dir: Path | None = None
    instance: str = ""
    pause_after: str | None = None


class ClaimPreparer(ClaimHandler):
    """NodePrepareResources and NodeUnprepareResources of one driver, as plain calls."""

    def __init__(
        self,
        resource: ResourceConfig[Any],
        node: NodeContext,
        host: BackendHost,
        store: ClaimStore,
        client: Callable[[], KubeClient],
        recorder: Recorder = NULL_RECORDER,
    ) -> None:
        self.resource = resource
        self.plugins_dir = node.plugins_dir  # device metadata (``device_metadata: true``) goes below it
        self.driver = driver_of(resource)
        self.node = node.name
        self.host = host
        self.store = store
        self.client = client
        self.recorder = recorder
        self.pause_after = node.pause_after if node.pause_after is not None else os.environ.get(PAUSE_ENV) or None
        self.boot_id = node.boot_id
        self.instance = node.instance  # our pod UID, recorded as the owner of what we start preparing
        self._locks: KeyedLock[str] = KeyedLock()
        self._status = StatusWriter(client, self.driver)
        self._restorer = Restorer(store, self.driver, host.specs, node.boot_id, self._locks, self._respec)
        self._drain = Drain(store, self.driver)
        self._known = asyncio.Event()  # set by devices_known(): the backend has reported

    @property
    def resource_name(self) -> str:
        return self.resource.name

    def drain(self, drained: Callable[[], None]) -> None:
        """The driver leaves this node: refuse claims not prepared here, go on unpreparing, and
        call ``drained`` once no claim of the driver is in the checkpoint (at once when none is)."""
        self._drain.start(drained)

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

    def _configurable(self) -> ClaimConfigurable[Any] | None:
        return self.host.abilities(self.resource.name).configurable

    def _planner(self) -> Planner:
        """Planned with the resource as configured now (a reload may change it) and its backend's abilities."""
        rc = self.resource
        metadata_dir = self.plugins_dir if settings_of(rc).device_metadata else None
        return Planner(
            self.driver,
            rc.name,
            self.node,
            self._configurable(),
            metadata_dir,
            self.boot_id,
            self.instance,
            self.host.specs.names,
        )

    # -- prepare --

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        started = time.perf_counter()
        ok = False
        try:
            claimspec.check_uid(ref.uid)
            await self._wait_devices()
            await self._restorer.wait(self.host.latest(self.resource.name))
            async with self._locks(ref.uid):
                await self._read_shared()
                done = self.store.get(ref.uid)
                if done is not None and done.driver == self.driver and done.completed:
                    await self._same_configuration(ref, done)
                    await self._ensure_spec(done)
                    ok = True
                    return done
                if self._drain.active:
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
        planner = self._planner()
        read = await read_claim(self.client(), ref, self.driver, self.node, pod_claim=planner.metadata_dir is not None)
        plan = planner.fresh(read, self.host.latest(self.resource.name))  # every check, before any side effect
        if plan.empty:
            await self.store.put(plan.record)
            return plan.record
        record = plan.record
        # PrepareStarted, before anything is touched. Not fsynced: it guards against the process
        # dying; what a power loss resets (VFIO bindings, the tmpfs CDI folder) needs no guard, and
        # the PCI backend journals its own steps durably.
        await self.store.put(record, durable=False)
        try:
            await self._step(Step.STARTED, ref.uid)
            devices = await self._materialize(plan, self._step)
        except asyncio.CancelledError:  # the kubelet gave up (restarted, timed out): never answered, so undone
            await asyncio.shield(self._roll_back(record, "its prepare call was cancelled"))
            log.warning("claim %s: the prepare call was cancelled (the kubelet went away); rolled back", ref)
            raise
        except Exception as exc:
            await self._roll_back(record, "its preparation failed")
            failed = status.Failure(status.PREPARE_FAILED, str(exc))
            self._write_status(
                ref, [_entry(self.driver, self.node, d, w, failed) for d, w in zip(record.devices, plan.wanted.values())]
            )
            raise
        done = attrs.evolve(record, state=ClaimState.COMPLETED)
        await self.store.put(done)
        await self._step(Step.COMPLETED, ref.uid)
        self._write_status(ref, [_entry(self.driver, self.node, d, device) for d, (_, device) in zip(record.devices, devices)])
        log.info(
            "prepared claim %s: %s", ref, ", ".join(d.device for d in done.devices), extra={"resource": plan.record.resource}
        )
        return done

    async def _materialize(
        self, plan: ClaimPlan, step: Callable[[Step, str], Awaitable[None]] = no_step
    ) -> list[tuple[str, Device]]:
        preparations = self.host.preparations(self.resource.name)
        return await materialize(plan, preparations, self._configurable(), self.host.specs, step)

    def _write_status(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """Our entries of the claim's ``status.devices`` (KEP-4817), in the background (:class:`~.statuswriter.StatusWriter`)."""
        self._status.write(ref.namespace, ref.name, ref.uid, entries)

    async def status_settled(self) -> None:
        """Until every status write begun so far has ended (tests; a clean stop)."""
        await self._status.settled()

    async def _same_configuration(self, ref: ClaimRef, done: PreparedClaim) -> None:
        if done.configs:  # else answered from the checkpoint without a read, as ever
            await check_unchanged(self.client, ref, done, self.node)

    async def _roll_back(self, record: PreparedClaim, why: str) -> None:
        try:
            await undo(record, self.host, self.store, plugins_dir=self.plugins_dir)
        except Exception as exc:  # kept as started: unprepare or the next start tries again
            log.error("claim %s/%s (%s): %s, and rolling it back failed: %s", record.namespace, record.name, record.uid, why, exc)

    async def _ensure_spec(self, done: PreparedClaim) -> None:
        """Write the spec of a checkpointed claim again if it went missing; DeviceUnavailable when it cannot be."""
        if not done.spec_file or claimspec.exists(self.host.specs, done.uid):
            return
        snapshot = self.host.latest(self.resource.name)
        if snapshot is None:  # never answer CDI names whose spec is not there: the kubelet retries
            raise DeviceUnavailable(f"{self.driver}: the CDI spec of claim {done.uid} is missing and no devices are known yet")
        await self._respec(done, snapshot)

    async def _respec(self, record: PreparedClaim, snapshot: DeviceSnapshot) -> None:
        """A completed claim planned again from its record and materialized (the host's preparation is idempotent)."""
        await self._materialize(await self._planner().again(record, snapshot))
        log.info("prepared claim %s/%s (%s) again and wrote its CDI spec", record.namespace, record.name, record.uid)

    # -- restore at start (:mod:`.restore`) --

    @property
    def restore_pending(self) -> bool:
        return self._restorer.pending

    def devices_known(self) -> None:
        """The backend has reported its first snapshot: prepares waiting for it go on."""
        self._known.set()

    async def _wait_devices(self) -> None:
        # The kubelet calls as soon as we register, which may be before the backend's first
        # scan; a prepare then waits for it rather than fail and wait for the kubelet's retry.
        if self._known.is_set() or self.host.latest(self.resource.name) is not None:
            return
        try:
            async with asyncio.timeout(DEVICES_WAIT):
                await self._known.wait()
        except TimeoutError:
            pass  # the prepare answers "no devices known yet"

    async def restore(self, snapshot: DeviceSnapshot) -> int:
        """Prepare again, and write the specs of, this driver's completed claims that a reboot undid; how many."""
        return await self._restorer.restore(snapshot)

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
                    if self.instance and record.owner != self.instance:
                        # Ours from now on: the other pod of a rolling update, which may keep its
                        # spec, lets it go (:meth:`DraFrontEnd.spec_wanted`) rather than write it again.
                        record = attrs.evolve(record, owner=self.instance)
                        await self.store.put(record)
                    await undo(record, self.host, self.store, self._step, self.plugins_dir)
                    log.info("unprepared claim %s (%s)", ref, record.state.value, extra={"resource": record.resource})
                self._write_status(ref, [])  # also what a failed prepare wrote
            ok = True
            self._drain.check()
        finally:
            self.recorder.unprepare_observed(self.resource.name, self.driver, time.perf_counter() - started, ok)
            self.recorder.claims_prepared(self.resource.name, self.driver, self._prepared_now())


def _entry(driver: str, node: str, d: PreparedDevice, device: Device, failed: status.Failure | None = None) -> dict[str, Any]:
    """The claim status entry of one device or share (a share's entry carries its ``shareID``)."""
    entry = status.device_status(driver, node, d.device, device, failed)
    if d.share_id is not None:
        entry["shareID"] = d.share_id
    return entry
