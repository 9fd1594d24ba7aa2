"""Fixtures shared by every test: a World of short-lived folders; for the DRA tests, the API-server
stand-in with this node (``api``) and a World that reaches it (``dra_world``).

Unix socket paths are limited to 107 bytes, and pytest's ``tmp_path`` can be longer than that with
long test names, so the folders live under a short, fresh ``mkdtemp`` folder instead.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest

from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn

if TYPE_CHECKING:
    from cdiplug.kube.client import LightkubeClient


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cdp-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def world(short_tmp: Path) -> World:
    """A World whose folders are fresh and empty (sysfs and dev roots point at empty folders)."""
    folders = {name: short_tmp / name for name in ("kubelet", "cdi", "state", "sys", "dev")}
    for path in folders.values():
        path.mkdir()
    return World(
        kubelet_dir=folders["kubelet"],
        cdi_dir=folders["cdi"],
        state_dir=folders["state"],
        sysfs_root=folders["sys"],
        dev_root=folders["dev"],
        pod_resources_socket=short_tmp / "pod-resources.sock",
    )


@pytest.fixture
def node_name() -> str:
    """The node ``api`` knows and ``dra_world`` is on (a module overrides it to use another)."""
    return "node-a"


@pytest.fixture
async def api(node_name: str) -> AsyncIterator[ApiServerStandIn]:
    async with ApiServerStandIn() as server:
        server.put_node(node_name)
        yield server


@pytest.fixture
async def client(api: ApiServerStandIn, tmp_path: Path) -> AsyncIterator[LightkubeClient]:
    """cdiplug's Kubernetes client for ``api``, closed at the end."""
    from cdiplug.kube.client import LightkubeClient  # lightkube only for the tests that ask
    from cdiplug.kube.credentials import load_kubeconfig

    client = LightkubeClient(load_kubeconfig(api.kubeconfig(tmp_path / "kubeconfig")))
    yield client
    await client.close()


@pytest.fixture
def dra_world(world: World, short_tmp: Path, api: ApiServerStandIn, node_name: str) -> World:
    """``world`` with the kubelet's plugin folders and a kubeconfig for ``api``."""
    return attrs.evolve(
        world,
        plugins_registry_dir=short_tmp / "reg",
        plugins_dir=short_tmp / "plugins",
        node_name=node_name,
        kubeconfig=api.kubeconfig(short_tmp / "kubeconfig"),
    )
