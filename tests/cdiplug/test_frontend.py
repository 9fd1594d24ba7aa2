"""The front-end seam (cdiplug.frontend): a third front end of the test's own, registered under
its own ``api``, served by the real daemon; the registry; the configuration checks per api; the
reload diff.

The test's front end (``Echo``, below) touches only its own code and the registry: it is
registered by :func:`cdiplug.frontend.register` with settings of its own (``voice``, its default
settled from the resource; ``replicas``, a name the device plugin reads too), named by
``api: echo`` in a real YAML file, and the in-process :class:`~cdiplug.daemon.Daemon` (real
configuration loading, real backend host with the fake backend, real device-plugin front end over
real gRPC to the kubelet stand-in) starts it, reloads it on a changed file and stops it, while it
receives the host's snapshots. A resource moved between the device plugin and it keeps getting
its snapshots whichever way it moves, and moved from it to the device plugin is handed over: the
devices its listeners still hold are advertised Unhealthy until they let go, at a reload and at
a start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from cdiplug import frontend
from cdiplug.config import check_against, load_config, parse_config
from cdiplug.dra.settings import DraSettings
from cdiplug.errors import ConfigError
from cdiplug.frontend import FrontEndParts, FrontEndTypeBase, Latest, ResourceProblem, changes
from cdiplug.models.devices import DeviceSnapshot, Health, HealthCause
from cdiplug.models.resource import Api, ResourceConfig
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, PodResourcesStandIn, started_daemon

FPGA, NIC = "example.com/fpga", "example.com/nic"


class Echo:
    """A front end that serves by remembering: what it was asked, and each resource's latest devices."""

    made: list[Echo] = []

    def __init__(self, parts: FrontEndParts[Any, Any]) -> None:
        self.host = parts.host
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.devices: dict[str, tuple[str, ...]] = {}
        self.unhealthy: dict[str, set[str]] = {}
        self.served: set[str] = set()
        self.changed = asyncio.Event()
        Echo.made.append(self)

    def _listener(self, name: str) -> Any:
        echo = self

        class Listener:
            def offer(self, snapshot: DeviceSnapshot) -> None:
                echo.devices[name] = tuple(d.id for d in snapshot.devices)
                echo.unhealthy[name] = {d.id for d in snapshot.devices if d.health is Health.UNHEALTHY}
                echo.changed.set()

        return Listener()

    def _serve(self, resources: Sequence[ResourceConfig[object]]) -> None:
        for name in self.served - {r.name for r in resources}:
            self.host.detach(name)
            self.devices.pop(name, None)
        self.served = {r.name for r in resources}
        for r in resources:
            self.host.attach(r.name, self._listener(r.name))

    async def start(self, resources: Sequence[ResourceConfig[object]]) -> None:
        self.calls.append(("start", tuple(r.name for r in resources)))
        self._serve(resources)

    async def reload(self, resources: Sequence[ResourceConfig[object]], recreated: frozenset[str]) -> None:
        self.calls.append(("reload", tuple(r.name for r in resources)))
        self._serve(resources)

    async def stop(self) -> None:
        self.calls.append(("stop", ()))
        self._serve(())

    async def wait_devices(self, name: str, count: int, unhealthy: set[str] | None = None) -> None:
        while len(self.devices.get(name, ())) != count or (unhealthy is not None and self.unhealthy.get(name) != unhealthy):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)


@attrs.frozen
class EchoSettings:
    """Echo's own settings: ``voice`` (default: the resource's class name), ``replicas`` (at most 3)."""

    voice: str = ""
    replicas: int = 1


LISTENING = HealthCause("echo-listener")


class EchoApi(FrontEndTypeBase):
    """``api: echo``: replicas up to 3 (to show a check of its own), sockets shorter than 50 bytes;
    its listeners (``held``: resource -> devices, set by the test) take part in a handover."""

    settings = EchoSettings
    hold_cause = LISTENING

    def __init__(self) -> None:
        self.held: dict[str, frozenset[str]] = {}
        self.asked: list[tuple[tuple[str, ...], bool]] = []

    def settle(self, settings: EchoSettings, resource: str, plugin: Any) -> EchoSettings:
        return settings if settings.voice else attrs.evolve(settings, voice=resource.partition("/")[2])

    def check(self, resources: Sequence[ResourceConfig[object]]) -> Iterator[ResourceProblem]:
        for r in resources:
            assert isinstance(r.settings, EchoSettings)
            if r.settings.replicas > 3:
                yield ResourceProblem(r.name, "replicas", f"echo repeats at most 3 times, got {r.settings.replicas}")

    def check_node(self, resources: Sequence[ResourceConfig[object]], world: World) -> Iterator[ResourceProblem]:
        for r in resources:
            if len(str(world.kubelet_dir / r.socket_name)) > 50:
                yield ResourceProblem(r.name, "name", "too long for echo")

    async def holding(
        self, resources: Sequence[ResourceConfig[object]], world: World, latest: Latest, *, at_start: bool
    ) -> dict[str, frozenset[str] | None]:
        self.asked.append((tuple(r.name for r in resources), at_start))
        return {r.name: self.held.get(r.name, frozenset()) for r in resources}

    def consumers(self, resource: ResourceConfig[object]) -> str:
        return "echo listeners"

    def create(self, parts: FrontEndParts[Any, Any]) -> Echo:
        return Echo(parts)


@pytest.fixture
def echo() -> Iterator[EchoApi]:
    Echo.made.clear()
    api = EchoApi()
    frontend.register("echo", api)
    try:
        yield api
    finally:
        frontend.unregister("echo")


def write(path: Path, *resources: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"resources": list(resources)}))
    return path


def fake(name: str, count: int, api: str | None = None, **more: Any) -> dict[str, Any]:
    return {"name": name, "backend": "fake", "options": {"count": count}} | ({"api": api} if api else {}) | more


# -- the done-when test: a front end of the test's own, served by the daemon -------------------------


@pytest.mark.usefixtures("echo")
async def test_the_daemon_serves_a_front_end_registered_by_a_test(world: World, short_tmp: Path) -> None:
    path = write(short_tmp / "c.yaml", fake(FPGA, 2, "echo", replicas=2))
    async with started_daemon(path, world) as d:
        assert d.node is not None and set(d.node.front_ends) == {"echo"}  # no device plugin made: none asked for
        [echo] = Echo.made
        assert echo.calls == [("start", (FPGA,))]
        await echo.wait_devices(FPGA, 2)  # the host's snapshots reach it
        assert d.node.config.resources[0].settings == EchoSettings(voice="fpga", replicas=2)  # its own, settled

        write(path, fake(FPGA, 3, "echo"), fake(NIC, 1, "echo"))
        assert await d.reload()
        assert echo.calls[1:] == [("reload", (FPGA,)), ("reload", (FPGA, NIC))]  # changes first, arrivals second
        await echo.wait_devices(FPGA, 3)  # its backend was made again with the new count
        await echo.wait_devices(NIC, 1)

        write(path, fake(FPGA, 3, "echo", replicas=4))
        assert not await d.reload()  # its own check refuses it; the old configuration stays
        assert len(echo.calls) == 3 and d.node.config.by_name().keys() == {FPGA, NIC}
    assert echo.calls[-1] == ("stop", ())
    assert echo.served == set()


@pytest.mark.usefixtures("echo")
async def test_a_resource_moving_between_front_ends_keeps_its_snapshots(world: World, short_tmp: Path) -> None:
    health = short_tmp / "health.yaml"
    health.write_text("{}")

    def resources(fpga_api: str | None, nic_api: str | None) -> list[dict[str, Any]]:
        return [
            {**fake(FPGA, 2, fpga_api), "options": {"count": 2, "health_file": str(health)}},
            {**fake(NIC, 1, nic_api), "options": {"count": 1, "health_file": str(health)}},
        ]

    path = write(short_tmp / "c.yaml", *resources(None, "echo"))
    async with (
        KubeletStandIn(world.kubelet_dir) as kubelet,
        PodResourcesStandIn(world.pod_resources_socket),  # no pod holds a device: nothing to hand over
        started_daemon(path, world) as d,
    ):
        await kubelet.wait_registered(FPGA, timeout=10)
        await kubelet.wait_until(lambda: len(kubelet.devices(FPGA)) == 2, 10)
        [echo] = Echo.made
        await echo.wait_devices(NIC, 1)

        # Both ways at once: each front end lets its resource go before the other takes it over,
        # so both keep receiving snapshots afterwards (not only the one replayed on attach).
        write(path, *resources("echo", None))
        assert await d.reload()
        await kubelet.wait_registered(NIC, timeout=10)
        await echo.wait_devices(FPGA, 2)
        health.write_text("{fpga-1: Unhealthy, nic-0: Unhealthy}")
        await echo.wait_devices(FPGA, 2, unhealthy={"fpga-1"})
        await kubelet.wait_until(
            lambda: [dev.health for dev in kubelet.devices(NIC)] == [Health.UNHEALTHY],
            10,
            what="the NIC's health, through the device plugin now",
        )
        assert NIC not in echo.devices and not (world.kubelet_dir / "example.com-fpga.sock").exists()


async def test_a_resource_leaving_the_third_front_end_is_handed_over_at_a_reload_and_at_a_start(
    echo: EchoApi, world: World, short_tmp: Path
) -> None:
    """Through the node's handover, asking echo (and nothing else) what its listeners hold."""
    path = write(short_tmp / "c.yaml", fake(FPGA, 2, "echo", voice="hi"))

    def health(kubelet: KubeletStandIn) -> dict[str, Health]:
        return {dev.id: dev.health for dev in kubelet.devices(FPGA)}

    async with KubeletStandIn(world.kubelet_dir) as kubelet:
        async with started_daemon(path, world) as d:
            assert d.node is not None
            d.node.handover.interval = 0.05
            await Echo.made[0].wait_devices(FPGA, 2)
            echo.held[FPGA] = frozenset({"fpga-1"})  # a listener of echo still uses fpga-1

            write(path, fake(FPGA, 2))
            assert await d.reload()
            assert d.node.handover.moving == [FPGA] and d.node.handover.target(FPGA) == "device-plugin"
            await kubelet.wait_registered(FPGA, timeout=10)
            await kubelet.wait_until(
                lambda: health(kubelet) == {"fpga-0": Health.HEALTHY, "fpga-1": Health.UNHEALTHY}, 10, what="fpga-1 held"
            )
            echo.held.clear()  # the listener let go
            await kubelet.wait_until(lambda: set(health(kubelet).values()) == {Health.HEALTHY}, 10, what="both served")
            assert d.node.handover.moving == []

        # A start with the device plugin while echo's listeners hold fpga-0 (a rolled DaemonSet).
        echo.held[FPGA] = frozenset({"fpga-0"})
        echo.asked.clear()
        async with started_daemon(path, world) as d:
            assert d.node is not None and d.node.handover.moving == [FPGA]
            assert echo.asked[0] == ((FPGA,), True)
            await kubelet.wait_until(
                lambda: health(kubelet) == {"fpga-0": Health.UNHEALTHY, "fpga-1": Health.HEALTHY}, 10, what="fpga-0 held"
            )


# -- configuration ----------------------------------------------------------------------------------


def error(data: dict[str, Any], source: str = "c.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source)
    return info.value


@pytest.mark.parametrize(
    ("resource", "message", "where"),
    [
        (fake(FPGA, 1, "dra", replicas=2), "replicas is a device-plugin setting; this resource has api: dra", "replicas"),
        (fake(FPGA, 1, "dra", replicas=1), "replicas is a device-plugin setting; this resource has api: dra", "replicas"),
        (
            fake(FPGA, 1, "dra", allocate=["envvar"]),
            "allocate is a device-plugin setting; this resource has api: dra",
            "allocate",
        ),
        (
            fake(FPGA, 1, "dra", cdi_kind="example.com/x"),
            "cdi_kind is a device-plugin setting; this resource has api: dra",
            "cdi_kind",
        ),
        (
            fake(FPGA, 1, dra_driver="x.example.com"),
            "dra_driver is a dra setting; this resource has api: device-plugin",
            "dra_driver",
        ),
        (
            fake(FPGA, 1, device_metadata=True),
            "device_metadata is a dra setting; this resource has api: device-plugin",
            "device_metadata",
        ),
        (fake(FPGA, 1, "dra", device_metadata="yes"), "expected true or false", "device_metadata"),
        (fake(FPGA, 1, "nope"), "expected one of 'device-plugin', 'dra', got 'nope'", "api"),
        (fake(FPGA, 1, api=5), "expected one of 'device-plugin', 'dra', got int 5", "api"),
        (fake(FPGA, 1, "dra", dra_driver="Fpga"), "DRA driver name 'Fpga' must be a DNS subdomain", "dra_driver"),
        # The default driver comes from the name: reported there.
        (fake("example.com/" + "f" * 60, 1, "dra"), "DRA driver name 'fff", "name"),
        (fake(FPGA, 1, replicas=0), "replicas must be at least 1, got 0", "replicas"),
    ],
)
def test_each_api_checks_its_own_settings(resource: dict[str, Any], message: str, where: str) -> None:
    err = error({"resources": [fake(NIC, 1), resource]})
    assert err.message.startswith(message)
    assert str(err).startswith(f"{err.message} @ $.resources[1].{where} (in c.yaml)")


def test_device_metadata_is_off_unless_a_dra_resource_asks() -> None:
    config = parse_config({"resources": [fake(FPGA, 1, "dra", device_metadata=True), fake(NIC, 1, "dra")]}, "c.yaml")
    assert [r.settings.device_metadata for r in config.resources] == [True, False]


def test_two_resources_cannot_share_a_dra_driver() -> None:
    err = error(
        {"resources": [fake(FPGA, 1, "dra", dra_driver="d.example.com"), fake(NIC, 1, "dra", dra_driver="d.example.com")]}
    )
    assert str(err) == f"DRA driver 'd.example.com' is already used by {FPGA} @ $.resources[1].dra_driver (in c.yaml)"


def test_files_valid_before_keep_loading(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.yaml",
        fake(FPGA, 2, "dra", dra_driver="fpga.example.com"),
        fake(NIC, 4, "device-plugin", replicas=3, cdi_kind="vendor.io/nic", allocate=["cdi-cri"]),
        fake("example.com/dongle", 1),
    )
    fpga, nic, dongle = load_config(path).resources
    assert fpga.api is Api.DRA and fpga.settings == DraSettings(dra_driver="fpga.example.com")
    assert nic.api is Api.DEVICE_PLUGIN and (nic.settings.replicas, nic.cdi_kind) == (3, "vendor.io/nic")
    assert dongle.api is Api.DEVICE_PLUGIN and dongle.settings.replicas == 1 and fpga.overlapping_devices
    assert not nic.overlapping_devices


@pytest.mark.usefixtures("echo")
def test_a_registered_api_is_accepted_and_checked() -> None:
    config = parse_config({"resources": [fake(FPGA, 1, "echo", replicas=3, voice="hi")]}, "c.yaml")
    assert config.resources[0].api == "echo" and config.resources[0].settings == EchoSettings("hi", 3)
    assert (
        error({"resources": [fake(FPGA, 1, "dra", voice="hi")]}).message == "voice is a echo setting; this resource has api: dra"
    )
    assert error({"resources": [fake(FPGA, 1, "echo", voice=5)]}).message == "expected a string, got int 5"
    assert str(error({"resources": [fake(FPGA, 1, "echo", voce=5)]})) == (
        "unknown key 'voce' (allowed: name, backend, options, api, voice, replicas) @ $.resources[0] (in c.yaml)"
    )
    # A setting two front ends read names both; one only a third reads, that one.
    assert error({"resources": [fake(FPGA, 1, "dra", replicas=2)]}).message == (
        "replicas is a device-plugin or echo setting; this resource has api: dra"
    )
    assert error({"resources": [fake(FPGA, 1, "echo", allocate=["envvar"])]}).message == (
        "allocate is a device-plugin setting; this resource has api: echo"
    )
    assert error({"resources": [fake(FPGA, 1, "nope")]}).message == "expected one of 'device-plugin', 'dra', 'echo', got 'nope'"
    err = error({"resources": [fake(NIC, 1), fake(FPGA, 1, "echo", replicas=5)]})
    assert str(err) == "echo repeats at most 3 times, got 5 @ $.resources[1].replicas (in c.yaml)"


@pytest.mark.usefixtures("echo")
def test_the_node_checks_of_every_api_run_against_the_node(short_tmp: Path) -> None:
    config = parse_config({"resources": [fake(NIC, 1), fake(FPGA, 1, "echo")]}, "c.yaml")
    check_against(config, World(kubelet_dir=short_tmp))
    deep = short_tmp / ("k" * (50 - len(str(short_tmp))))
    with pytest.raises(ConfigError) as info:
        check_against(config, World(kubelet_dir=deep))
    assert str(info.value) == "too long for echo @ $.resources[1].name (in c.yaml)"


def test_the_registry_refuses_what_it_cannot_serve() -> None:
    with pytest.raises(ValueError, match="already registered"):
        frontend.register("dra", EchoApi())

    class Clashing(EchoApi):
        settings = attrs.frozen(type("Clashing", (), {"__annotations__": {"name": "str"}, "name": ""}))

    with pytest.raises(ValueError, match=r"name keys every resource has: \['name'\]"):
        frontend.register("mine", Clashing())
    with pytest.raises(ValueError, match="not an attrs class"):
        frontend.register("mine", type("Plain", (EchoApi,), {"settings": dict})())
    with pytest.raises(ValueError, match="not 'module:attribute'"):
        frontend.register("mine", "cdiplug.nothing")
    assert "mine" not in frontend.registered()
    frontend.register("broken", "cdiplug_no_such_module:FRONT_END")
    try:
        with pytest.raises(Exception, match="the front end of api 'broken' .* cannot be loaded: No module named"):
            frontend.front_end_type("broken")
    finally:
        frontend.unregister("broken")
    assert list(frontend.registered()) == ["device-plugin", "dra"]


# -- the reload diff --------------------------------------------------------------------------------


def rc(name: str, count: int = 1, driver: str = "") -> ResourceConfig[object]:
    return ResourceConfig(name, "fake", count, api=Api.DRA, settings=DraSettings(dra_driver=driver))


def test_changes_say_what_to_stop_start_and_update() -> None:
    a, b, c, d = "ab.io/a", "ab.io/b", "ab.io/c", "ab.io/d"
    running = {a: rc(a), b: rc(b), c: rc(c), d: rc(d, driver="d.ab.io")}
    new = [rc(d, driver="e.ab.io"), rc(b, 2), rc(c), rc("ab.io/e")]
    diff = changes(running, new, frozenset({c}), restart=lambda old, new: old.settings != new.settings)
    assert diff.removed == (a, d)  # gone, and to start afresh
    assert [r.name for r in diff.added] == [d, "ab.io/e"]  # in the new configuration's order
    assert [r.name for r in diff.changed] == [b, c]  # new options; a new backend
    assert diff.gone(a) and not diff.gone(d)
    assert changes(running, list(running.values()), frozenset()) == frontend.Changes((), (), ())


def test_every_setting_belongs_to_a_built_in_front_end() -> None:
    settings = ("cdi_kind", "allocate", "replicas", "dra_driver", "device_metadata", "register_when_empty")
    assert {s: frontend.owners(s) for s in settings} == {
        "cdi_kind": ["device-plugin"],
        "allocate": ["device-plugin"],
        "replicas": ["device-plugin"],
        "dra_driver": ["dra"],
        "device_metadata": ["dra"],
        "register_when_empty": ["device-plugin"],
    }
