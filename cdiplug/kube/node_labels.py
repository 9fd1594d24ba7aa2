"""Device labels on the daemon's own Node, for node selection in a mixed fleet.

Per resource (``example.com/fpga``): ``cdiplug.dev/example.com.fpga.count`` (its devices, healthy
or not: a label that flapped with health would move pods' placement around; allocatable already
counts health) and one label per attribute identifying the model: the backend's
:class:`~cdiplug.backend.ModelLabels` when it has that ability, else every attribute all its
devices share (the fake's configured ones). Values are label values: integers at least 0 as plain
digits (``Gt``/``Lt`` in node affinity compare them), booleans ``true``/``false``, text with
what a label value cannot hold made ``-`` and cut to 63 characters. A name or value that cannot
be a label is left out (logged once).

:class:`NodeLabeler` keeps the Node's ``cdiplug.dev/`` labels equal to what the resources want,
with JSON merge patches on ``metadata.labels`` naming only keys it owns: every ``cdiplug.dev/``
key but :data:`CONFIG_LABEL` (the administrator's choice of configuration). Labels of a resource
that leaves the configuration, or whose devices all go, are removed. One patch per change, at
most one per ``interval`` (changes in between coalesce); a failed patch is retried with the one
backoff helper. Nothing is patched before every configured resource has reported once (or
``settle`` seconds have passed), so a restart does not remove and re-add every label.

The boundary: label names and values and when to patch; the call is :mod:`.client`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from cdiplug.backend import ModelLabels
from cdiplug.config import CONFIG_LABEL  # chosen by whoever runs the node; never written by cdiplug
from cdiplug.errors import CdiplugError
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.models.names import is_label_value
from cdiplug.toolkit.backoff import Backoff

if TYPE_CHECKING:
    from lightkube.models import core_v1 as core

    from cdiplug.kube.client import KubeClient

log = logging.getLogger(__name__)

PREFIX = "cdiplug.dev/"
MAX_NAME = 63  # the name part of a label key, and a label value
_NOT_VALUE = re.compile(r"[^-A-Za-z0-9_.]+")


def resource_part(resource: str) -> str:
    """``example.com/fpga`` -> ``example.com.fpga``: the vendor and class of the resource's labels."""
    vendor, _, cls = resource.partition("/")
    return f"{vendor}.{cls}"


def label_key(resource: str, name: str) -> str | None:
    """``cdiplug.dev/example.com.fpga.speed``, or None when that is no valid label key."""
    part = f"{resource_part(resource)}.{name}"
    return PREFIX + part if is_label_value(part) else None


def label_value(value: object) -> str | None:
    """``value`` as a label value, or None when it cannot be one (a negative number, nothing left)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value >= 0 else None
    text = _NOT_VALUE.sub("-", str(value))[:MAX_NAME].strip("-_.")
    return text if is_label_value(text) else None


def shared_attributes(snapshot: DeviceSnapshot) -> dict[str, object]:
    """The attributes every device of ``snapshot`` has with the same value (none without devices)."""
    if not snapshot.devices:
        return {}
    first, *rest = snapshot.devices
    shared: dict[str, object] = dict(first.attributes)
    for device in rest:
        theirs = dict(device.attributes)
        shared = {k: v for k, v in shared.items() if k in theirs and theirs[k] == v and type(theirs[k]) is type(v)}
    return shared


def resource_labels(snapshot: DeviceSnapshot, model: ModelLabels | None = None) -> tuple[dict[str, str], list[str]]:
    """The labels of one resource and what was left out (``name: why``); none without devices."""
    if not snapshot.devices:
        return {}, []
    resource = snapshot.resource
    values: Mapping[str, object] = model.model_labels(resource, snapshot) if model is not None else shared_attributes(snapshot)
    labels: dict[str, str] = {}
    left_out: list[str] = []
    for name, raw in {**values, "count": len(snapshot.devices)}.items():
        key, value = label_key(resource, name), label_value(raw)
        if key is None:
            left_out.append(f"{name}: {resource_part(resource)}.{name} is no label name (at most {MAX_NAME} characters)")
        elif value is None:
            left_out.append(f"{name}: {str(raw)[:80]!r} cannot be a label value")
        else:
            labels[key] = value
    return labels, left_out


def owned(key: str) -> bool:
    """The label keys cdiplug writes and removes: ``cdiplug.dev/`` ones but the configuration's."""
    return key.startswith(PREFIX) and key != CONFIG_LABEL


def label_patch(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, Any] | None:
    """The JSON merge patch taking the owned labels of ``current`` to ``wanted``; None when equal."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    changes.update({k: None for k in current if owned(k) and k not in wanted})
    return {"metadata": {"labels": changes}} if changes else None


class NodeLabeler:
    """Keeps the ``cdiplug.dev/`` labels of Node ``node`` equal to its resources' labels.

    ``expect(names)`` says which resources are configured (those leaving lose their labels);
    ``offer(snapshot, model)`` hands it a resource's snapshot; ``run()`` patches until cancelled.
    """

    def __init__(
        self,
        client: Callable[[], KubeClient],
        node: str,
        *,
        interval: float = 1.0,
        settle: float = 10.0,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        self.client = client  # the process's one client, made on first use
        self.node = node
        self.interval = interval
        self.settle = settle
        self.backoff = backoff
        self.patches = 0  # patches sent and accepted (tests, the bench)
        self.failures = 0  # calls that failed
        self._expected: frozenset[str] = frozenset()
        self._wanted: dict[str, dict[str, str]] = {}
        self._warned: set[str] = set()
        self._changed = asyncio.Event()
        self._progress = asyncio.Condition()
        self._current: dict[str, str] | None = None  # the Node's labels, as the last answer had them

    def expect(self, resources: Iterable[str]) -> None:
        self._expected = frozenset(resources)
        for gone in set(self._wanted) - self._expected:
            del self._wanted[gone]
        self._changed.set()

    def offer(self, snapshot: DeviceSnapshot, model: ModelLabels | None = None) -> None:
        if snapshot.resource not in self._expected:
            return
        labels, left_out = resource_labels(snapshot, model)
        for why in left_out:
            if (warned := f"{snapshot.resource} {why}") not in self._warned:
                self._warned.add(warned)
                log.warning("node label for %s left out: %s", snapshot.resource, why)
        if self._wanted.get(snapshot.resource) != labels:
            self._wanted[snapshot.resource] = labels
            self._changed.set()

    def wanted(self) -> dict[str, str]:
        """Every label the resources want now."""
        return {k: v for labels in self._wanted.values() for k, v in labels.items()}

    async def wait_until(self, predicate: Callable[[NodeLabeler], bool]) -> None:
        """Until ``predicate(self)`` holds, checked after every answer and every failure (tests)."""
        async with self._progress:
            await self._progress.wait_for(lambda: predicate(self))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        settled = loop.time() + self.settle
        while not self._expected <= set(self._wanted) and loop.time() < settled:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settled - loop.time()):
                    await self._changed.wait()
        backoff = Backoff(*self.backoff)
        while True:
            self._changed.clear()
            try:
                await self._apply(self.client())
                backoff.reset()
            except CdiplugError as exc:  # the server's answer, or no credentials to ask it with
                delay = next(backoff)
                log.error("node labels of %s not written: %s; again in %g s", self.node, exc, delay)
                self._current = None  # read afresh: someone may have changed them
                async with self._progress:
                    self.failures += 1
                    self._progress.notify_all()
                await asyncio.sleep(delay)
                continue
            await asyncio.sleep(self.interval)  # the rate limit: changes meanwhile make one patch
            await self._changed.wait()

    async def _apply(self, client: KubeClient) -> None:
        if self._current is None:
            node = await client.get_node(self.node)
            await self._answered(node)
        assert self._current is not None
        patch = label_patch(self._current, self.wanted())
        if patch is None:
            return
        answer = await client.patch_node(self.node, patch)
        self.patches += 1
        log.info("node %s labels: %s", self.node, _describe(patch["metadata"]["labels"]))
        await self._answered(answer)

    async def _answered(self, node: core.Node) -> None:
        labels = (node.metadata.labels if node.metadata is not None else None) or {}
        async with self._progress:
            self._current = dict(labels)
            self._progress.notify_all()


def _describe(changes: Mapping[str, str | None]) -> str:
    return ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(changes.items()))
