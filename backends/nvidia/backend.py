"""The NVIDIA backend: NVML discovery, snapshots per resource, XID health with recovery, topology.

:meth:`NvidiaBackend.run` starts NVML, finds the GPUs, gives each to the first resource that
selects it, publishes one snapshot per resource, then keeps health current: XID events (from the
:class:`~.health.EventWatcher` thread, passed to the event loop) mark a GPU Unhealthy at once, and
a re-probe task per resource brings unhealthy GPUs back after N clean probes. Without NVML (no
driver library, no driver) or without GPUs every resource gets an empty snapshot and one clear
log line; a resource with ``fail_on_init_error: true`` turns that into
:class:`~cdiplug.errors.BackendInitError` instead (the daemon exits with status 2).

The backend also answers GetPreferredAllocation with the best-connected GPUs
(:mod:`.topology`) and offers the same pairwise score to the core policy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from cdiplug.sdk import (
    Backend,
    BackendInitError,
    ClaimConfigurable,
    Configured,
    ContainerEdits,
    Device,
    DeviceSnapshot,
    Finding,
    HealthCause,
    ModelLabels,
    NodeChecker,
    PairwiseAffinity,
    PreferredAllocator,
    PreferredRequest,
    ResourceConfig,
    SnapshotSink,
    World,
    underlying,
)

from . import checks, claim_config, topology
from .cdi_kind import clash_problem
from .discovery import (
    Gpu,
    Inventory,
    assign,
    assign_migs,
    build_mig_snapshot,
    build_snapshot,
    control_nodes,
    discover,
    model_labels,
    node_present,
)
from .driver import driver_mounts
from .health import (
    DEFAULT_WAIT_MS,
    NO_XID_EVENTS,
    NODE_MISSING,
    EventWatcher,
    HealthTracker,
    Verdict,
    classify,
    probe_cause,
    probe_gpu,
    xid_cause,
)
from .mig import MigInfo
from .nvml import Nvml, NvmlError, NvmlEvent, NvmlUnavailable
from .options import NvidiaOptions

log = logging.getLogger(__name__)

T = TypeVar("T")


class NvidiaBackend(
    Backend, PreferredAllocator, PairwiseAffinity, ModelLabels, ClaimConfigurable[claim_config.GpuClaimConfig], NodeChecker
):
    """Serves every resource configured with ``backend: nvidia`` (one NVML session for all)."""

    def __init__(
        self,
        resources: Sequence[ResourceConfig[NvidiaOptions]],
        world: World,
        *,
        nvml: Any = None,
        event_wait_ms: int = DEFAULT_WAIT_MS,
    ) -> None:
        self.resources = tuple(resources)
        self.world = world
        self.nvml_module = nvml  # an NVML-like module (pynvml, cdiplug_backends.nvidia.testing.FakeNvml); None: pynvml
        self.event_wait_ms = event_wait_ms
        self._options: dict[str, NvidiaOptions] = {r.name: r.options for r in self.resources}
        self._gpus: dict[str, tuple[Gpu, ...]] = {r.name: () for r in self.resources}
        self._owner: dict[str, str] = {}  # GPU UUID -> the first resource it serves
        self._owners: dict[str, tuple[str, ...]] = {}  # GPU UUID -> every resource it serves (MIG: several)
        self._migs: dict[str, tuple[tuple[Gpu, MigInfo, ContainerEdits], ...]] = {}
        self._trackers = {r.name: HealthTracker(r.options.clean_probes) for r in self.resources}
        self._common: dict[str, ContainerEdits] = {}
        self._skipped: tuple[tuple[str, str], ...] = ()
        self._topology = topology.Topology()
        self._last: dict[str, DeviceSnapshot] = {}
        self._reprobe_now: dict[str, asyncio.Event] = {}
        self._sink: SnapshotSink | None = None
        self._nvml: Nvml | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        for r in self.resources:
            problem = clash_problem(r.cdi_kind)
            if problem:
                log.warning("%s", problem, extra={"resource": r.name})

    # --- the Backend protocol ------------------------------------------------------------------

    async def node_checks(self) -> Sequence[Finding]:
        """The driver and NVML (:mod:`.checks`)."""
        return await asyncio.to_thread(lambda: list(checks.findings(self.world, self.nvml_module)))

    async def run(self, sink: SnapshotSink) -> None:
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self._reprobe_now = {r.name: asyncio.Event() for r in self.resources}
        try:
            nvml = await asyncio.to_thread(_start, self.nvml_module)
        except NvmlUnavailable as exc:
            await self._without_gpus(f"NVML is not available: {exc} (no NVIDIA driver or driver library on this node?)", exc)
            return
        self._nvml = nvml
        watcher: EventWatcher | None = None
        try:
            try:
                inventory = await asyncio.to_thread(discover, nvml, self.world)
            except NvmlError as exc:
                await self._without_gpus(f"NVML cannot list GPUs: {exc}", exc)
                return
            await self._adopt(nvml, inventory)
            for name in self._gpus:
                self._publish(name)
            everything = list({g.uuid: g for gpus in self._gpus.values() for g in gpus}.values())  # a MIG GPU: once
            if everything:
                watcher = EventWatcher(
                    nvml, everything, self._from_thread(self._on_event), self._from_thread(self._on_error), self.event_wait_ms
                )
                try:
                    failed = await asyncio.to_thread(watcher.start)
                except NvmlError as exc:
                    log.error("cannot watch NVML events (%s); GPU health comes from probing only", exc)
                    watcher, failed = None, {}
                for uuid, why in failed.items():
                    self._mark(uuid, why, NO_XID_EVENTS)
            async with asyncio.TaskGroup() as tasks:
                for name, gpus in self._gpus.items():
                    if gpus:
                        tasks.create_task(self._reprobe_loop(name), name=f"nvidia:reprobe:{name}")
                tasks.create_task(asyncio.Event().wait(), name="nvidia:idle")  # run until cancelled
        finally:
            await self._stop(watcher, nvml)

    def preferred_allocation(self, resource: str, snapshot: DeviceSnapshot, request: PreferredRequest) -> Sequence[str] | None:
        options = self._options.get(resource)
        if options is None or options.mig_profiles or not self._gpus.get(resource):
            return None  # MIG devices: no GPU topology between them to prefer by
        return topology.preferred(request, self._topology.score, options.replica_strategy)

    def affinity(self, resource: str, a: Device, b: Device) -> float:
        return float(self._topology.score(underlying(a.id), underlying(b.id)))

    def model_labels(self, resource: str, snapshot: DeviceSnapshot) -> Mapping[str, str | int]:
        return model_labels(snapshot)

    # --- start and stop ----------------------------------------------------------------------

    # -- per-claim configuration (ClaimConfigurable): sharing through env only (claim_config) --

    def claim_config_type(self, resource: str) -> type[claim_config.GpuClaimConfig]:
        return claim_config.GpuClaimConfig

    def claim_config_kind(self, resource: str) -> str:
        return claim_config.KIND

    def configure(self, resource: str, device: Device, config: claim_config.GpuClaimConfig) -> Configured:
        return claim_config.configure(device, config)

    async def _without_gpus(self, problem: str, cause: NvmlError) -> None:
        """No NVML or no GPU list: fail where asked to, else empty snapshots and wait."""
        self._refuse_or_warn([r.name for r in self.resources], problem, cause)
        self._skipped = (("NVML", problem),)
        for r in self.resources:
            self._publish(r.name)
        await asyncio.Event().wait()

    async def _adopt(self, nvml: Nvml, inventory: Inventory) -> None:
        """Take the GPUs found: assign them, read topology and edits, check device nodes."""
        self._skipped = inventory.skipped
        if not inventory.gpus:
            self._refuse_or_warn([r.name for r in self.resources], "NVML found no GPU on this node")
        self._gpus = assign(inventory.gpus, self.resources)
        self._migs = assign_migs(inventory.gpus, self.resources)
        owners: dict[str, list[str]] = {}
        for name, gpus in self._gpus.items():
            for g in gpus:
                owners.setdefault(g.uuid, []).append(name)
        self._owners = {uuid: tuple(names) for uuid, names in owners.items()}
        self._owner = {uuid: names[0] for uuid, names in self._owners.items()}
        whole = [
            g
            for g in inventory.gpus
            if g.mig_on and any(not r.options.mig_profiles and r.options.selects(g.info) for r in self.resources)
        ]
        self._skipped = (
            *self._skipped,
            *((g.uuid, "MIG mode is on: served as its MIG devices (mig_profiles), never whole") for g in whole),
        )
        if inventory.gpus:
            empty = [name for name, gpus in self._gpus.items() if not gpus]
            if empty:
                self._refuse_or_warn(empty, "no GPU on this node matches the selectors")
        for gpu in inventory.gpus:
            owner = self._owner.get(gpu.uuid, "no resource")
            log.info(
                "GPU %d %s (%s, %s, NUMA %s) -> %s",
                gpu.info.index, gpu.uuid, gpu.info.name, gpu.info.pci_bus_id,
                "none" if gpu.numa_node is None else gpu.numa_node, owner,
            )  # fmt: skip
        chosen = [g for gpus in self._gpus.values() for g in gpus]
        self._topology = await asyncio.to_thread(topology.read_topology, nvml, chosen)
        self._common = await asyncio.to_thread(self._common_edits)
        missing = await asyncio.to_thread(lambda: [g for g in chosen if not node_present(self.world, g.device_path)])
        for gpu in missing:
            self._mark(gpu.uuid, f"device node {gpu.device_path} is missing", NODE_MISSING, publish=False)

    def _refuse_or_warn(self, names: list[str], problem: str, cause: NvmlError | None = None) -> None:
        """BackendInitError when one of ``names`` sets fail_on_init_error, else one warning line."""
        strict = [n for n in names if self._options[n].fail_on_init_error]
        if strict:
            raise BackendInitError(f"{problem}; {_resources(strict)} sets fail_on_init_error") from cause
        log.warning("%s; %s %s no GPUs", problem, _resources(names), "advertises" if len(names) == 1 else "advertise")

    def _common_edits(self) -> dict[str, ContainerEdits]:
        nodes = control_nodes(self.world)
        return {
            r.name: ContainerEdits(device_nodes=nodes, mounts=driver_mounts(self.world, self._options[r.name]))
            for r in self.resources
        }

    async def _stop(self, watcher: EventWatcher | None, nvml: Nvml) -> None:
        def stop() -> None:
            if watcher is not None:
                watcher.stop()
            try:
                nvml.shutdown()
            except NvmlError as exc:
                log.warning("NVML shutdown failed: %s", exc)

        # The thread runs to the end even if this task is cancelled again meanwhile.
        await asyncio.shield(asyncio.to_thread(stop))

    # --- health --------------------------------------------------------------------------------

    def _from_thread(self, handler: Callable[[T], None]) -> Callable[[T], None]:
        """A callable for the watcher thread that runs ``handler`` on the event loop instead."""
        loop = self._loop
        assert loop is not None

        def post(arg: T) -> None:
            try:
                loop.call_soon_threadsafe(handler, arg)
            except RuntimeError:
                pass  # the loop is closing; the watcher is being stopped

        return post

    def _on_event(self, event: NvmlEvent) -> None:
        owner = self._owner.get(event.uuid) if event.uuid else None
        ignored = self._options[owner].ignored_xids if owner else ()
        verdict = classify(event, self._owner, ignored)
        if verdict is Verdict.REPROBE:
            log.warning("NVML event %#x (data %d) names no GPU; re-probing every GPU", event.event_type, event.data)
            self._reprobe_everything()
        elif verdict is Verdict.UNHEALTHY:
            log.error("XID %d on GPU %s: marking it Unhealthy", event.data, event.uuid, extra={"resource": owner})
            assert event.uuid is not None  # classify calls an event UNHEALTHY only for a GPU it names
            self._mark(event.uuid, f"XID {event.data}", xid_cause(event.data))
        elif event.is_xid and owner:
            log.info("XID %d on GPU %s ignored (application error)", event.data, event.uuid, extra={"resource": owner})

    def _on_error(self, message: str) -> None:
        log.warning("waiting for NVML events failed (%s); re-probing every GPU", message)
        self._reprobe_everything()

    def _reprobe_everything(self) -> None:
        for name, event in self._reprobe_now.items():
            if self._gpus.get(name):
                event.set()

    def _mark(self, uuid: str, reason: str, cause: HealthCause, publish: bool = True) -> None:
        for owner in self._owners.get(uuid, ()):  # a MIG GPU: every resource of its MIG devices
            self._trackers[owner].mark_unhealthy(uuid, reason, cause)
            if publish:
                self._publish(owner)

    async def _reprobe_loop(self, name: str) -> None:
        """Ask unhealthy GPUs again every interval; every GPU when an event asks for it."""
        options = self._options[name]
        tracker = self._trackers[name]
        trigger = self._reprobe_now[name]
        nvml = self._nvml
        assert nvml is not None
        while True:
            try:
                await asyncio.wait_for(trigger.wait(), options.reprobe_interval_s)
                everyone = True
            except TimeoutError:
                everyone = False
            trigger.clear()
            bad = set(tracker.unhealthy())
            targets = [g for g in self._gpus[name] if everyone or g.uuid in bad]
            if not targets:
                continue
            results = await asyncio.to_thread(lambda: [(g, probe_gpu(nvml, self.world, g)) for g in targets])
            changed = False
            for gpu, problem in results:
                if problem is None:
                    if tracker.probe_passed(gpu.uuid):
                        log.info("GPU %s answers cleanly again: marking it Healthy", gpu.uuid, extra={"resource": name})
                        changed = True
                elif tracker.probe_failed(gpu.uuid, problem, probe_cause(problem)):
                    log.error("GPU %s failed a probe (%s): marking it Unhealthy", gpu.uuid, problem, extra={"resource": name})
                    changed = True
            if changed:
                self._publish(name)

    # --- snapshots -----------------------------------------------------------------------------

    def snapshot(self, name: str) -> DeviceSnapshot:
        if self._options[name].mig_profiles:
            return build_mig_snapshot(
                name,
                self._migs.get(name, ()),
                self._trackers[name].health_map(),
                self._common.get(name, ContainerEdits()),
                self._skipped,
                causes=self._trackers[name].causes(),
            )
        return build_snapshot(
            name,
            self._gpus.get(name, ()),
            self._trackers[name].health_map(),
            self._common.get(name, ContainerEdits()),
            self._skipped,
            causes=self._trackers[name].causes(),
            shared=self._options[name].shared,
        )

    def _publish(self, name: str) -> None:
        snap = self.snapshot(name)
        if self._last.get(name) == snap and name in self._last:
            return
        self._last[name] = snap
        assert self._sink is not None
        self._sink.publish(snap)


def _resources(names: Sequence[str]) -> str:
    return ("resource " if len(names) == 1 else "resources ") + ", ".join(names)


def _start(module: Any | None) -> Nvml:
    """Load NVML (the module given, or pynvml when None) and initialize it. Blocking."""
    nvml = Nvml.load(module)
    nvml.init()
    return nvml
