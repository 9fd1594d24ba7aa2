"""Events on the daemon's own Node: device health changes, configuration errors.

``kubectl describe node`` shows them: core v1 Events whose ``involvedObject`` is the Node, with
the node's name as its UID as the kubelet writes them (kubectl looks for those too), in the
namespace ``default``, where the API server keeps Events about cluster-scoped objects. Best effort: an Event the server refuses is logged and dropped; the
daemon never waits for one.

Rate-limited per reason: at most one Event per ``reason`` every ``interval`` seconds; what comes
sooner is held (the latest message of each reason, and how many were held) and sent when the
interval ends, as one Event with that ``count``. So a flapping device makes one Event a minute,
whatever its rate, and the memory held is one message per reason.

The boundary: what an Event says and when it is sent; the call is :mod:`.client`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from attrs import define

from cdiplug.errors import CdiplugError
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.toolkit.backoff import Backoff

if TYPE_CHECKING:
    from lightkube.resources.core_v1 import Event

    from cdiplug.kube.client import KubeClient

log = logging.getLogger(__name__)

COMPONENT = "cdiplug"
NAMESPACE = "default"  # an Event about a cluster-scoped object must be here (the server's validation)
MAX_MESSAGE = 1024  # the API server refuses longer messages
MAX_LISTED = 8  # devices named in one health Event


@define
class _Held:
    message: str
    warning: bool
    count: int = 1


def health_changes(previous: DeviceSnapshot | None, snapshot: DeviceSnapshot) -> list[tuple[str, str, bool]]:
    """``(reason, message, warning)`` for the devices of ``snapshot`` whose health changed since
    ``previous`` (a device first seen Unhealthy counts: it was never healthy here)."""
    before = {d.id: d.healthy for d in previous.devices} if previous is not None else {}
    sick = [d for d in snapshot.devices if not d.healthy and before.get(d.id, True)]
    well = [d.id for d in snapshot.devices if d.healthy and before.get(d.id) is False]
    out = []
    if sick:
        named = ", ".join(f"{d.id} ({d.cause.name if d.cause else 'unhealthy'})" for d in sick[:MAX_LISTED])
        more = f" and {len(sick) - MAX_LISTED} more" if len(sick) > MAX_LISTED else ""
        out.append(("DeviceUnhealthy", f"{snapshot.resource}: {named}{more} Unhealthy", True))
    if well:
        more = f" and {len(well) - MAX_LISTED} more" if len(well) > MAX_LISTED else ""
        out.append(("DeviceHealthy", f"{snapshot.resource}: {', '.join(well[:MAX_LISTED])}{more} Healthy again", False))
    return out


def event_body(node: str, reason: str, message: str, warning: bool, count: int, now: datetime.datetime) -> Event:
    from lightkube.models.core_v1 import EventSource, ObjectReference  # lightkube only once an Event is sent
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Event

    stamp = now.replace(microsecond=0)
    return Event(
        metadata=ObjectMeta(generateName=f"{node}.cdiplug."),
        involvedObject=ObjectReference(apiVersion="v1", kind="Node", name=node, uid=node),
        reason=reason,
        message=message[:MAX_MESSAGE],
        type="Warning" if warning else "Normal",
        count=count,
        firstTimestamp=stamp,
        lastTimestamp=stamp,
        source=EventSource(component=COMPONENT, host=node),
        reportingComponent=COMPONENT,
        reportingInstance=node,
    )


class NodeEvents:
    """Sends Events about Node ``node`` into ``namespace``; :meth:`emit` never blocks, :meth:`run` sends."""

    def __init__(
        self,
        client: Callable[[], KubeClient],
        node: str,
        namespace: str = NAMESPACE,
        *,
        interval: float = 60.0,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        self.client = client
        self.node = node
        self.namespace = namespace
        self.interval = interval
        self.backoff = backoff
        self.sent: list[Event] = []  # what the server accepted, the latest 32 (tests)
        self._held: dict[str, _Held] = {}
        self._next: dict[str, float] = {}  # reason -> when the next Event of it may go
        self._wake = asyncio.Event()

    def emit(self, reason: str, message: str, *, warning: bool = False) -> None:
        held = self._held.get(reason)
        if held is None:
            self._held[reason] = _Held(message[:MAX_MESSAGE], warning)
        else:
            held.message, held.warning, held.count = message[:MAX_MESSAGE], warning, held.count + 1
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(*self.backoff)
        while True:
            self._wake.clear()
            now = loop.time()
            due = [r for r in self._held if self._next.get(r, 0.0) <= now]
            for reason in due:
                held = self._held.pop(reason)
                self._next[reason] = now + self.interval
                try:
                    body = event_body(
                        self.node, reason, held.message, held.warning, held.count, datetime.datetime.now(datetime.UTC)
                    )
                    self.sent = [*self.sent[-31:], await self.client().create_event(self.namespace, body)]
                    backoff.reset()
                except CdiplugError as exc:
                    log.warning("event %s on node %s not sent: %s", reason, self.node, exc)
                    await asyncio.sleep(next(backoff))  # a server refusing everything is not asked at full speed
            waits = [self._next.get(r, 0.0) - loop.time() for r in self._held]  # one emitted meanwhile: due now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(waits)) if waits else None):
                    await self._wake.wait()
