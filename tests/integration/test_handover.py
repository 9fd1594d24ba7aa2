"""A resource moving from the device plugin to DRA on a live node (cdiplug.handover): never two pods on one device.

The node (the fake backend, both front ends, real gRPC on unix sockets) against the device-plugin
kubelet stand-in, the DRA kubelet stand-in, the kubelet's PodResources stand-in (what device-plugin
pods hold) and the API-server stand-in (the ResourceSlices). Covers: the device plugin's socket is
gone before DRA publishes; a device a device-plugin pod holds is published tainted
``cdiplug.dev/device-plugin-pod=true:NoSchedule`` until that pod is gone, the others untainted,
and the device plugin's CDI spec kept until then;
a kubelet that does not answer keeps every device held until it does; a resource that leaves DRA
again ends its handover; the way back, devices of running pods' claims advertised Unhealthy to
the kubelet until those pods go, and the DRA driver's sockets kept (slices withdrawn, no new
claim prepared) until the kubelet has unprepared its last claim, also when the daemon starts with
the device plugin while claims are prepared; a daemon that starts with DRA while device-plugin pods of its
predecessor run (a rolled DaemonSet). Prints the measured timeline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.node import Node
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn, KubeletStandIn, PodResourcesStandIn
from cdiplug.testing.dra_kubelet import ClaimRef
from cdiplug.toolkit.supervisor import Supervisor

FPGA = "example.com/fpga"
DRIVER = "fpga.example.com"
NODE = "node-a"
TAINT = {"key": "cdiplug.dev/device-plugin-pod", "value": "true", "effect": "NoSchedule"}
DP_SPEC = "cdiplug-example.com-fpga.json"  # the device plugin's CDI spec of the FPGAs


def config(api: str) -> Config:
    return parse_config({"resources": [{"name": FPGA, "backend": "fake", "api": api, "options": {"count": 2}}]}, "handover")


def taints(api: ApiServerStandIn) -> dict[str, list[dict[str, Any]]]:
    """Device name -> its taints, over every slice of the driver."""
    return {d["name"]: d.get("taints", []) for s in api.slices(spec__driver=DRIVER) for d in s["spec"].get("devices") or []}


async def settle(api: ApiServerStandIn, predicate: Callable[[dict[str, list[dict[str, Any]]]], bool]) -> None:
    await asyncio.wait_for(api.wait_for(lambda: predicate(taints(api))), 10)


async def test_devices_device_plugin_pods_hold_are_tainted_until_the_pods_are_gone(
    dra_world: World, api: ApiServerStandIn
) -> None:
    supervisor = Supervisor()
    node = Node(config("device-plugin"), dra_world, supervisor)
    node.handover.interval = 0.05
    async with (
        KubeletStandIn(dra_world.kubelet_dir) as dp_kubelet,
        DraKubeletStandIn(dra_world.plugins_registry_dir) as dra_kubelet,
        PodResourcesStandIn(dra_world.pod_resources_socket) as pod_resources,
    ):
        try:
            await node.start()
            await dp_kubelet.wait_registered(FPGA, timeout=10)
            pod = await dp_kubelet.admit_pod("classic", {FPGA: 1})
            (held,) = pod.device_ids()
            free = ({"fpga-0", "fpga-1"} - {held}).pop()
            pod_resources.hold("default", "classic", "main", FPGA, [held])

            started = time.monotonic()
            await node.reload(config("dra"))
            await asyncio.wait_for(dra_kubelet.wait_registered(DRIVER), 10)
            await settle(api, lambda t: set(t) == {"fpga-0", "fpga-1"})
            published = time.monotonic()
            assert not (dra_world.kubelet_dir / "example.com-fpga.sock").exists()  # the device plugin went first
            await dp_kubelet.wait_until(lambda: dp_kubelet.allocatable(FPGA) == 0, 5, "the classic FPGAs gone")
            assert taints(api) == {held: [TAINT], free: []}  # no DRA claim gets the pod's device
            assert node.handover.moving == [FPGA]
            # The device plugin's CDI spec stays while its pods run: a container of theirs that
            # restarts (or one admitted just before the socket went) is created from it.
            assert (dra_world.cdi_dir / DP_SPEC).exists()

            pod_resources.release_pod("default", "classic")  # the classic pod is gone
            released = time.monotonic()
            await settle(api, lambda t: t == {held: [], free: []})
            untainted = time.monotonic()
            await asyncio.wait_for(supervisor.join("handover"), 10)
            assert node.handover.moving == []
            assert not (dra_world.cdi_dir / DP_SPEC).exists()  # then swept as any spec of no resource
            print(
                f"device plugin -> DRA: socket gone, pod's device held, slice published {published - started:.3f} s after the reload; "
                f"taint off {untainted - released:.3f} s after the last device-plugin pod went"
            )
            assert supervisor.failure is None
        finally:
            await supervisor.close()
            await node.stop()


async def test_a_kubelet_that_does_not_answer_keeps_every_device_held(dra_world: World, api: ApiServerStandIn) -> None:
    supervisor = Supervisor()
    node = Node(config("device-plugin"), dra_world, supervisor)
    node.handover.interval = 0.05
    async with (
        KubeletStandIn(dra_world.kubelet_dir) as dp_kubelet,
        DraKubeletStandIn(dra_world.plugins_registry_dir),
        PodResourcesStandIn(dra_world.pod_resources_socket) as pod_resources,
    ):
        try:
            await node.start()
            await dp_kubelet.wait_registered(FPGA, timeout=10)
            pod_resources.hold("default", "classic", "main", FPGA, ["fpga-1"])
            pod_resources.fail_with = grpc.StatusCode.UNAVAILABLE
            await node.reload(config("dra"))
            await settle(api, lambda t: t == {"fpga-0": [TAINT], "fpga-1": [TAINT]})  # don't know: nothing handed out
            pod_resources.fail_with = None
            await settle(api, lambda t: t == {"fpga-0": [], "fpga-1": [TAINT]})
            await node.reload(config("device-plugin"))  # back before the handover finished: it ends
            assert node.handover.moving == [] and dra_world.pod_resources_socket.exists()
            await dp_kubelet.wait_registered(FPGA, timeout=10)
            assert supervisor.failure is None
        finally:
            await supervisor.close()
            await node.stop()


async def test_the_way_back_waits_for_the_pods_of_dra_claims(dra_world: World, api: ApiServerStandIn) -> None:
    supervisor = Supervisor()
    node = Node(config("dra"), dra_world, supervisor)
    node.handover.interval = 0.05
    async with (
        KubeletStandIn(dra_world.kubelet_dir) as dp_kubelet,
        DraKubeletStandIn(dra_world.plugins_registry_dir) as dra_kubelet,
        PodResourcesStandIn(dra_world.pod_resources_socket) as pod_resources,
    ):
        try:
            await node.start()
            await asyncio.wait_for(dra_kubelet.wait_registered(DRIVER), 10)
            await settle(api, lambda t: set(t) == {"fpga-0", "fpga-1"})
            pod_resources.hold_claim("default", "dra-pod", "main", "claim-0", DRIVER, NODE, "fpga-0")

            await node.reload(config("device-plugin"))
            await settle(api, lambda t: t == {})  # the DRA driver went first: its slices withdrawn
            await dp_kubelet.wait_registered(FPGA, timeout=10)
            assert {d.id: d.healthy for d in dp_kubelet.devices(FPGA)} == {"fpga-0": False, "fpga-1": True}
            first = await dp_kubelet.admit_pod("classic-0", {FPGA: 1})
            assert first.device_ids() == ("fpga-1",)  # never the claim's device
            second = await dp_kubelet.admit_pod("classic-1", {FPGA: 1})
            assert not second.admitted
            assert node.handover.moving == [FPGA]

            pod_resources.release_pod("default", "dra-pod")
            await dp_kubelet.wait_until(lambda: dp_kubelet.allocatable(FPGA) == 2, 10, "fpga-0 Healthy again")
            assert node.handover.moving == []
            assert supervisor.failure is None
        finally:
            await supervisor.close()
            await node.stop()


def put_claim(api: ApiServerStandIn, name: str, device: str) -> ClaimRef:
    uid = f"{abs(hash(name)) % 10**8:08d}-0000-4000-8000-000000000000"
    results = [{"request": "fpga", "driver": DRIVER, "pool": NODE, "device": device}]
    api.put_claim(
        {
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
    )
    return ClaimRef("default", name, uid)


async def test_the_way_back_keeps_the_dra_driver_until_its_claims_are_unprepared(dra_world: World, api: ApiServerStandIn) -> None:
    # Without its socket the kubelet cannot unprepare, and the claim's pod stays Terminating.
    supervisor = Supervisor()
    node = Node(config("dra"), dra_world, supervisor)
    node.handover.interval = 0.05
    async with (
        KubeletStandIn(dra_world.kubelet_dir) as dp_kubelet,
        DraKubeletStandIn(dra_world.plugins_registry_dir) as dra_kubelet,
        PodResourcesStandIn(dra_world.pod_resources_socket) as pod_resources,
    ):
        try:
            await node.start()
            conn = await asyncio.wait_for(dra_kubelet.wait_registered(DRIVER), 10)
            await settle(api, lambda t: set(t) == {"fpga-0", "fpga-1"})
            prepared = put_claim(api, "claim-0", "fpga-0")
            assert not (await conn.prepare([prepared]))[prepared.uid].error
            pod_resources.hold_claim("default", "dra-pod", "main", "claim-0", DRIVER, NODE, "fpga-0")
            late = put_claim(api, "claim-1", "fpga-1")  # allocated just before the slices went

            await node.reload(config("device-plugin"))
            await settle(api, lambda t: t == {})  # slices withdrawn at once
            await dp_kubelet.wait_registered(FPGA, timeout=10)
            front_end = node.front_end("dra")
            assert list(front_end.draining) == [DRIVER]
            driver = front_end.draining[DRIVER]
            assert driver.dra_socket.exists() and driver.registration_socket.exists()
            refused = (await conn.prepare([late]))[late.uid].error
            assert "claim default/claim-1" in refused and "no longer served by DRA" in refused, refused
            assert (await conn.prepare([prepared]))[prepared.uid].devices  # a repeated prepare is still answered

            pod_resources.release_pod("default", "dra-pod")
            assert await conn.unprepare([prepared]) == {prepared.uid: ""}  # the kubelet unprepares: it can
            await asyncio.wait_for(supervisor.join(f"dra-drained:{DRIVER}"), 10)
            assert front_end.draining == {}
            assert not driver.dra_socket.exists() and not driver.registration_socket.exists()
            assert not list(dra_world.cdi_dir.glob("cdiplug-claim-*.json"))
            await dp_kubelet.wait_until(lambda: dp_kubelet.allocatable(FPGA) == 2, 10, "fpga-0 Healthy again")
            assert supervisor.failure is None
        finally:
            await supervisor.close()
            await node.stop()


async def test_a_daemon_started_with_the_device_plugin_after_dra_claims_finishes_them(
    dra_world: World, api: ApiServerStandIn
) -> None:
    # A DaemonSet rolled back to the device plugin, or a restart during a drain, while a claim's pod runs.
    async with (
        KubeletStandIn(dra_world.kubelet_dir) as dp_kubelet,
        DraKubeletStandIn(dra_world.plugins_registry_dir) as dra_kubelet,
        PodResourcesStandIn(dra_world.pod_resources_socket) as pod_resources,
    ):
        supervisor = Supervisor()
        node = Node(config("dra"), dra_world, supervisor)
        try:
            await node.start()
            conn = await asyncio.wait_for(dra_kubelet.wait_registered(DRIVER), 10)
            await settle(api, lambda t: set(t) == {"fpga-0", "fpga-1"})
            prepared = put_claim(api, "claim-0", "fpga-0")
            assert not (await conn.prepare([prepared]))[prepared.uid].error
            pod_resources.hold_claim("default", "dra-pod", "main", "claim-0", DRIVER, NODE, "fpga-0")
        finally:
            await supervisor.close()
            await node.stop()

        supervisor = Supervisor()
        node = Node(config("device-plugin"), dra_world, supervisor)
        node.handover.interval = 0.05
        try:
            await node.start()
            await dp_kubelet.wait_registered(FPGA, timeout=10)
            await dp_kubelet.wait_until(
                lambda: {d.id: d.healthy for d in dp_kubelet.devices(FPGA)} == {"fpga-0": False, "fpga-1": True},
                10,
                "the claim's device held, the other served",
            )
            first = await dp_kubelet.admit_pod("classic-0", {FPGA: 1})
            assert first.device_ids() == ("fpga-1",)  # never the claim's device
            assert list(node.front_end("dra").draining) == [DRIVER]  # started for the checkpoint alone
            await settle(api, lambda t: t == {})  # the old slices withdrawn
            conn = await asyncio.wait_for(dra_kubelet.wait_registered(DRIVER), 10)

            pod_resources.release_pod("default", "dra-pod")
            assert await conn.unprepare([prepared]) == {prepared.uid: ""}
            await asyncio.wait_for(supervisor.join(f"dra-drained:{DRIVER}"), 10)
            assert node.front_end("dra").draining == {}
            assert not dra_kubelet.socket(DRIVER).exists()
            assert not list(dra_world.cdi_dir.glob("cdiplug-claim-*.json"))
            await dp_kubelet.wait_until(lambda: dp_kubelet.allocatable(FPGA) == 2, 10, "fpga-0 Healthy again")
            assert supervisor.failure is None
        finally:
            await supervisor.close()
            await node.stop()


async def test_a_daemon_started_with_dra_after_device_plugin_pods_holds_theirs(dra_world: World, api: ApiServerStandIn) -> None:
    # A rolled DaemonSet: the new pod starts with api: dra while a pod the old one served still runs.
    supervisor = Supervisor()
    node = Node(config("dra"), dra_world, supervisor)
    node.handover.interval = 0.05
    async with (
        DraKubeletStandIn(dra_world.plugins_registry_dir) as dra_kubelet,
        PodResourcesStandIn(dra_world.pod_resources_socket) as pod_resources,
    ):
        pod_resources.hold("default", "classic", "main", FPGA, ["fpga-1"])
        try:
            await node.start()
            await asyncio.wait_for(dra_kubelet.wait_registered(DRIVER), 10)
            await settle(api, lambda t: t == {"fpga-0": [], "fpga-1": [TAINT]})
            pod_resources.release_pod("default", "classic")
            await settle(api, lambda t: t == {"fpga-0": [], "fpga-1": []})
            assert node.handover.moving == [] and supervisor.failure is None
        finally:
            await supervisor.close()
            await node.stop()
