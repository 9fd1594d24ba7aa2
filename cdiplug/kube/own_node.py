"""What the daemon does with its own Node object: device labels, Events, the configuration label.

:class:`OwnNode` is handed the process's one Kubernetes client (a
:class:`~cdiplug.kube.factory.SharedClient`: made on first use, so a daemon that asks nothing of
its Node never loads lightkube) and runs, under the supervisor, what is needed:

- ``node-labels`` (:mod:`.node_labels`) once a configuration has ``node_labels: true``; a
  configuration turning it off again has every ``cdiplug.dev/`` label removed;
- ``node-events`` (:mod:`.events`) once anything else here runs: health changes of every
  resource's devices and the configuration errors the daemon reports;
- ``node-config-label`` (:mod:`.config_label`) when the file has named configurations.

The node (:mod:`cdiplug.node`) hands it every configuration it applies and every snapshot the
host reports (:meth:`observe`); the daemon starts the label watch and reports errors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cdiplug.config import Config
from cdiplug.host import BackendHost
from cdiplug.kube.config_label import ConfigLabelWatch
from cdiplug.kube.events import NodeEvents, health_changes
from cdiplug.kube.factory import SharedClient
from cdiplug.kube.node_labels import NodeLabeler
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.models.world import World
from cdiplug.toolkit.supervisor import Supervisor

log = logging.getLogger(__name__)


class OwnNode:
    """The daemon's dealings with its Node; :meth:`close` when the daemon stops."""

    def __init__(
        self,
        world: World,
        supervisor: Supervisor,
        client: SharedClient,
        *,
        label_interval: float = 1.0,
        label_settle: float = 10.0,
        event_interval: float = 60.0,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        self.world = world
        self.supervisor = supervisor
        self.client = client  # the process's one (the daemon closes it)
        self.events = NodeEvents(self.client, world.node_name, interval=event_interval, backoff=backoff)
        self.labeler = NodeLabeler(self.client, world.node_name, interval=label_interval, settle=label_settle, backoff=backoff)
        self.label_watch: ConfigLabelWatch | None = None
        self._host: BackendHost | None = None
        self._labels_running = False
        self._events_running = False
        self._labels_on = False
        self._previous: dict[str, DeviceSnapshot] = {}

    @property
    def active(self) -> bool:
        """Whether anything here talks to the API server (and so Events are sent)."""
        return self._labels_running or self.label_watch is not None

    # -- what the node and the daemon call --

    def configure(self, config: Config, host: BackendHost) -> None:
        """Apply ``config`` (at start and on every reload); ``host`` reports the snapshots."""
        self._host = host
        self._labels_on = config.node_labels
        if config.node_labels and not self._labels_running:
            self._labels_running = True
            self.supervisor.spawn("node-labels", self.labeler.run())
        self.labeler.expect(r.name for r in config.resources if config.node_labels)
        if config.node_labels:
            for resource in config.resources:  # a resource whose backend kept running reports nothing new
                latest = host.latest(resource.name)
                if latest is not None:
                    self.observe(latest)
        self._previous = {k: v for k, v in self._previous.items() if any(r.name == k for r in config.resources)}
        self._ensure_events()

    def observe(self, snapshot: DeviceSnapshot) -> None:
        """Every snapshot the host reports: the resource's labels, and Events for health changes."""
        if self._labels_on and self._host is not None:
            try:
                model = self._host.abilities(snapshot.resource).model_labels
            except KeyError:  # its backend is being replaced: the next snapshot comes from the new one
                return
            self.labeler.offer(snapshot, model)
        previous = self._previous.get(snapshot.resource)
        self._previous[snapshot.resource] = snapshot
        if self.active:
            for reason, message, warning in health_changes(previous, snapshot):
                self.events.emit(reason, message, warning=warning)

    def watch_config_label(self, on_change: Callable[[str | None], None]) -> ConfigLabelWatch:
        """Watch the label ``cdiplug.dev/config`` (once; later calls return the same watch)."""
        if self.label_watch is None:
            self.label_watch = ConfigLabelWatch(self.client, self.world.node_name, on_change)
            self.supervisor.spawn("node-config-label", self.label_watch.run())
            self._ensure_events()
        return self.label_watch

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the Node (only when something here talks to the API server already)."""
        if self.active:
            self._ensure_events()
            self.events.emit(reason, message, warning=warning)

    async def close(self) -> None:
        await self.supervisor.cancel("node-labels", "node-events", "node-config-label")

    def _ensure_events(self) -> None:
        if self.active and not self._events_running:
            self._events_running = True
            self.supervisor.spawn("node-events", self.events.run())
