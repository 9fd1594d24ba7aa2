"""The DRA tests' world: the API-server stand-in with this node, folders for the kubelet's sockets, a config.

``config`` serves ``example.com/fpga`` (fake, two devices with attributes, a health file) as DRA
driver ``fpga.example.com`` and ``example.com/dongle`` as a device plugin.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn

FPGA = "example.com/fpga"
DONGLE = "example.com/dongle"
NODE = "node-a"


@pytest.fixture
def health_file(short_tmp: Path) -> Path:
    return short_tmp / "health.yaml"


@pytest.fixture
def config(health_file: Path) -> Config:
    return parse_config(
        {
            "resources": [
                {
                    "name": FPGA,
                    "backend": "fake",
                    "api": "dra",
                    "options": {
                        "count": 2,
                        "health_file": str(health_file),
                        "attributes": {"fpga-0": {"speed": 1, "fast": False}, "fpga-1": {"speed": 9, "fast": True}},
                    },
                },
                {"name": DONGLE, "backend": "fake", "options": {"count": 1}},
            ]
        },
        source="test_dra",
    )


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    async with ApiServerStandIn() as server:
        server.put_node(NODE)
        yield server


@pytest.fixture
def dra_world(world: World, short_tmp: Path, api: ApiServerStandIn) -> World:
    return attrs.evolve(
        world,
        plugins_registry_dir=short_tmp / "reg",
        plugins_dir=short_tmp / "plugins",
        node_name=NODE,
        kubeconfig=api.kubeconfig(short_tmp / "kubeconfig"),
    )
