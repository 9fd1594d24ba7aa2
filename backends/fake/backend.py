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

from cdiplug.backend import SnapshotSink
from cdiplug.brief import brief
from cdiplug.errors import InputError
from cdiplug.files import CONFIG_LIMIT, read_text
from cdiplug.filewatch import FOLDER, FolderWatch
from cdiplug.model import MAX_NUMA_NODE, ContainerEdits, Device, DeviceSnapshot, Health
from cdiplug.names import resource_class
from cdiplug.resource import ResourceConfig
from cdiplug.safeload import load_json, load_yaml
from cdiplug.world import World

log = logging.getLogger(__name__)

MAX_COUNT = 65536


@frozen
class FakeOptions:
    count: int = 2
    numa_nodes: tuple[int, ...] = ()
    health_file: Path | None = None
    # device ID -> attribute name -> str | int | bool (typed attributes that DRA publishes)
    attributes: dict[str, dict[str, Any]] = field(factory=dict)

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

    def device_estimate(self, resource: str) -> tuple[int, int]:
        """How many devices these options make, and the longest ID in bytes (config checks this)."""
        return self.count, len(f"{resource_class(resource)}-{max(self.count - 1, 0)}".encode())


def env_prefix(resource: str) -> str:
    """``example.com/fpga`` -> ``FAKE_FPGA``."""
    return "FAKE_" + re.sub(r"[^A-Za-z0-9]", "_", resource_class(resource)).upper()


def read_health_file(path: Path) -> Mapping[str, Health]:
    """Parse the health file; a missing file means every device is Healthy.

    The file is read bounded (a regular file of at most 1 MiB, UTF-8) and parsed with the bounds
    of ``cdiplug.safeload``. Raises :class:`InputError` naming the file and the entry for anything
    else that is wrong.
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
    health: dict[str, Health] = {}
    for key, value in data.items():
        try:
            health[str(key)] = Health(value)
        except (ValueError, TypeError):
            raise InputError(
                f"health must be Healthy or Unhealthy, got {brief(value)}",
                f"$.{brief(str(key))[1:-1] if len(str(key)) <= 64 else brief(str(key))}",
                source,
            ) from None
    return health


class FakeBackend:
    """Serves every resource configured with ``backend: fake``."""

    def __init__(self, resources: Sequence[ResourceConfig[FakeOptions]], world: World) -> None:
        self.resources = tuple(resources)
        self.world = world
        # Every device as built once, Healthy, per resource: a health change evolves only the
        # devices whose health differs, so unchanged ones stay the same objects and everything
        # downstream (diffs, the ListAndWatch list, the CDI spec) can tell them apart by identity.
        self._healthy: dict[str, tuple[Device, ...]] = {}
        self._unhealthy: dict[tuple[str, str], Device] = {}  # (resource, ID): the Unhealthy one

    def _devices(self, resource: ResourceConfig[FakeOptions]) -> tuple[Device, ...]:
        devices = self._healthy.get(resource.name)
        if devices is None:
            opts: FakeOptions = resource.options
            cls = resource_class(resource.name)
            prefix = env_prefix(resource.name)
            model = (("model", f"fake {cls}"),)  # one tuple shared by every device, as are the NUMA tuples
            numa: list[tuple[int, ...]] = [(node,) for node in opts.numa_nodes] or [()]
            devices = self._healthy[resource.name] = tuple(
                Device(
                    id=f"{cls}-{i}",
                    numa_nodes=numa[i % len(numa)],
                    edits=ContainerEdits(env=((f"{prefix}_DEVICE_{i}", f"{cls}-{i}"),)),
                    attributes=model + tuple(opts.attributes.get(f"{cls}-{i}", {}).items()),
                )
                for i in range(opts.count)
            )
        return devices

    def snapshot(self, resource: ResourceConfig[FakeOptions], health: Mapping[str, Health]) -> DeviceSnapshot:
        devices = self._devices(resource)
        if health:
            devices = tuple(self._with_health(resource.name, d, health.get(d.id, Health.HEALTHY)) for d in devices)
        return DeviceSnapshot(resource=resource.name, devices=devices, ids_env=f"{env_prefix(resource.name)}_DEVICES")

    def _with_health(self, resource: str, device: Device, health: Health) -> Device:
        if health is Health.HEALTHY:
            return device
        key = (resource, device.id)
        unhealthy = self._unhealthy.get(key)
        if unhealthy is None:
            unhealthy = self._unhealthy[key] = attrs.evolve(device, health=health)
        return unhealthy

    async def run(self, sink: SnapshotSink) -> None:
        watched = [(r, r.options.health_file) for r in self.resources if r.options.health_file is not None]
        async with contextlib.AsyncExitStack() as stack:
            # Watch first, read second: a change between the two can then never be missed.
            watches = [await stack.enter_async_context(FolderWatch(path.parent)) for _, path in watched]
            published: dict[str, DeviceSnapshot] = {}
            for resource in self.resources:
                snap = published[resource.name] = self.snapshot(resource, await self._health(resource) or {})
                sink.publish(snap)
            await asyncio.gather(*(self._watch(r, path, w, sink, published[r.name]) for (r, path), w in zip(watched, watches)))

    async def _health(self, resource: ResourceConfig[FakeOptions]) -> Mapping[str, Health] | None:
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
