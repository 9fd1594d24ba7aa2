"""One served resource: its allocator and server, and how a backend's snapshots reach them.

A :class:`ServedResource` takes snapshots with :meth:`~ServedResource.offer`: the allocator hears
at once, and the updater (:meth:`~ServedResource.run_updates`, one task per resource) coalesces a
burst into the newest, skips an unchanged one, writes the CDI spec (in a thread; a failure is
logged, Allocate tries again and fails clearly) and publishes the advertised list to ListAndWatch.
The order depends on what changed: new devices or edits are on disk before the kubelet can pick
them; a health-only change reaches the kubelet first, as its spec stays the same.

The boundary: this module moves snapshots along one resource's pipeline; when tasks run, register
and stop is the manager's business.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .allocator import Allocator
from .cdi.writer import SpecWriter
from .config import ResourceConfig
from .errors import CdiError
from .model import DeviceSnapshot
from .server import ResourceServer

if TYPE_CHECKING:
    from .metrics import Metrics

log = logging.getLogger(__name__)


def same_spec(old: DeviceSnapshot | None, new: DeviceSnapshot) -> bool:
    """Whether the CDI spec of ``new`` equals that of ``old`` (it holds IDs and edits, not health)."""
    if old is None or old.common_edits != new.common_edits or len(old.devices) != len(new.devices):
        return False
    return all(a.id == b.id and a.edits == b.edits for a, b in zip(old.devices, new.devices))


class ServedResource:
    """One resource's allocator, server and snapshot updates; registrations counted for metrics."""

    def __init__(self, config: ResourceConfig, allocator: Allocator, server: ResourceServer, cdi: SpecWriter, metrics: Metrics) -> None:
        self.config = config
        self.allocator = allocator
        self.server = server
        self.cdi = cdi
        self.metrics = metrics
        self.pending: DeviceSnapshot | None = None
        self.applied: DeviceSnapshot | None = None
        self.wake = asyncio.Event()
        self.registrations = 0
        self.log = logging.LoggerAdapter(log, {"resource": config.name})

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def updater_task(self) -> str:
        return f"update:{self.name}"

    @property
    def register_task(self) -> str:
        return f"register:{self.name}"

    # -- snapshots --

    def offer(self, snapshot: DeviceSnapshot) -> None:
        # The allocator hears at once, so an Allocate that made the backend report (binding a
        # function, say) answers from the news; the updater then writes the spec and publishes.
        self.allocator.update(snapshot)
        self.pending = snapshot
        self.wake.set()

    async def run_updates(self) -> None:
        """The updater: apply the newest offered snapshot whenever one comes; runs until cancelled."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            snapshot, self.pending = self.pending, None
            if snapshot is None or snapshot == self.applied:
                continue
            await self._apply(snapshot)

    async def _apply(self, snapshot: DeviceSnapshot) -> None:
        previous, self.applied = self.applied, snapshot
        self.allocator.update(snapshot)
        if same_spec(previous, snapshot):
            # Health or topology only: the spec stays as it is, so the kubelet hears first.
            self._publish()
            await self._write_spec(snapshot)
        else:
            # New devices or edits: their spec is on disk before the kubelet can pick them.
            await self._write_spec(snapshot)
            self._publish()

    async def _write_spec(self, snapshot: DeviceSnapshot) -> None:
        kind = self.config.cdi_kind
        try:
            if await asyncio.to_thread(self.cdi.write, kind, snapshot):
                self.log.info("wrote CDI spec %s", self.cdi.path_for(kind))
        except CdiError as exc:
            # Not fatal: Allocate writes it again and fails with this error if it still cannot.
            self.log.error("cannot write the CDI spec: %s", exc)

    def _publish(self) -> None:
        advertised = self.allocator.advertised
        self.server.publish(advertised)
        healthy = advertised.healthy_count()
        self.metrics.devices(self.name, healthy, len(advertised.devices) - healthy)
        self.log.debug("%d devices advertised, %d healthy", len(advertised.devices), healthy)

    # -- reload --

    def replace_allocator(self, config: ResourceConfig, allocator: Allocator) -> bool:
        """Serve a new config through ``allocator``; the server and its streams stay.

        True when the plugin options changed, so that the kubelet must be told again.
        """
        old_options = self.server.pre_start_required
        self.config = config
        self.allocator = allocator
        if self.applied is not None:
            # Until the new backend reports, answer from what the old one said; then re-apply it
            # under the new config (replicas, CDI kind), published only if the list changed.
            allocator.update(self.applied)
            if self.pending is None:
                self.pending = self.applied
            self.applied = None
            self.wake.set()
        self.server.allocator = allocator
        return self.server.pre_start_required != old_options
