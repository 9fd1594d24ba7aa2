"""Link state of network interfaces, from netlink (pyroute2), for ``link_health: true``.

:class:`LinkStates` dumps every link once, then follows ``RTM_NEWLINK``/``RTM_DELLINK`` events
(the ``RTMGRP_LINK`` multicast group) and calls ``on_change`` whenever an interface's state
changes. A link counts as up when its operstate is ``UP`` (or ``UNKNOWN`` with the carrier on,
which is how drivers without operstate support report a working link). Interfaces netlink does not
know are not judged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.rtnl import RTMGRP_LINK

log = logging.getLogger(__name__)


class _LinkMessage(Protocol):
    """What is read of a pyroute2 link message (its NLA values by name)."""

    def get(self, key: str, /) -> object: ...


def _is_up(msg: _LinkMessage) -> bool:
    operstate = msg.get("operstate")
    return operstate == "UP" or (operstate == "UNKNOWN" and bool(msg.get("carrier")))


class LinkStates:
    """ifname -> up, kept current from netlink events."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self.up: dict[str, bool] = {}

    def down(self, ifnames: Iterable[str]) -> list[str]:
        """Those of ``ifnames`` netlink knows and reports down."""
        return [n for n in ifnames if self.up.get(n) is False]

    def _open(self) -> AsyncIPRoute:
        # flags=0: an existing namespace only; pyroute2 would otherwise create it.
        return AsyncIPRoute(netns=self.netns, flags=0) if self.netns else AsyncIPRoute()

    async def run(self, on_change: Callable[[], None], ready: Callable[[], None] | None = None) -> None:
        monitor = self._open()
        try:
            await monitor.bind(groups=RTMGRP_LINK)
            # Dump after subscribing, so no change falls between the two.
            async with self._open() as ipr:
                result = await ipr.link("dump")
                links = result if isinstance(result, list) else [m async for m in result]
            self.up = {m.get("ifname"): _is_up(m) for m in links if m.get("ifname")}
            on_change()
            if ready is not None:
                ready()
            while True:
                changed = False
                async for msg in monitor.get():  # one batch of messages per call
                    name = msg.get("ifname")
                    if not name:
                        continue
                    state = None if msg.get("event") == "RTM_DELLINK" else _is_up(msg)
                    if self.up.get(name) != state:
                        changed = True
                        if state is None:
                            self.up.pop(name, None)
                        else:
                            self.up[name] = state
                if changed:
                    on_change()
        finally:
            monitor.close()
