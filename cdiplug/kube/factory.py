"""The one way cdiplug makes its Kubernetes client: :data:`ClientFactory` and :func:`default_client`.

The DRA front end and the node's dealings with its own Node (:mod:`.own_node`) each take a
factory (tests pass fakes or a client of the API-server stand-in) and make their client with it
on first use; by default :func:`default_client`, the credentials found in kubectl's order with the
world's ``--kubeconfig``. Importing this module loads no Kubernetes client library.
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
