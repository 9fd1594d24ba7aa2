"""The node label choosing this node's named configuration: ``cdiplug.dev/config=<name>``.

:class:`ConfigLabelWatch` watches the daemon's own Node (a watch on ``metadata.name``, through
the process's one client) and calls ``on_change(name)`` whenever the label's value changes (None:
no label, so the ``default`` configuration). A watch that fails or ends is opened again after
the one backoff helper's delay (1 s doubling to 60 s, back to 1 s once events come). The daemon
applies a change as it applies a SIGHUP.

The boundary: reading the label; what a name means is :mod:`cdiplug.config`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cdiplug.config import CONFIG_LABEL
from cdiplug.errors import CdiplugError
from cdiplug.toolkit.backoff import Backoff

if TYPE_CHECKING:
    from cdiplug.kube.client import KubeClient

log = logging.getLogger(__name__)


class ConfigLabelWatch:
    """``run()`` until cancelled; :meth:`first` waits (bounded) for the label as the Node has it."""

    def __init__(
        self,
        client: Callable[[], KubeClient],
        node: str,
        on_change: Callable[[str | None], None],
        *,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        self.client = client
        self.node = node
        self.on_change = on_change
        self.backoff = backoff
        self.value: str | None = None
        self._known = asyncio.Event()

    async def first(self, timeout: float) -> str | None:
        """The label's value once the Node was read; raises TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            await self._known.wait()
        return self.value

    async def run(self) -> None:
        backoff = Backoff(*self.backoff)
        while True:
            try:
                async for kind, node in self.client().watch_node(self.node):
                    backoff.reset()
                    if kind in ("ADDED", "MODIFIED"):
                        labels = (node.metadata.labels if node.metadata is not None else None) or {}
                        self._seen(labels.get(CONFIG_LABEL))
                log.debug("the watch of node %s ended; watching again", self.node)
                delay = next(backoff)
            except CdiplugError as exc:
                delay = next(backoff)
                log.error("cannot watch node %s for its label %s: %s; again in %g s", self.node, CONFIG_LABEL, exc, delay)
            await asyncio.sleep(delay)

    def _seen(self, value: object) -> None:
        name = value if isinstance(value, str) else None
        self._known.set()
        if name != self.value:
            self.value = name
            self.on_change(name)
