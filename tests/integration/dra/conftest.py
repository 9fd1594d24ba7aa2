"""The DRA tests' config (the API-server stand-in with the node ``NODE`` and the world that
reaches it are ``api`` and ``dra_world``, in tests/conftest.py).

``config`` serves ``example.com/fpga`` (fake, two devices with attributes, a health file) as DRA
driver ``fpga.example.com`` and ``example.com/dongle`` as a device plugin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdiplug.config import Config, parse_config

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
