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
  republishes. It never polls; a failed call or a broken watch is retried with backoff;
- device taints (unhealthy devices, :mod:`.slices`): when the API server answers a tainted
  slice without its taints (the ``DRADeviceTaints`` gate is off there), it switches to
  withdrawing unhealthy devices from the pool instead, logs that once, and republishes.

The boundary: the API side only; which devices to publish comes from :mod:`.slices`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ..errors import KubernetesError
from ..model import DeviceSnapshot
from .kubeclient import CONFLICT, NOT_FOUND, KubeClient
from .slices import OwnerNode, UnhealthyPolicy, has_taints, pool_devices, slice_body, slice_name, split

log = logging.getLogger(__name__)

BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0


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
    ) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.policy = policy
        self.backoff = backoff
        self.generation = 0
        self.publishes = 0  # pool writes done (tests and figures wait on it)
        self.failures = 0  # failed calls that will be retried
        self._want: DeviceSnapshot | None = None
        self._wanted = False
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set while nothing is left to publish
        self._known: dict[str, dict[str, Any]] = {}  # our slices as last seen or written, by name
        self._written_versions: set[str] = set()
        self._last_pool: list[dict[str, Any]] | None = None
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
            self._changed.notify_all()

    async def withdraw(self) -> None:
        """Delete every slice of this driver on this node (the resource left the configuration)."""
        items, _ = await self.client.list_slices(self.driver, self.node)
        for item in items:
            if self._ours(item):
                await self.client.delete_slice(item["metadata"]["name"])
        self._known.clear()

    # -- the task --

    async def run(self) -> None:
        """Publish and watch until cancelled."""
        await self._start()
        await asyncio.gather(self._publish_loop(), self._watch_loop())

    async def _start(self) -> None:
        delay = self.backoff[0]
        while True:
            try:
                self._owner = await self._read_owner()
                await self._relist()
                return
            except KubernetesError as exc:
                log.error("DRA driver %s: %s; trying again in %g s", self.driver, exc, delay)
                await self._failed()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff[1])

    async def _read_owner(self) -> OwnerNode | None:
        try:
            node = await self.client.get_node(self.node)
        except KubernetesError as exc:
            if exc.status is None:
                raise
            log.warning("DRA driver %s: slices get no owner (%s); the kubelet still removes them", self.driver, exc)
            return None
        uid = (node.get("metadata") or {}).get("uid")
        return OwnerNode(self.node, uid) if isinstance(uid, str) and uid else None

    def _ours(self, item: Mapping[str, Any]) -> bool:
        spec = item.get("spec") or {}
        return spec.get("driver") == self.driver and spec.get("nodeName") == self.node

    async def _relist(self) -> None:
        items, version = await self.client.list_slices(self.driver, self.node)
        self._known = {i["metadata"]["name"]: i for i in items if self._ours(i)}
        generations = [int(((i.get("spec") or {}).get("pool") or {}).get("generation") or 0) for i in self._known.values()]
        self.generation = max([self.generation, *generations])
        self._resource_version = version
        self._last_pool = None  # what is there is not known to be ours: write it all again

    async def _publish_loop(self) -> None:
        delay = self.backoff[0]
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
                delay = self.backoff[0]
                if not self._wake.is_set():
                    self._idle.set()
            except KubernetesError as exc:
                log.error("DRA driver %s: publishing ResourceSlices failed: %s; trying again in %g s", self.driver, exc, delay)
                self._external = True  # list again first: our picture of the server may be wrong
                await self._failed()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])
                self._wake.set()

    async def _publish(self) -> None:
        pool = pool_devices(self._want, self.policy)
        if pool == self._last_pool:
            return
        specs = split(pool)
        generation = self.generation + 1
        wanted = {slice_name(self.node, self.driver, s.index) for s in specs}
        for spec in specs:
            body = slice_body(
                spec, driver=self.driver, node=self.node, generation=generation, count=len(specs), owner=self._owner
            )
            written = await self._write(body)
            if self.policy is UnhealthyPolicy.TAINT and any("taints" in d for d in spec.devices) and not has_taints(written):
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
            self._changed.notify_all()
        log.info(
            "DRA driver %s: published %d devices in %d slices (generation %d)", self.driver, len(pool), len(specs), generation
        )

    async def _write(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        known = self._known.get(name)
        try:
            if known is not None:
                body["metadata"]["resourceVersion"] = known["metadata"].get("resourceVersion")
                written = await self.client.replace_slice(body)
            else:
                written = await self.client.create_slice(body)
        except KubernetesError as exc:
            if exc.status == NOT_FOUND and known is not None:
                body["metadata"].pop("resourceVersion", None)
                written = await self.client.create_slice(body)
            elif exc.status == CONFLICT:
                raise KubernetesError(f"ResourceSlice {name} changed meanwhile; reading them again", CONFLICT) from exc
            else:
                raise
        version = (written.get("metadata") or {}).get("resourceVersion")
        if version:
            self._written_versions.add(version)
        self._known[name] = written
        return written

    # -- watching for changes behind our back --

    async def _watch_loop(self) -> None:
        delay = self.backoff[0]
        while True:
            try:
                async for kind, obj in self.client.watch_slices(self.driver, self.node, self._resource_version):
                    delay = self.backoff[0]
                    self._on_event(kind, obj)
                # The server ended the watch: go on from the last version seen.
                continue
            except KubernetesError as exc:
                log.warning("DRA driver %s: %s; watching again in %g s", self.driver, exc, delay)
                self._external = True
                self._wake.set()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff[1])

    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        version = metadata.get("resourceVersion")
        if isinstance(version, str) and version:
            self._resource_version = version
        if not self._ours(obj):
            return
        # Judged by the publish loop, between its writes: an event may arrive before the answer
        # to the write that caused it.
        self._events.append((kind, str(metadata.get("name")), str(version)))
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
