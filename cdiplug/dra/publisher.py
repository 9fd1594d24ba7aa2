"""Publishing one driver's ResourceSlices for this node, and keeping them so.

:class:`SlicePublisher` owns the slices whose ``spec.driver`` is its driver and whose
``spec.nodeName`` is this node; it never lists, writes or deletes any other (field selectors on
every call, and the results checked again). Its :meth:`~SlicePublisher.run` task:

- at start reads the Node (its UID makes the Node the slices' owner, so they go with it) and
  lists the existing slices: their pool generation is where ours continues; slices left over
  that the new pool does not need (stale: an earlier run had more devices) are deleted at the
  first publish;
- publishes the pool for the latest snapshot (:meth:`~SlicePublisher.want`), bumping the pool
  generation on every change: slices are updated in place (``<node>-<driver>-<i>``), created
  when missing, the ones beyond the new count deleted. An unchanged pool is not written;
- watches the same slices and acts only on changes made behind its back (an event whose
  resourceVersion it did not write: someone deleted or edited a slice): it lists again and
  republishes. It never polls; a failed call or a broken watch is retried with backoff
  (doubling up to 30 s, each delay spread ±:data:`JITTER` so that the nodes of a cluster do not
  come back to a restarted API server in step; never sooner than a ``Retry-After`` the server
  gave, a 429). A watch the server ends, or that stays silent too long (:mod:`cdiplug.kube.client`),
  is opened again from the last version; one that ends at once is taken as failed (backoff, not
  a loop). A failed watch lists again once, through the publish loop;
- device taints (unhealthy devices, :mod:`.slices`): when the API server answers a tainted
  slice without its taints (the ``DRADeviceTaints`` gate is off there), it switches to
  withdrawing unhealthy devices from the pool instead, logs that once, and republishes;
- every pool write and every failed call is told to the :class:`~cdiplug.telemetry.recorder.Recorder`
  (``cdiplug_dra_slice_publishes``).

The boundary: the API side only; which devices to publish comes from :mod:`.slices`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from lightkube.resources.resource_v1 import ResourceSlice

from cdiplug.dra.slices import (
    OwnerNode,
    UnhealthyPolicy,
    pool_counters,
    pool_devices,
    slice_body,
    slice_name,
    split,
)
from cdiplug.errors import KubernetesError
from cdiplug.kube.client import CONFLICT, NOT_FOUND, KubeClient, slice_object
from cdiplug.kube.failures import retry_after
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.backoff import Backoff

log = logging.getLogger(__name__)

BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
JITTER = 0.2
SHORT_WATCH = 1.0  # seconds: a watch that ends sooner without an event is taken as failed


def _name(obj: ResourceSlice) -> str:
    return obj.metadata.name or "" if obj.metadata is not None else ""


def _version(obj: ResourceSlice) -> str | None:
    return obj.metadata.resourceVersion if obj.metadata is not None else None


def _has_taints(obj: ResourceSlice) -> bool:
    """Whether any device of the slice (as the server returned it) carries a taint."""
    return any(d.taints for d in obj.spec.devices or ())


class SlicePublisher:
    """Keeps one driver's pool of this node in step with the latest snapshot."""

    def __init__(
        self,
        client: KubeClient,
        driver: str,
        node: str,
        *,
        policy: UnhealthyPolicy = UnhealthyPolicy.TAINT,
        backoff: tuple[float, float] = (BACKOFF_INITIAL, BACKOFF_MAX),
        resource: str = "",
        recorder: Recorder = NULL_RECORDER,
    ) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.policy = policy
        self.backoff = backoff
        self.resource = resource  # labels the publish counters with ``driver``
        self.recorder = recorder
        self.generation = 0
        self.publishes = 0  # pool writes done (tests and figures wait on it)
        self.failures = 0  # failed calls that will be retried
        self._want: DeviceSnapshot | None = None
        self._wanted = False
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set while nothing is left to publish
        self._known: dict[str, ResourceSlice] = {}  # our slices as last seen or written, by name
        self._written_versions: set[str] = set()
        self._last_pool: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None  # devices, counter sets
        self._external = False
        self._events: list[tuple[str, str, str]] = []  # (kind, name, version) seen, not yet judged
        self._owner: OwnerNode | None = None
        self._resource_version = ""
        self._changed = asyncio.Condition()

    # -- what the front end calls --

    def want(self, snapshot: DeviceSnapshot) -> None:
        """Publish ``snapshot``'s devices (soon; the latest one wins)."""
        self._want = snapshot
        self._wanted = True
        self._idle.clear()
        self._wake.set()

    async def wait_published(self, count: int) -> None:
        """Return once at least ``count`` pool writes are done (tests)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.publishes >= count)

    async def wait_idle(self) -> None:
        """Return once the latest snapshot is published, or found to need no write (tests)."""
        await self._idle.wait()

    async def wait_failed(self, count: int) -> None:
        """Return once at least ``count`` calls failed (tests)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.failures >= count)

    async def _failed(self) -> None:
        async with self._changed:
            self.failures += 1
            self.recorder.slices_published(self.resource, self.driver, ok=False)
            self._changed.notify_all()

    async def withdraw(self) -> None:
        """Delete every slice of this driver on this node (the resource left the configuration)."""
        items, _ = await self.client.list_slices(self.driver, self.node)
        for item in items:
            if self._ours(item):
                await self.client.delete_slice(_name(item))
        self._known.clear()

    # -- the task --

    async def run(self) -> None:
        """Publish and watch until cancelled."""
        await self._start()
        await asyncio.gather(self._publish_loop(), self._watch_loop())

    def _backoff(self) -> Backoff:
        return Backoff(*self.backoff, jitter=JITTER)

    def _delay(self, backoff: Backoff, exc: BaseException) -> float:
        """The next delay of ``backoff``, but not less than the server's Retry-After."""
        return max(next(backoff), min(retry_after(exc) or 0.0, self.backoff[1]))

    async def _start(self) -> None:
        backoff = self._backoff()
        while True:
            try:
                self._owner = await self._read_owner()
                await self._relist()
                return
            except KubernetesError as exc:
                delay = self._delay(backoff, exc)
                log.error("DRA driver %s: %s; trying again in %.3g s", self.driver, exc, delay)
                await self._failed()
            await asyncio.sleep(delay)

    async def _read_owner(self) -> OwnerNode | None:
        try:
            node = await self.client.get_node(self.node)
        except KubernetesError as exc:
            if exc.status is None:
                raise
            log.warning("DRA driver %s: slices get no owner (%s); the kubelet still removes them", self.driver, exc)
            return None
        uid = node.metadata.uid if node.metadata is not None else None
        return OwnerNode(self.node, uid) if uid else None

    def _ours(self, item: ResourceSlice) -> bool:
        return item.spec.driver == self.driver and item.spec.nodeName == self.node

    async def _relist(self) -> None:
        items, version = await self.client.list_slices(self.driver, self.node)
        self._known = {_name(i): i for i in items if self._ours(i)}
        generations = [i.spec.pool.generation for i in self._known.values()]
        self.generation = max([self.generation, *generations])
        self._resource_version = version
        self._last_pool = None  # what is there is not known to be ours: write it all again

    async def _publish_loop(self) -> None:
        backoff = self._backoff()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._wanted:
                continue  # no snapshot yet: nothing to publish (and nothing stale removed blindly)
            self._judge_events()
            try:
                if self._external:
                    self._external = False
                    await self._relist()
                await self._publish()
                backoff.reset()
                if not self._wake.is_set():
                    self._idle.set()
            except KubernetesError as exc:
                delay = self._delay(backoff, exc)
                log.error("DRA driver %s: publishing ResourceSlices failed: %s; trying again in %.3g s", self.driver, exc, delay)
                self._external = True  # list again first: our picture of the server may be wrong
                await self._failed()
                await asyncio.sleep(delay)
                self._wake.set()

    async def _publish(self) -> None:
        devices = pool_devices(self._want, self.policy)
        pool = (devices, pool_counters(self._want))
        if pool == self._last_pool:
            return
        specs = split(*pool)
        generation = self.generation + 1
        wanted = {slice_name(self.node, self.driver, s.index) for s in specs}
        for spec in specs:
            body = slice_body(
                spec, driver=self.driver, node=self.node, generation=generation, count=len(specs), owner=self._owner
            )
            written = await self._write(body)
            if self.policy is UnhealthyPolicy.TAINT and any("taints" in d for d in spec.devices) and not _has_taints(written):
                log.warning(
                    "DRA driver %s: the API server drops device taints (feature gate DRADeviceTaints off); "
                    "unhealthy devices are withdrawn from the ResourceSlices instead",
                    self.driver,
                )
                self.policy = UnhealthyPolicy.WITHDRAW
                self.generation = generation
                self._wake.set()
                return
        for name in [n for n in self._known if n not in wanted]:
            await self.client.delete_slice(name)
            self._known.pop(name, None)
        self.generation = generation
        self._last_pool = pool
        async with self._changed:
            self.publishes += 1
            self.recorder.slices_published(self.resource, self.driver, ok=True)
            self._changed.notify_all()
        log.info(
            "DRA driver %s: published %d devices in %d slices (generation %d)", self.driver, len(devices), len(specs), generation
        )

    async def _write(self, body: dict[str, Any]) -> ResourceSlice:
        name = body["metadata"]["name"]
        known = self._known.get(name)
        try:
            if known is not None:
                body["metadata"]["resourceVersion"] = _version(known)
                written = await self.client.replace_slice(slice_object(body))
            else:
                written = await self.client.create_slice(slice_object(body))
        except KubernetesError as exc:
            if exc.status == NOT_FOUND and known is not None:
                body["metadata"].pop("resourceVersion", None)
                written = await self.client.create_slice(slice_object(body))
            elif exc.status == CONFLICT:
                raise KubernetesError(f"ResourceSlice {name} changed meanwhile; reading them again", CONFLICT) from exc
            else:
                raise
        version = _version(written)
        if version:
            self._written_versions.add(version)
        self._known[name] = written
        return written

    # -- watching for changes behind our back --

    async def _watch_loop(self) -> None:
        backoff = self._backoff()
        while True:
            opened = time.monotonic()
            events = 0
            try:
                async for kind, obj in self.client.watch_slices(self.driver, self.node, self._resource_version):
                    backoff.reset()
                    events += 1
                    self._on_event(kind, obj)
                if events or time.monotonic() - opened >= SHORT_WATCH:
                    continue  # the server ended the watch (or it went silent): go on from the last version seen
                delay = next(backoff)
                log.warning(
                    "DRA driver %s: the watch of ResourceSlices ended at once; watching again in %.3g s", self.driver, delay
                )
            except KubernetesError as exc:
                delay = self._delay(backoff, exc)
                log.warning("DRA driver %s: %s; watching again in %.3g s", self.driver, exc, delay)
                self._external = True
                self._wake.set()
            await asyncio.sleep(delay)

    def _on_event(self, kind: str, obj: ResourceSlice) -> None:
        version = _version(obj)
        if version:
            self._resource_version = version
        if not self._ours(obj):
            return
        # Judged by the publish loop, between its writes: an event may arrive before the answer
        # to the write that caused it.
        self._events.append((kind, _name(obj), str(version)))
        self._wake.set()

    def _judge_events(self) -> None:
        events, self._events = self._events, []
        for kind, name, version in events:
            ours = name not in self._known if kind == "DELETED" else version in self._written_versions
            self._written_versions.discard(version)
            if not ours:
                log.info(
                    "DRA driver %s: ResourceSlice %s was %s by someone else; publishing again", self.driver, name, kind.lower()
                )
                self._external = True
                self._last_pool = None
