"""The daemon in a mixed fleet: named configurations chosen by the Node's label, applied live; labels and Events.

The real daemon (:class:`cdiplug.daemon.Daemon`, the fake backend, the device-plugin front end)
against the kubelet stand-in and the API-server stand-in (real HTTP, the real lightkube client
from a kubeconfig). Covers: the label cdiplug.dev/config read before anything starts; a label
change switching the node's resources live (no restart); an unknown name keeping the last good
configuration with a ConfigurationError Event; the label removed giving ``default``; the
cdiplug.dev/ labels following the resources; a health change as an Event; a resource without
devices not registered unless ``register_when_empty: true``, and registered once a device appears
(logged as such; a resource whose first snapshot has devices logs neither line).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from cdiplug.backend import BackendPlugin, PluginRegistry, SnapshotSink
from cdiplug.config import parse_config
from cdiplug.daemon import Daemon
from cdiplug.kube.factory import SharedClient
from cdiplug.kube.own_node import OwnNode
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.node import Node
from cdiplug.testing import ApiServerStandIn, KubeletStandIn
from cdiplug.testing.poll import eventually
from cdiplug.toolkit.supervisor import Supervisor
from cdiplug_backends.fake import plugin as fake_plugin

FPGA, ACCEL = "example.com/fpga", "example.com/accel"


def fpgas(speed: int, health_file: Path | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"count": 2, "attributes": {f"fpga-{i}": {"speed": speed} for i in range(2)}}
    if health_file is not None:
        options["health_file"] = str(health_file)
    return {"name": FPGA, "backend": "fake", "options": options}


def write_config(path: Path, health_file: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "node_labels": True,
                "configurations": {
                    "default": {"resources": [{"name": FPGA, "backend": "fake", "options": {"count": 0}}]},
                    "fast-fpga": {"resources": [fpgas(9, health_file)]},
                    "accel": {"resources": [{"name": ACCEL, "backend": "fake", "options": {"count": 1}}]},
                },
            },
            sort_keys=False,
        )
    )
    return path


def ours(api: ApiServerStandIn) -> dict[str, str]:
    labels = api.node("n1")["metadata"].get("labels") or {}
    return {k: v for k, v in labels.items() if k.startswith("cdiplug.dev/") and k != "cdiplug.dev/config"}


def set_label(api: ApiServerStandIn, value: str | None) -> None:
    node = api.node("n1")
    labels = node["metadata"].setdefault("labels", {})
    if value is None:
        labels.pop("cdiplug.dev/config", None)
    else:
        labels["cdiplug.dev/config"] = value
    api._store(("nodes", "", "n1"), node, create_only=False)  # as kubectl label does: a MODIFIED event


@pytest.fixture
def node_name() -> str:
    """The node the shared ``api`` fixture (tests/conftest.py) knows."""
    return "n1"


async def test_the_node_label_chooses_the_configuration_live(api: ApiServerStandIn, world: World, short_tmp: Path) -> None:
    health = short_tmp / "health.yaml"
    health.write_text("{}\n")
    config = write_config(short_tmp / "config.yaml", health)
    world = attrs.evolve(world, node_name="n1", kubeconfig=api.kubeconfig(short_tmp / "kubeconfig"))
    set_label(api, "fast-fpga")
    stop = asyncio.Event()

    def own_node(supervisor: Supervisor, kube: SharedClient) -> OwnNode:
        return OwnNode(world, supervisor, kube, label_interval=0.05, label_settle=5, event_interval=0.05, backoff=(0.05, 0.2))

    daemon = Daemon(config, world, stop=stop, own_node=own_node)
    async with KubeletStandIn(world.kubelet_dir) as kubelet:
        task = asyncio.create_task(daemon.run(handle_signals=False))
        try:
            await kubelet.wait_registered(FPGA, timeout=10)  # fast-fpga from the start: read before anything ran
            await kubelet.wait_until(lambda: kubelet.capacity(FPGA) == 2, 10, "the FPGAs listed")
            assert daemon.configuration == "fast-fpga"
            want = {"cdiplug.dev/example.com.fpga.count": "2", "cdiplug.dev/example.com.fpga.speed": "9"}
            await asyncio.wait_for(api.wait_for(lambda: want.items() <= ours(api).items()), 10)

            health.write_text("fpga-1: Unhealthy\n")
            await asyncio.wait_for(api.wait_for(lambda: any(e["reason"] == "DeviceUnhealthy" for e in api.events("default"))), 10)
            (sick,) = [e for e in api.events("default") if e["reason"] == "DeviceUnhealthy"]
            assert sick["message"] == f"{FPGA}: fpga-1 (unhealthy) Unhealthy" and sick["type"] == "Warning"
            assert ours(api)["cdiplug.dev/example.com.fpga.count"] == "2"  # health does not move labels

            set_label(api, "accel")  # live: the FPGAs go, the accelerator comes
            await kubelet.wait_registered(ACCEL, timeout=10)
            await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 0, 10, "the FPGAs gone")
            await asyncio.wait_for(
                api.wait_for(
                    lambda: (
                        ours(api)
                        == {"cdiplug.dev/example.com.accel.count": "1", "cdiplug.dev/example.com.accel.model": "fake-accel"}
                    )
                ),
                10,
            )

            done = daemon.reloads_done
            set_label(api, "no-such-thing")  # unknown: the last good configuration keeps serving
            await asyncio.wait_for(
                api.wait_for(lambda: any(e["reason"] == "ConfigurationError" for e in api.events("default"))), 10
            )
            assert daemon.reloads_done == done + 1
            (error,) = [e for e in api.events("default") if e["reason"] == "ConfigurationError"]
            assert (
                "no configuration named 'no-such-thing'" in error["message"] and "default, fast-fpga, accel" in error["message"]
            )
            assert kubelet.is_registered(ACCEL) and kubelet.allocatable(ACCEL) == 1
            assert "cdiplug.dev/example.com.accel.count" in ours(api)

            set_label(api, None)  # no label: default, whose FPGA resource finds no devices
            await asyncio.wait_for(api.wait_for(lambda: ours(api) == {}), 10)
            await kubelet.wait_until(lambda: kubelet.allocatable(ACCEL) == 0, 10, "the accelerator gone")
            assert daemon.configuration is None and daemon.node is not None
            assert [r.name for r in daemon.node.config.resources] == [FPGA]
            assert kubelet.registration(FPGA) is not None and kubelet.allocatable(FPGA) == 0  # the old registration only
        finally:
            stop.set()
            assert await asyncio.wait_for(task, 20) == 0
    assert (api.node("n1")["metadata"]["labels"] or {}).get("cdiplug.dev/config") is None  # never written by us


# -- register_when_empty -----------------------------------------------------------------------


class LateBackend:
    """Publishes no devices until a test calls :meth:`arrive`."""

    created: list[LateBackend] = []

    def __init__(self, resources: Sequence[ResourceConfig[Any]], world: World) -> None:
        self.names = [r.name for r in resources]
        self.sink: SnapshotSink | None = None
        self.created.append(self)

    def arrive(self) -> None:
        assert self.sink is not None
        for name in self.names:
            self.sink.publish(DeviceSnapshot(name, [Device("dev-0")]))

    async def run(self, sink: SnapshotSink) -> None:
        self.sink = sink
        for name in self.names:
            sink.publish(DeviceSnapshot(name, []))
        await asyncio.Event().wait()


@attrs.frozen
class NoOptions:
    pass


async def test_a_resource_without_devices_registers_once_one_appears(world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cdiplug.deviceplugin.frontend")
    LateBackend.created = []
    plugins = PluginRegistry({"late": BackendPlugin("late", NoOptions, LateBackend), "fake": fake_plugin})
    config = parse_config(
        {
            "resources": [
                {"name": "example.com/late", "backend": "late"},
                {"name": "example.com/empty", "backend": "fake", "options": {"count": 0}, "register_when_empty": True},
                {"name": FPGA, "backend": "fake", "options": {"count": 1}},
            ]
        },
        "test",
        plugins,
    )
    supervisor = Supervisor()
    node = Node(config, world, supervisor, plugins=plugins)
    async with KubeletStandIn(world.kubelet_dir) as kubelet:
        await node.start()
        try:
            await kubelet.wait_registered(FPGA)
            await kubelet.wait_registered("example.com/empty")  # told to: registered with nothing
            assert kubelet.capacity("example.com/empty") == 0
            assert not kubelet.is_registered("example.com/late")
            await eventually(
                lambda: "example.com/late: no devices found; registering it once one appears" in caplog.text, "the log line"
            )
            # Its devices came in the backend's first snapshot: no "no devices" guessed before it.
            assert f"{FPGA}: no devices found" not in caplog.text
            assert f"{FPGA}: a device appeared" not in caplog.text
            (backend,) = LateBackend.created
            backend.arrive()
            await kubelet.wait_registered("example.com/late")
            assert kubelet.capacity("example.com/late") == 1
            assert "example.com/late: a device appeared; registering" in caplog.text
            assert supervisor.failure is None
        finally:
            await node.stop()
            await supervisor.close()
