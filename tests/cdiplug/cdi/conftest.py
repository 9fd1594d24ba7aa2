"""Fixtures for the CDI tests: the official JSON schema as a ready validator, sample snapshots."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from cdiplug.models.devices import ContainerEdits, Device, DeviceNode, DeviceSnapshot, Mount

SCHEMA_DIR = Path(__file__).parent / "schema"


@pytest.fixture(scope="session")
def schema_errors() -> Callable[[Any], list[str]]:
    """Validates a document against the official CDI schema (``defs.json`` resolved through a
    ``referencing`` registry); returns one line per error, empty when valid."""
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry = Registry().with_resource("defs.json", Resource.from_contents(defs, default_specification=DRAFT7))
    validator = jsonschema.Draft7Validator(schema, registry=registry)

    def errors(document: Any) -> list[str]:
        return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(document)]

    return errors


@pytest.fixture
def fpga_snapshot() -> DeviceSnapshot:
    """Three devices with env, a device node with a host path and a read-only mount; common edits."""
    return DeviceSnapshot(
        resource="example.com/fpga",
        devices=[
            Device(
                id=f"fpga-{i}",
                edits=ContainerEdits(
                    env={f"FPGA_{i}": f"fpga-{i}"},
                    device_nodes=[DeviceNode(path=f"/dev/fpga{i}", host_path=f"/srv/dev/fpga{i}", permissions="rw")],
                    mounts=[Mount(host_path=f"/srv/fw/{i}", container_path=f"/fw/{i}")],
                ),
            )
            for i in range(3)
        ],
        common_edits=ContainerEdits(env={"FPGA_DRIVER": "fake"}),
    )
