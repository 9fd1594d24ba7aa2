"""``release: restore``: give bound functions back to their original driver once no pod holds them.

Every ``release_interval`` seconds the releaser asks the kubelet's PodResources API (``List``)
which devices pods hold, and restores each function cdiplug bound for a resource with
``release: restore`` that no pod holds any more. A function bound less than ``release_grace``
seconds ago is left alone: the kubelet records an allocation only after our Allocate answer, so a
fresh bind would otherwise look unheld. A kubelet that does not answer means "don't know": nothing
is restored until it answers again. The backend publishes the new snapshot (and so the CDI spec
follows) after a restore.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from cdiplug.errors import CdiplugError, KubeletError
from cdiplug.pod_resources import AllocatedDevices, list_allocated

from .journal import Journal
from .options import PciOptions, Release

log = logging.getLogger(__name__)

Restore = Callable[[Sequence[str]], Awaitable[object]]
Lister = Callable[[Path], Awaitable[AllocatedDevices]]


class Releaser:
    """Restores unheld functions of the resources that ask for it."""

    def __init__(
        self,
        options: Mapping[str, PciOptions],
        journal: Journal,
        socket: Path,
        restore: Restore,
        lister: Lister = list_allocated,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.options = {name: o for name, o in options.items() if o.release is Release.RESTORE}
        self.journal = journal
        self.socket = Path(socket)
        self.restore = restore
        self.lister = lister
        self.clock = clock

    @property
    def active(self) -> bool:
        return bool(self.options)

    @property
    def interval(self) -> float:
        return min((o.release_interval for o in self.options.values()), default=30.0)

    async def once(self) -> list[str]:
        """One round: the addresses it restored. Raises KubeletError when the kubelet does not answer."""
        if not self.options:
            return []
        held = await self.lister(self.socket)
        records = await asyncio.to_thread(self.journal.all_bound)
        now = self.clock()
        restored = []
        for address, record in sorted(records.items()):
            options = self.options.get(record.resource or "")
            if options is None or address in held.underlying(record.resource or ""):
                continue
            if now - record.bound_at < options.release_grace:
                continue
            try:
                await self.restore([address])
            except CdiplugError as exc:
                log.warning("could not release %s of %s: %s", address, record.resource, exc)
                continue
            log.info("released %s of %s: no pod holds it", address, record.resource)
            restored.append(address)
        return restored

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except KubeletError as exc:
                log.warning("release: restore is waiting for the kubelet: %s", exc)
            except CdiplugError as exc:
                log.error("release: restore failed this round: %s", exc)
            await asyncio.sleep(self.interval)  # PodResources has no watch for List: a timer it is
