"""cdiplug.node: the backend host and the device-plugin front end over it, through the kubelet lifecycle.

The node runs for real (real grpc.aio servers on unix sockets in a short temporary folder, the
real allocator, CDI writer and Metrics with its own registry) against the kubelet stand-in of
``cdiplug.testing``. The backends are a scripted one defined here (a test says when it publishes
what) and, for the pre-start ability, a subclass of it. Covers: one backend per plugin; serving
before Register; snapshot diffing; CDI specs written and stale ones removed; a failed CDI write not
being fatal; kubelet restarts; reload adding, removing and changing resources without touching the
others; a backend that cannot be created leaving everything as it was; metrics calls; stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import pytest
from attrs import frozen
from prometheus_client import CollectorRegistry

from cdiplug.backend import BackendPlugin, PluginRegistry, SnapshotSink
from cdiplug.config import Config, parse_config
from cdiplug.errors import BackendInitError
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot, Health
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.node import Node
from cdiplug.telemetry.metrics import Metrics
from cdiplug.testing import KubeletStandIn
from cdiplug.testing.poll import eventually
from cdiplug.toolkit.supervisor import Supervisor
from cdiplug_backends.fake import plugin as fake_plugin

A, B, C, D = "example.com/alpha", "example.com/beta", "example.com/gamma", "example.com/delta"


@frozen
class ScriptedOptions:
    count: int = 2
    fail_create: bool = False


class ScriptedBackend:
    """Publishes ``count`` healthy devices per resource at start, then whatever a test says."""

    created: list[ScriptedBackend]

    def __init__(self, resources: Sequence[ResourceConfig], world: World) -> None:
        if any(r.options.fail_create for r in resources):
            raise BackendInitError("no such hardware")
        self.resources = {r.name: r for r in resources}
        self.sink: SnapshotSink | None = None
        self.running = asyncio.Event()
        self.cancelled = False
        self.created.append(self)

    def snapshot(self, resource: str, unhealthy: Sequence[int] = ()) -> DeviceSnapshot:
        count = self.resources[resource].options.count
        return DeviceSnapshot(
            resource=resource,
            devices=[
                Device(
                    id=f"dev-{i}",
                    health=Health.UNHEALTHY if i in unhealthy else Health.HEALTHY,
                    edits=ContainerEdits(env={f"SCRIPTED_{i}": f"dev-{i}"}),
                )
                for i in range(count)
            ],
        )

    def publish(self, snapshot: DeviceSnapshot) -> None:
        assert self.sink is not None
        self.sink.publish(snapshot)

    async def run(self, sink: SnapshotSink) -> None:
        self.sink = sink
        for name in self.resources:
            sink.publish(self.snapshot(name))
        self.running.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled = True


class FailingBackend(ScriptedBackend):
    """Publishes its devices, then fails (raises) whenever a test says, every run."""

    created: list[ScriptedBackend]
    runs = 0
    fail = asyncio.Event

    async def run(self, sink: SnapshotSink) -> None:
        type(self).runs += 1
        self.sink = sink
        for name in self.resources:
            sink.publish(self.snapshot(name))
        self.running.set()
        await type(self).fail.wait()
        raise OSError(5, "Input/output error from the make-believe hardware")


@pytest.fixture
def plugins() -> PluginRegistry:
    ScriptedBackend.created = []
    FailingBackend.created = []
    FailingBackend.runs = 0
    FailingBackend.fail = asyncio.Event()
    return PluginRegistry(
        {
            "scripted": BackendPlugin("scripted", ScriptedOptions, ScriptedBackend),
            "failing": BackendPlugin("failing", ScriptedOptions, FailingBackend),
            "fake": fake_plugin,
        }
    )


def config_of(plugins: PluginRegistry, *resources: dict[str, Any]) -> Config:
    return parse_config({"resources": list(resources)}, "test_manager", plugins)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


class Running:
    def __init__(
        self, manager: Node, kubelet: KubeletStandIn, supervisor: Supervisor, world: World, plugins: PluginRegistry
    ) -> None:
        self.manager, self.kubelet, self.supervisor, self.world, self.plugins = manager, kubelet, supervisor, world, plugins

    def registrations(self, resource: str) -> int:
        return sum(r.resource == resource for r in self.kubelet.registrations)

    async def registered_again(self, resource: str, before: int) -> None:
        await self.kubelet.wait_until(
            lambda: self.registrations(resource) > before and self.kubelet.is_registered(resource),
            5,
            f"{resource} registered again",
        )


async def start(
    world: World, plugins: PluginRegistry, config: Config, registry: CollectorRegistry, metrics: Metrics | None = None
) -> AsyncIterator[Running]:
    supervisor = Supervisor()
    metrics = metrics if metrics is not None else Metrics(registry=registry)
    manager = Node(config, world, supervisor, plugins=plugins, recorder=metrics, backoff=(0.02, 0.08))
    async with KubeletStandIn(world.kubelet_dir) as kubelet:
        await manager.start()
        try:
            for r in config.resources:
                await kubelet.wait_registered(r.name)
            yield Running(manager, kubelet, supervisor, world, plugins)
            assert supervisor.failure is None
        finally:
            await manager.stop()
            await supervisor.close()


@pytest.fixture
async def running(world: World, plugins: PluginRegistry, registry: CollectorRegistry) -> AsyncIterator[Running]:
    config = config_of(
        plugins,
        {"name": A, "backend": "scripted", "options": {"count": 2}},
        {"name": B, "backend": "scripted", "options": {"count": 2}},
        {"name": C, "backend": "fake", "options": {"count": 1}},
    )
    async for r in start(world, plugins, config, registry):
        yield r


# -- start -------------------------------------------------------------------------------------


async def test_one_backend_per_plugin_serves_every_resource(running: Running, registry: CollectorRegistry) -> None:
    [backend] = ScriptedBackend.created
    assert set(backend.resources) == {A, B}
    kubelet = running.kubelet
    assert kubelet.resources == tuple(sorted((A, B, C)))
    for name in (A, B, C):
        registration = kubelet.registration(name)
        assert registration is not None and registration.endpoint == name.replace("/", "-") + ".sock"
        assert registration.options.get_preferred_allocation_available
        assert sample(registry, "cdiplug_registrations_total", resource=name) == 1
        assert sample(registry, "cdiplug_resource_ready", resource=name) == 1
    assert (kubelet.capacity(A), kubelet.capacity(B), kubelet.capacity(C)) == (2, 2, 1)
    assert sample(registry, "cdiplug_devices", resource=A, health="healthy") == 2


async def test_cdi_specs_are_written_and_stale_ones_removed(
    world: World, plugins: PluginRegistry, registry: CollectorRegistry
) -> None:
    (world.cdi_dir / "cdiplug-example.com-old.json").write_text("{}")
    (world.cdi_dir / "vendor-other.json").write_text("{}")
    config = config_of(plugins, {"name": A, "backend": "scripted"})
    async for r in start(world, plugins, config, registry):
        spec_path = world.cdi_dir / "cdiplug-example.com-alpha.json"
        await r.kubelet.wait_until(spec_path.exists, 5, "the CDI spec")
        spec = json.loads(spec_path.read_text())
        assert spec["kind"] == A
        assert [d["name"] for d in spec["devices"]] == ["dev-0", "dev-1"]
        assert not (world.cdi_dir / "cdiplug-example.com-old.json").exists()
        assert (world.cdi_dir / "vendor-other.json").exists()  # not ours: never touched


async def test_sockets_serve_before_register(running: Running) -> None:
    # The stand-in dials the endpoint and asks GetDevicePluginOptions inside Register: every
    # accepted registration proves the server was serving first.
    for name in (A, B, C):
        registration = running.kubelet.registration(name)
        assert registration is not None and registration.connected_at >= registration.received_at


# -- snapshots ---------------------------------------------------------------------------------


async def test_an_unchanged_snapshot_changes_nothing(running: Running) -> None:
    [backend] = ScriptedBackend.created
    kubelet = running.kubelet
    before = kubelet.updates(A)
    backend.publish(backend.snapshot(A))  # equal to the last one
    backend.publish(backend.snapshot(A, unhealthy=[1]))
    await kubelet.wait_until(lambda: kubelet.allocatable(A) == 1, 5, "dev-1 unhealthy")
    assert kubelet.updates(A) == before + 1
    assert kubelet.updates(B) == 1


async def test_health_changes_reach_the_kubelet_and_the_metrics(running: Running, registry: CollectorRegistry) -> None:
    [backend] = ScriptedBackend.created
    kubelet = running.kubelet
    backend.publish(backend.snapshot(B, unhealthy=[0, 1]))
    await kubelet.wait_until(lambda: kubelet.allocatable(B) == 0, 5, "all of B unhealthy")
    assert sample(registry, "cdiplug_devices", resource=B, health="unhealthy") == 2
    backend.publish(backend.snapshot(B))
    await kubelet.wait_until(lambda: kubelet.allocatable(B) == 2, 5, "B healthy again")
    assert kubelet.allocatable(A) == 2


async def test_a_snapshot_for_another_backends_resource_is_ignored(running: Running, caplog: pytest.LogCaptureFixture) -> None:
    [backend] = ScriptedBackend.created
    backend.publish(DeviceSnapshot(resource=C, devices=[Device(id="intruder")]))
    backend.publish(backend.snapshot(A, unhealthy=[0]))
    await running.kubelet.wait_until(lambda: running.kubelet.allocatable(A) == 1, 5)
    assert [d.id for d in running.kubelet.devices(C)] == ["gamma-0"]
    assert any("not one of its own" in r.getMessage() for r in caplog.records)


async def test_a_failed_cdi_write_is_logged_not_fatal(
    world: World, plugins: PluginRegistry, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = world.cdi_dir.parent / "blocker"
    blocker.write_text("a file where a folder of the CDI folder's path should be")
    world = attrs.evolve(world, cdi_dir=blocker / "cdi")  # a file in the CDI folder's place is moved aside instead
    config = config_of(plugins, {"name": A, "backend": "scripted"})
    async for r in start(world, plugins, config, registry):
        assert r.kubelet.capacity(A) == 2  # advertised all the same

        def errors() -> list[logging.LogRecord]:
            return [
                rec for rec in caplog.records if rec.levelno == logging.ERROR and "cannot write the CDI spec" in rec.getMessage()
            ]

        await eventually(lambda: errors(), "the failed CDI write logged")  # the spec comes after the registration
        assert errors()[0].resource == A
        # Allocate tries again and fails clearly.
        pod = await r.kubelet.admit_pod("p", {A: 1})
        assert not pod.admitted
        assert "CDI" in pod.message


# -- fault isolation ----------------------------------------------------------------------------


async def test_a_failing_backend_is_restarted_and_the_others_keep_serving(
    world: World, plugins: PluginRegistry, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_of(
        plugins,
        {"name": A, "backend": "failing", "options": {"count": 2}},
        {"name": B, "backend": "scripted", "options": {"count": 2}},
        {"name": C, "backend": "fake", "options": {"count": 1}},
    )
    metrics = Metrics(registry=registry)
    async for r in start(world, plugins, config, registry, metrics):
        kubelet = r.kubelet
        await kubelet.wait_until(lambda: kubelet.allocatable(A) == 2, 5, "A listed")
        FailingBackend.fail.set()  # from now on every run of A's backend fails at once
        # Still registered, its devices listed Unhealthy: no new pod lands on them.
        await kubelet.wait_until(lambda: kubelet.capacity(A) == 2 and kubelet.allocatable(A) == 0, 5, "A unhealthy")
        await kubelet.wait_until(lambda: FailingBackend.runs >= 4, 5, "A's backend restarted, with backoff")
        assert kubelet.is_registered(A)
        assert not (await kubelet.admit_pod("on-a", {A: 1})).admitted
        # Every other resource serves on, untouched.
        assert (kubelet.allocatable(B), kubelet.allocatable(C)) == (2, 1)
        assert (await kubelet.admit_pod("on-b", {B: 2})).admitted
        assert r.supervisor.failure is None
        assert metrics.backends_down() == [A]
        assert not metrics.ready()
        assert sample(registry, "cdiplug_backend_restarts_total", backend="failing") >= 3
        failures = [rec for rec in caplog.records if "backend failing failed" in rec.getMessage()]
        assert (
            failures and "Input/output error" in failures[0].getMessage() and "restarting in 0.02 s" in failures[0].getMessage()
        )
        # The hardware comes back: the next run reports, the devices are healthy, /readyz is too.
        FailingBackend.fail = asyncio.Event()
        await kubelet.wait_until(lambda: kubelet.allocatable(A) == 2, 5, "A healthy again")
        assert metrics.backends_down() == [] and metrics.ready()


# -- kubelet restarts --------------------------------------------------------------------------


async def test_kubelet_restart_with_wipe_registers_everything_again(running: Running, registry: CollectorRegistry) -> None:
    kubelet = running.kubelet
    before = {n: running.registrations(n) for n in (A, B, C)}
    await kubelet.restart(wipe=True)
    for name in (A, B, C):
        await running.registered_again(name, before[name])
        assert running.manager.front_end("device-plugin").server(name).socket_present()
        assert sample(registry, "cdiplug_reregistrations_total", resource=name) >= 1
    assert sample(registry, "cdiplug_kubelet_restarts_total") == 1
    assert kubelet.capacity(A) == 2


async def test_kubelet_restart_without_wipe_registers_everything_again(running: Running) -> None:
    before = {n: running.registrations(n) for n in (A, B, C)}
    servers = {n: running.manager.front_end("device-plugin").server(n) for n in (A, B, C)}
    await running.kubelet.restart(wipe=False)
    for name in (A, B, C):
        await running.registered_again(name, before[name])
        assert running.manager.front_end("device-plugin").server(name) is servers[name]


async def test_our_socket_removed_alone_serves_it_again(running: Running) -> None:
    before = {n: running.registrations(n) for n in (A, B, C)}
    running.manager.front_end("device-plugin").server(B).socket_path.unlink()
    await running.registered_again(B, before[B])
    assert running.manager.front_end("device-plugin").server(B).socket_present()
    assert running.registrations(A) == before[A]  # the others were left alone


# -- reload ------------------------------------------------------------------------------------


async def test_reload_adds_removes_and_changes_without_touching_the_rest(running: Running, registry: CollectorRegistry) -> None:
    manager, kubelet = running.manager, running.kubelet
    [old_scripted] = ScriptedBackend.created
    server_a = manager.front_end("device-plugin").server(A)
    registration_a = kubelet.registration(A)
    await manager.reload(
        config_of(
            running.plugins,
            {"name": A, "backend": "scripted", "options": {"count": 2}},
            {"name": B, "backend": "scripted", "options": {"count": 3}},  # changed
            {"name": D, "backend": "fake", "options": {"count": 4}},  # added; C removed
        )
    )
    await kubelet.wait_until(lambda: kubelet.capacity(B) == 3, 5, "B with 3 devices")
    await kubelet.wait_registered(D)
    assert kubelet.capacity(D) == 4
    # C is gone: its socket too, and the kubelet lost its stream.
    assert not (running.world.kubelet_dir / "example.com-gamma.sock").exists()
    await kubelet.wait_until(lambda: kubelet.allocatable(C) == 0, 5, "C gone")
    assert C not in manager.front_end("device-plugin").resources
    assert sample(registry, "cdiplug_resource_ready", resource=C) == 0
    # A kept its server, its registration and its stream.
    assert manager.front_end("device-plugin").server(A) is server_a
    assert kubelet.registration(A) is registration_a
    assert running.registrations(A) == 1
    assert kubelet.allocatable(A) == 2
    # The scripted backend's resources changed: recreated; the old one was stopped.
    assert len(ScriptedBackend.created) == 2 and old_scripted.cancelled
    # A still allocates, through the new backend's allocator.
    pod = await kubelet.admit_pod("a", {A: 1, B: 3})
    assert pod.admitted, pod.message


async def test_reload_leaves_an_unchanged_backend_running(running: Running) -> None:
    [scripted] = ScriptedBackend.created
    before = running.kubelet.updates(A)
    await running.manager.reload(
        config_of(
            running.plugins,
            {"name": A, "backend": "scripted", "options": {"count": 2}},
            {"name": B, "backend": "scripted", "options": {"count": 2}},
            {"name": C, "backend": "fake", "options": {"count": 3}},
        )
    )
    await running.kubelet.wait_until(lambda: running.kubelet.capacity(C) == 3, 5)
    assert ScriptedBackend.created == [scripted] and not scripted.cancelled
    assert running.manager.backend("scripted") is scripted
    assert running.kubelet.updates(A) == before


async def test_reload_replicas_change_republishes(running: Running) -> None:
    await running.manager.reload(
        config_of(
            running.plugins,
            {"name": A, "backend": "scripted", "options": {"count": 2}, "replicas": 2},
            {"name": B, "backend": "scripted", "options": {"count": 2}},
            {"name": C, "backend": "fake", "options": {"count": 1}},
        )
    )
    await running.kubelet.wait_until(lambda: running.kubelet.capacity(A) == 4, 5, "A advertised twice over")
    assert [d.id for d in running.kubelet.devices(A)] == ["dev-0::0", "dev-0::1", "dev-1::0", "dev-1::1"]


async def test_reload_with_a_backend_that_cannot_start_changes_nothing(running: Running) -> None:
    [scripted] = ScriptedBackend.created
    with pytest.raises(BackendInitError, match="no such hardware"):
        await running.manager.reload(
            config_of(
                running.plugins,
                {"name": A, "backend": "scripted", "options": {"count": 2, "fail_create": True}},
                {"name": D, "backend": "fake"},
            )
        )
    assert set(running.manager.front_end("device-plugin").resources) == {A, B, C}
    assert not scripted.cancelled
    assert running.kubelet.capacity(C) == 1
    assert not (running.world.kubelet_dir / "example.com-delta.sock").exists()


# -- stop --------------------------------------------------------------------------------------


async def test_stop_removes_our_sockets_and_tasks(world: World, plugins: PluginRegistry, registry: CollectorRegistry) -> None:
    config = config_of(plugins, {"name": A, "backend": "scripted"}, {"name": C, "backend": "fake"})
    async for r in start(world, plugins, config, registry):
        await r.manager.stop()
        assert sorted(p.name for p in world.kubelet_dir.iterdir()) == ["kubelet.sock"]
        assert r.supervisor.names() == []
        assert ScriptedBackend.created[0].cancelled
