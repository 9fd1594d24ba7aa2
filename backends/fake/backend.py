"""The fake backend's discovery and health watching (see the package docstring for the contract)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs import field, frozen

from cdiplug.sdk import (
    CONFIG_LIMIT,
    FOLDER,
    MAX_NUMA_NODE,
    Backend,
    CheckedOptions,
    ClaimConfigurable,
    Configured,
    ContainerEdits,
    CounterSet,
    Device,
    DeviceSharing,
    DeviceSnapshot,
    Finding,
    FolderWatch,
    Health,
    HealthCause,
    InputError,
    NodeChecker,
    PoolSharing,
    ResourceConfig,
    SizedOptions,
    SnapshotSink,
    Verdict,
    World,
    brief,
    load_json,
    load_yaml,
    read_text,
    resource_class,
)

from . import shapes
from .claim_config import KIND, FakeClaimConfig, shaped
from .shapes import CapacityOption

log = logging.getLogger(__name__)

MAX_COUNT = 65536


@frozen
class FakeOptions(CheckedOptions, SizedOptions):
    count: int = 2  # how many devices (IDs <class>-0, <class>-1, ...)
    numa_nodes: tuple[int, ...] = ()  # NUMA nodes the devices are spread over, round-robin; none: no topology
    # a YAML/JSON map of device ID to Healthy or Unhealthy, re-read when it changes; missing IDs are Healthy
    health_file: Path | None = None
    # device ID -> attribute name -> str | int | bool (typed attributes that DRA publishes)
    attributes: dict[str, dict[str, Any]] = field(factory=dict)
    # A folder where each prepared device gets a marker file named by its ID, removed when it is
    # released: a preparation tests can see (kill -9 mid-prepare). None: the fake prepares nothing.
    prepared_dir: Path | None = None
    # Sharing and partitions (DRA; :mod:`.shapes`).
    shared: bool = False
    # capacity name -> a quantity ("memory: 80Gi"), or for a shared device its value and request policy
    capacity: dict[str, CapacityOption] = field(factory=dict)
    # profiles each device is cut into, as how many equal parts: [1, 2, 4] is the whole, halves and quarters (DRA)
    partitions: tuple[int, ...] = ()

    def problems(self) -> Iterator[tuple[str, str]]:
        if not 0 <= self.count <= MAX_COUNT:
            yield "count", f"must be between 0 and {MAX_COUNT}, got {self.count}"
        for i, node in enumerate(self.numa_nodes):
            if not 0 <= node <= MAX_NUMA_NODE:
                yield f"numa_nodes[{i}]", f"a NUMA node is between 0 and {MAX_NUMA_NODE}, got {node}"
        for device_id, attributes in self.attributes.items():
            if not isinstance(attributes, Mapping):
                yield f"attributes.{device_id}", "must map attribute names to values"
                continue
            for name, value in attributes.items():
                if not isinstance(name, str) or not name:
                    yield f"attributes.{device_id}", f"attribute names are strings, got {name!r}"
                elif not isinstance(value, (str, int, bool)):
                    yield (
                        f"attributes.{device_id}.{name}",
                        f"must be a string, an integer or true/false, got {type(value).__name__}",
                    )
        yield from shapes.problems(self.shared, self.capacity, self.partitions)

    def device_estimate(self, resource: str) -> tuple[int, int]:
        """How many devices these options make, and the longest ID in bytes (config checks this)."""
        parts = sum(self.partitions) if self.partitions else 1
        longest = f"{resource_class(resource)}-{max(self.count - 1, 0)}"
        if self.partitions:
            longest += f"-{max(self.partitions)}of{max(self.partitions)}"
        return self.count * parts, len(longest.encode())


def env_prefix(resource: str) -> str:
    """``example.com/fpga`` -> ``FAKE_FPGA``."""
    return "FAKE_" + re.sub(r"[^A-Za-z0-9]", "_", resource_class(resource)).upper()


DeviceHealth = tuple[Health, HealthCause | None]
"""A device's line of the health file: its health and the cause given (None: none)."""
HEALTHY: DeviceHealth = (Health.HEALTHY, None)


def read_health_file(path: Path) -> Mapping[str, DeviceHealth]:
    """Parse the health file; a missing file means every device is Healthy.

    Each value is ``Healthy`` or ``Unhealthy``, optionally followed by a cause and its code
    (``Unhealthy thermal=85C``; ``Unhealthy thermal`` for the code ``true``): DRA taints the device
    ``cdiplug.dev/<cause>=<code>``, ``NoSchedule`` while Unhealthy and informational (``None``) on
    a Healthy device. The file is read bounded (a regular file of at most 1 MiB, UTF-8) and parsed
    with the bounds of ``cdiplug.toolkit.safeload``. Raises :class:`InputError` naming the file and
    the entry for anything else that is wrong.
    """
    source = str(path)
    text = read_text(path, CONFIG_LIMIT, "health file", missing_ok=True)
    if text is None:
        return {}
    data = load_json(text, source) if path.suffix == ".json" else load_yaml(text, source, "YAML/JSON")
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InputError("health file must map device IDs to Healthy or Unhealthy", "$", source)
    health: dict[str, DeviceHealth] = {}
    for key, value in data.items():
        where = f"$.{brief(str(key))[1:-1] if len(str(key)) <= 64 else brief(str(key))}"
        state, _, cause = str(value).partition(" ") if isinstance(value, str) else (value, "", "")
        try:
            parsed = Health(state)
        except (ValueError, TypeError):
            raise InputError(
                f"health must be Healthy or Unhealthy, got {brief(value)} (a cause may follow: 'Unhealthy thermal=85C')",
                where,
                source,
            ) from None
        health[str(key)] = (parsed, _cause(cause.strip(), where, source))
    return health


def _cause(text: str, where: str, source: str) -> HealthCause | None:
    if not text:
        return None
    name, _, code = text.partition("=")
    try:
        return HealthCause(name, code or "true")
    except ValueError as exc:
        raise InputError(str(exc), where, source) from None


class FakeBackend(Backend, ClaimConfigurable[FakeClaimConfig], NodeChecker):
    """Serves every resource configured with ``backend: fake``; DRA claims may configure it (``FakeConfig``)."""

    def __init__(self, resources: Sequence[ResourceConfig[FakeOptions]], world: World) -> None:
        self.resources = tuple(resources)
        self.world = world
        # Every device as built once, Healthy, per resource: a health change evolves only the
        # devices whose health differs, so unchanged ones stay the same objects and everything
        # downstream (diffs, the ListAndWatch list, the CDI spec) can tell them apart by identity.
        self._healthy: dict[str, tuple[Device, ...]] = {}
        self._changed: dict[tuple[str, str, DeviceHealth], Device] = {}  # (resource, ID, health): not Healthy as built

    def _devices(self, resource: ResourceConfig[FakeOptions]) -> tuple[Device, ...]:
        devices = self._healthy.get(resource.name)
        if devices is None:
            opts: FakeOptions = resource.options
            cls = resource_class(resource.name)
            prefix = env_prefix(resource.name)
            model = (("model", f"fake {cls}"),)  # one tuple shared by every device, as are the NUMA tuples
            numa: list[tuple[int, ...]] = [(node,) for node in opts.numa_nodes] or [()]
            capacity = {name: c.value for name, c in opts.capacity.items()}
            policies = {name: p for name, c in opts.capacity.items() if (p := c.policy) is not None}
            unshared = DeviceSharing(capacity_policies=policies)  # one value for every device, unless shared
            ids = [f"{cls}-{i}" for i in range(opts.count)]  # one string per device: its ID and its env value
            devices = tuple(
                Device(
                    id=did,
                    numa_nodes=numa[i % len(numa)],
                    edits=ContainerEdits(env=((f"{prefix}_DEVICE_{i}", did),)),
                    attributes=model + tuple(opts.attributes.get(did, {}).items()),
                    capacity=capacity,
                    sharing=DeviceSharing(
                        shared=True,
                        capacity_policies=policies,
                        capacity_env={name: f"{prefix}_{name.upper()}_{i}" for name in opts.capacity},
                    )
                    if opts.shared
                    else unshared,
                )
                for i, did in enumerate(ids)
            )
            if opts.partitions and resource.overlapping_devices:  # else whole devices only (they cannot overlap)
                devices = tuple(
                    p for i, d in enumerate(devices) for p in shapes.partitions_of(d, opts.partitions, f"{prefix}_DEVICE_{i}")
                )
            self._healthy[resource.name] = devices
        return devices

    def _counter_sets(self, resource: ResourceConfig[FakeOptions]) -> tuple[CounterSet, ...]:
        opts = resource.options
        if not opts.partitions or not resource.overlapping_devices:
            return ()
        cls = resource_class(resource.name)
        return tuple(shapes.counter_set(f"{cls}-{i}", opts.partitions) for i in range(opts.count))

    # -- per-claim configuration (ClaimConfigurable) --

    def claim_config_type(self, resource: str) -> type[FakeClaimConfig]:
        return FakeClaimConfig

    def claim_config_kind(self, resource: str) -> str:
        return KIND

    def configure(self, resource: str, device: Device, config: FakeClaimConfig) -> Configured:
        # The device's own variable (FAKE_<CLASS>_DEVICE_<N>, a partition's FAKE_<CLASS>_DEVICE_<N>_<K>OF<P>):
        # its mode goes beside it.
        prefix = f"{env_prefix(resource)}_DEVICE_"
        own = next((k for k, _ in device.edits.env if k.startswith(prefix)), f"{prefix}{device.id.rpartition('-')[2]}")
        return Configured(shaped(device, config, own))

    def snapshot(self, resource: ResourceConfig[FakeOptions], health: Mapping[str, DeviceHealth]) -> DeviceSnapshot:
        devices = self._devices(resource)
        if health:
            # A partition is as healthy as its whole device (attribute "whole").
            devices = tuple(
                self._with_health(resource.name, d, health.get(d.id) or health.get(str(d.attribute("whole", d.id)), HEALTHY))
                for d in devices
            )
        return DeviceSnapshot(
            resource=resource.name,
            devices=devices,
            ids_env=f"{env_prefix(resource.name)}_DEVICES",
            sharing=PoolSharing(self._counter_sets(resource)),
        )

    def _with_health(self, resource: str, device: Device, health: DeviceHealth) -> Device:
        if health == HEALTHY:
            return device
        key = (resource, device.id, health)
        changed = self._changed.get(key)
        if changed is None:
            changed = self._changed[key] = attrs.evolve(device, health=health[0], health_cause=health[1])
        return changed

    async def node_checks(self) -> Sequence[Finding]:
        """A ``health_file`` that is not there (every device Healthy until it is made)."""
        findings = []
        for r in self.resources:
            path = r.options.health_file
            if path is not None and not await asyncio.to_thread(path.is_file):
                findings.append(
                    Finding(
                        "health file",
                        Verdict.WARNING,
                        f"{path} does not exist: every device is Healthy until it is made",
                        "create it (a map of device ID to Healthy or Unhealthy), or fix the path",
                        resource=r.name,
                        field="options.health_file",
                    )
                )
        return findings

    async def run(self, sink: SnapshotSink) -> None:
        watched = [(r, r.options.health_file) for r in self.resources if r.options.health_file is not None]
        async with contextlib.AsyncExitStack() as stack:
            # Watch first, read second: a change between the two can then never be missed.
            watches = [await stack.enter_async_context(FolderWatch(path.parent)) for _, path in watched]
            published: dict[str, DeviceSnapshot] = {}
            # Every health file read at once: each read is a hop to a worker thread, and the last
            # resource's first snapshot (so its registration) would otherwise wait for all the others.
            healths = await asyncio.gather(*(self._health(r) for r in self.resources))
            for resource, health in zip(self.resources, healths):
                snap = published[resource.name] = self.snapshot(resource, health or {})
                sink.publish(snap)
            await asyncio.gather(*(self._watch(r, path, w, sink, published[r.name]) for (r, path), w in zip(watched, watches)))

    async def _health(self, resource: ResourceConfig[FakeOptions]) -> Mapping[str, DeviceHealth] | None:
        """The health file's content, or None when it is broken (logged; the caller keeps the last state)."""
        path = resource.options.health_file
        if path is None:
            return {}
        try:
            return await asyncio.to_thread(read_health_file, path)
        except InputError as exc:
            # A half-edited file must not take devices down or the daemon with it: say why, go on.
            log.error("ignoring health file, keeping the last state: %s", exc, extra={"resource": resource.name})
            return None
        except Exception as exc:  # whatever else a hostile file provokes: the same, with the traceback
            log.error(
                "ignoring health file %s, keeping the last state: %s: %s",
                path,
                type(exc).__name__,
                brief(str(exc), 200),
                exc_info=exc,
                extra={"resource": resource.name},
            )
            return None

    async def _watch(
        self, resource: ResourceConfig[FakeOptions], path: Path, watch: FolderWatch, sink: SnapshotSink, last: DeviceSnapshot
    ) -> None:
        async for names in watch:
            # A ConfigMap volume swaps a "..data" symlink instead of touching the file itself.
            if path.name not in names and FOLDER not in names and not any(n.startswith("..") for n in names):
                continue
            health = await self._health(resource)
            if health is None:
                continue
            snap = self.snapshot(resource, health)
            if snap != last:
                last = snap
                sink.publish(snap)


class PreparingFakeBackend(FakeBackend):
    """The fake backend with a visible preparation (``prepared_dir``): Preparer and Unpreparer."""

    def _marker(self, resource: str, device_id: str) -> Path | None:
        folder = next((r.options.prepared_dir for r in self.resources if r.name == resource), None)
        if folder is None or "/" in device_id or device_id in ("", ".", ".."):
            return None
        return Path(folder) / device_id

    async def prepare(self, resource: str, devices: Sequence[Device]) -> Sequence[Device]:
        for device in devices:
            marker = self._marker(resource, device.id)
            if marker is not None:
                await asyncio.to_thread(_mark, marker)
        return devices

    def release_interval(self, resource: str) -> float | None:
        return None

    async def releasable(self, resource: str) -> Sequence[str]:
        return []

    async def unprepare(self, resource: str, device_ids: Sequence[str]) -> None:
        for device_id in device_ids:
            marker = self._marker(resource, device_id)
            if marker is not None:
                marker.unlink(missing_ok=True)


def _mark(marker: Path) -> None:
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("prepared\n")


def create(resources: Sequence[ResourceConfig[FakeOptions]], world: World) -> FakeBackend:
    """A :class:`PreparingFakeBackend` when some resource has ``prepared_dir``, else a plain one."""
    if any(r.options.prepared_dir is not None for r in resources):
        return PreparingFakeBackend(resources, world)
    return FakeBackend(resources, world)
