"""The one way cdiplug makes its Kubernetes client: :func:`default_client`, and :class:`SharedClient`, the process's one.

A daemon has one :class:`SharedClient` (the daemon's, or the node's when a node runs on its
own): the DRA front end (through :class:`~cdiplug.frontend.FrontEndParts`) and the node's
dealings with its own Node (:mod:`.own_node`) are handed it and ask it for the client, which is
made on first use with the factory (by default :func:`default_client`: the credentials found in
kubectl's order with the world's ``--kubeconfig``; tests pass fakes or a client of the
API-server stand-in) and closed once, by whoever made the :class:`SharedClient`, when the
process stops. Importing this module loads no Kubernetes client library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cdiplug.models.world import World

if TYPE_CHECKING:
    from cdiplug.kube.client import KubeClient

ClientFactory = Callable[[World], "KubeClient"]


def default_client(world: World) -> KubeClient:
    """A client for the world's API server (a KubernetesError when no credentials are found)."""
    from cdiplug.kube.client import connect  # lightkube only once something is asked of the server

    return connect(world.kubeconfig)


class SharedClient:
    """``shared()``: the one client, made by ``factory`` on first call (a KubernetesError when it
    cannot be; the next call tries again); :meth:`close` once nothing uses it any more."""

    def __init__(self, world: World, factory: ClientFactory = default_client) -> None:
        self.world = world
        self.factory = factory
        self._client: KubeClient | None = None

    def __call__(self) -> KubeClient:
        if self._client is None:
            self._client = self.factory(self.world)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
