"""One-shot discovery: what every configured resource would advertise right now, without serving.

Used by ``cdiplug discover`` and ``cdiplug cdi generate``. It creates each backend as the daemon
would, runs it until every one of its resources has published a snapshot, then stops it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from cdiplug.backend import Abilities, BackendPlugin, abilities_of, load_plugins
from cdiplug.config import Config
from cdiplug.errors import BackendError
from cdiplug.host import group_by_backend
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.models.world import World


class _FirstSnapshots:
    def __init__(self, expected: set[str]) -> None:
        self.expected = expected
        self.snapshots: dict[str, DeviceSnapshot] = {}
        self.done = asyncio.Event()

    def publish(self, snapshot: DeviceSnapshot) -> None:
        if snapshot.resource in self.expected:
            self.snapshots[snapshot.resource] = snapshot
        if self.expected <= self.snapshots.keys():
            self.done.set()


async def discover_once(
    config: Config,
    world: World,
    plugins: Mapping[str, BackendPlugin[Any]] | None = None,
    timeout: float = 30.0,
    abilities: dict[str, Abilities] | None = None,
) -> dict[str, DeviceSnapshot]:
    """The first snapshot of every resource in ``config``, in config order; ``abilities``, when
    given, gets each resource's backend abilities (its model labels, say)."""
    plugins = load_plugins() if plugins is None else plugins
    found: dict[str, DeviceSnapshot] = {}
    for backend_name, resources in group_by_backend(config.resources).items():
        sink = _FirstSnapshots({r.name for r in resources})
        backend = plugins[backend_name].create(resources, world)
        if abilities is not None:
            abilities.update({r.name: abilities_of(backend) for r in resources})
        task = asyncio.create_task(backend.run(sink), name=f"discover:{backend_name}")
        waiter = asyncio.create_task(sink.done.wait())
        try:
            await asyncio.wait({task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if task.done() and not sink.done.is_set():
                task.result()  # re-raises the backend's own error, if any
                missing = sorted(sink.expected - sink.snapshots.keys())
                raise BackendError(f"backend {backend_name} stopped without reporting {', '.join(missing)}")
            if not sink.done.is_set():
                raise BackendError(f"backend {backend_name} reported nothing within {timeout:g} s")
        finally:
            for t in (task, waiter):
                t.cancel()
            await asyncio.gather(task, waiter, return_exceptions=True)
        found.update(sink.snapshots)
    return {r.name: found[r.name] for r in config.resources}
