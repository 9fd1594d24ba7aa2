"""Release for the device-plugin API: undo a preparation once the kubelet shows no pod holds it.

The device-plugin API never says when a device is free again. The kubelet's PodResources API
(``List``) says which devices pods hold now, so every so often (the shortest
``ReleasePoller.release_interval`` of the resources served; PodResources has no watch for ``List``)
the :class:`Releaser` asks each resource's backend which devices it would undo
(``ReleasePoller.releasable``, past any grace time the backend keeps) and releases, through the
host's :class:`~cdiplug.host.Preparations` (the backend's ``Unpreparer``), those no pod holds. A kubelet that does not answer
means "don't know": nothing is released until it answers again.

The boundary: when and what to release; the undoing itself is the backend's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cdiplug.errors import CdiplugError, KubeletError
from cdiplug.host import BackendHost
from cdiplug.models.devices import Device
from cdiplug.toolkit.supervisor import Supervisor

if TYPE_CHECKING:
    from cdiplug.wire.pod_resources import AllocatedDevices

log = logging.getLogger(__name__)

Lister = Callable[[Path], Awaitable["AllocatedDevices"]]
TASK = "release"


async def list_allocated(socket: Path) -> AllocatedDevices:
    """:func:`.pod_resources.list_allocated`, imported on first use: most nodes never release, and
    the PodResources stubs cost start-up time and memory."""
    from cdiplug.wire.pod_resources import list_allocated as list_from_kubelet

    return await list_from_kubelet(socket)


class Releaser:
    """Releases unheld devices of the resources whose backend polls for release (a ReleasePoller)."""

    def __init__(self, host: BackendHost, socket: Path, supervisor: Supervisor, lister: Lister = list_allocated) -> None:
        self.host = host
        self.socket = Path(socket)
        self.supervisor = supervisor
        self.lister = lister
        self._intervals: dict[str, float] = {}

    @property
    def resources(self) -> list[str]:
        return sorted(self._intervals)

    def update(self, resources: Mapping[str, object]) -> None:
        """Look after these resources from now on (those whose backend polls for release)."""
        intervals = {}
        for name in resources:
            poller = self.host.abilities(name).release_poller
            interval = poller.release_interval(name) if poller is not None else None
            if interval is not None:
                intervals[name] = interval
        self._intervals = intervals

    def start(self) -> None:
        """Run :meth:`run` under the supervisor, if there is anything to look after."""
        if self._intervals and not self.supervisor.running(TASK):
            self.supervisor.spawn(TASK, self.run())

    async def stop(self) -> None:
        await self.supervisor.cancel(TASK)

    async def once(self) -> list[tuple[str, str]]:
        """One round: the (resource, device ID) pairs released. Raises KubeletError."""
        if not self._intervals:
            return []
        held = await self.lister(self.socket)
        released: list[tuple[str, str]] = []
        for name in sorted(self._intervals):
            poller = self.host.abilities(name).release_poller
            if poller is None:
                continue
            holding = held.underlying(name)
            free = [i for i in await poller.releasable(name) if i not in holding]
            if not free:
                continue
            snapshot = self.host.latest(name)
            devices = [(snapshot.get(i) if snapshot is not None else None) or Device(id=i) for i in free]
            for device in devices:
                try:
                    await self.host.preparations(name).release(name, [device])
                except CdiplugError as exc:
                    log.warning(
                        "could not release %s of %s: %s", device.id, name, exc, extra={"resource": name, "device": device.id}
                    )
                    continue
                log.info("released %s of %s: no pod holds it", device.id, name, extra={"resource": name, "device": device.id})
                released.append((name, device.id))
        return released

    async def run(self) -> None:
        while self._intervals:
            try:
                await self.once()
            except KubeletError as exc:
                log.warning("release is waiting for the kubelet: %s", exc)
            except CdiplugError as exc:
                log.error("release failed this round: %s", exc)
            await asyncio.sleep(min(self._intervals.values(), default=30.0))
