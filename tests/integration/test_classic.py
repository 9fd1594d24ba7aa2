"""The classic device plugin experiment through the real daemon, in-process, and the kubelet stand-in.

Real gRPC over unix sockets in a short temporary folder; the daemon runs in the test's event loop
with the fake backend serving several resources from one process. Covers: every resource
registered on its own socket; two pods get distinct devices with their env; a third pod asking for
more than the node has stays Pending; a health change drops allocatable and back; the preferred
allocation keeps a pod on one NUMA node; bad Allocate requests (unknown IDs, duplicate IDs, empty
requests) get INVALID_ARGUMENT naming the IDs; 64 concurrent Allocates all get the right answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, running_daemon
from cdiplug.testing.kubelet import PodPhase

FPGA = "example.com/fpga"
NIC = "example.com/nic"
MANY = "example.com/many"
RESOURCES = (FPGA, NIC, MANY)


@pytest.fixture
def health_file(short_tmp: Path) -> Path:
    return short_tmp / "fpga-health.yaml"


@pytest.fixture
def config(health_file: Path) -> Config:
    return parse_config(
        {
            "resources": [
                {"name": FPGA, "backend": "fake", "options": {"count": 2, "health_file": str(health_file)}},
                {"name": NIC, "backend": "fake", "options": {"count": 4, "numa_nodes": [0, 1]}},
                {"name": MANY, "backend": "fake", "options": {"count": 64}},
            ]
        },
        source="test_classic",
    )


@pytest.fixture
async def kubelet(world: World, config: Config) -> AsyncIterator[KubeletStandIn]:
    async with KubeletStandIn(world.kubelet_dir) as kubelet, running_daemon(config, world):
        for resource in RESOURCES:
            await kubelet.wait_registered(resource, timeout=10)
        yield kubelet


async def test_one_process_serves_every_resource_on_its_own_socket(kubelet: KubeletStandIn, world: World) -> None:
    assert kubelet.resources == tuple(sorted(RESOURCES))
    for resource in RESOURCES:
        registration = kubelet.registration(resource)
        assert registration is not None
        assert registration.endpoint == resource.replace("/", "-") + ".sock"
        assert (world.kubelet_dir / registration.endpoint).is_socket()
    assert (kubelet.capacity(FPGA), kubelet.capacity(NIC), kubelet.capacity(MANY)) == (2, 4, 64)
    assert [d.id for d in kubelet.devices(FPGA)] == ["fpga-0", "fpga-1"]
    assert [d.numa_nodes for d in kubelet.devices(NIC)] == [(0,), (1,), (0,), (1,)]
    assert [d.numa_nodes for d in kubelet.devices(FPGA)] == [(), ()]  # no topology: none, never a made-up 0


async def test_classic_experiment(kubelet: KubeletStandIn, health_file: Path, world: World) -> None:
    assert kubelet.allocatable(FPGA) == 2

    a = await kubelet.admit_pod("a", {FPGA: 1})
    b = await kubelet.admit_pod("b", {FPGA: 1})
    assert a.admitted and b.admitted
    assert sorted([*a.device_ids(), *b.device_ids()]) == ["fpga-0", "fpga-1"]
    for pod in (a, b):
        (device,) = pod.device_ids()
        index = device.rpartition("-")[2]
        assert pod.env == {"FAKE_FPGA_DEVICES": device, f"FAKE_FPGA_DEVICE_{index}": device}
        assert pod.cdi_devices == (f"{FPGA}={device}",)

    c = await kubelet.admit_pod("c", {FPGA: 3})
    assert c.phase is PodPhase.PENDING and c.reason == f"Insufficient {FPGA}"

    health_file.write_text("fpga-1: Unhealthy\n")
    await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 1, timeout=5, what="fpga-1 to turn Unhealthy")
    assert kubelet.capacity(FPGA) == 2
    health_file.write_text("fpga-1: Healthy\n")
    await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 2, timeout=5, what="fpga-1 to be Healthy again")

    spec = json.loads((world.cdi_dir / "cdiplug-example.com-fpga.json").read_text())
    assert spec["kind"] == FPGA and sorted(d["name"] for d in spec["devices"]) == ["fpga-0", "fpga-1"]

    assert kubelet.remove_pod("a")
    again = await kubelet.admit_pod("c", {FPGA: 1})
    assert again.device_ids() == a.device_ids()


async def test_preferred_allocation_keeps_a_pod_on_one_numa_node(kubelet: KubeletStandIn) -> None:
    registration = kubelet.registration(NIC)
    assert registration is not None and registration.options.get_preferred_allocation_available
    pod = await kubelet.admit_pod("numa", {NIC: 2})
    nodes = {d.numa_nodes for d in kubelet.devices(NIC) if d.id in pod.device_ids()}
    assert pod.admitted and len(nodes) == 1, pod


async def test_resources_are_independent(kubelet: KubeletStandIn) -> None:
    pod = await kubelet.admit_pod("mixed", [{FPGA: 2}, {NIC: 1, MANY: 3}])
    assert pod.admitted
    assert len(pod.device_ids(FPGA)) == 2 and len(pod.device_ids(NIC)) == 1 and len(pod.device_ids(MANY)) == 3
    assert (await kubelet.admit_pod("more", {FPGA: 1})).reason == f"Insufficient {FPGA}"
    assert (await kubelet.admit_pod("nic", {NIC: 3})).admitted


@pytest.mark.parametrize(
    ("containers", "named"),
    [
        ([["fpga-9"]], ["fpga-9"]),
        ([["fpga-0", "nope", "fpga-7"]], ["nope", "fpga-7"]),
        ([["fpga-0", "fpga-0"]], ["fpga-0"]),
        ([["fpga-0"], ["fpga-1", "fpga-1"]], ["fpga-1"]),
        ([[]], []),
        ([["fpga-0"], []], []),
    ],
    ids=["unknown", "unknown-among-known", "duplicate", "duplicate-in-second-container", "empty", "second-empty"],
)
async def test_bad_requests_are_invalid_argument_naming_the_ids(
    kubelet: KubeletStandIn, containers: list[list[str]], named: list[str]
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await kubelet.allocate(FPGA, *containers)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    for device_id in named:
        assert device_id in details, details
    # The daemon goes on serving.
    (answer,) = await kubelet.allocate(FPGA, ["fpga-0"])
    assert dict(answer.env)["FAKE_FPGA_DEVICES"] == "fpga-0"


async def test_a_bad_request_names_its_container(kubelet: KubeletStandIn) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await kubelet.allocate(FPGA, ["fpga-0"], ["fpga-x"])
    assert "fpga-x" in (caught.value.details() or "") and "1" in (caught.value.details() or "")


async def test_64_concurrent_allocates_all_get_their_own_answer(kubelet: KubeletStandIn) -> None:
    ids = [f"many-{i}" for i in range(64)]
    answers = await asyncio.gather(*(kubelet.allocate(MANY, [i]) for i in ids))
    for device_id, (answer,) in zip(ids, answers, strict=True):
        index = device_id.rpartition("-")[2]
        assert answer.device_ids == (device_id,)
        assert dict(answer.env) == {"FAKE_MANY_DEVICES": device_id, f"FAKE_MANY_DEVICE_{index}": device_id}
        assert answer.cdi_devices == (f"{MANY}={device_id}",)
    # And 64 at once for the same devices, several per call, answer the same each time.
    same = await asyncio.gather(*(kubelet.allocate(MANY, ids[:4], ids[4:6]) for _ in range(64)))
    assert len({tuple((a.device_ids, a.env, a.cdi_devices) for a in answer) for answer in same}) == 1
    assert [a.device_ids for a in same[0]] == [tuple(ids[:4]), tuple(ids[4:6])]
