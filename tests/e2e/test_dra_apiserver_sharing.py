"""Shared devices (KEP-5075) and partitions (KEP-4815) as a REAL kube-apiserver 1.36 takes them.

The harness of ``test_dra_apiserver.py`` (etcd and kube-apiserver on free loopback ports in a
temporary folder of this module's own). Covers: the slices our publisher writes for a device
that allows multiple allocations with a capacity request policy, and for partitionable devices
(counter sets in a slice of their own, partitions consuming them) are stored as sent, with the
feature fields kept (a server whose gates were off would drop them); the fake backend's
devices of ``deploy/examples/dra/cdiplug-config.yaml`` (shared GPUs, a partitioned tile) are
stored as published; the examples (capacity, partitions, shared claim, the ConfigMap) are
accepted (dry run), the claim's capacity request kept; a claim's
allocation with ``shareID`` and ``consumedCapacity``, as the scheduler writes it, is read back
by :func:`cdiplug.dra.claims.allocated`, and the share's device status entry keeps its
``shareID``; the NVIDIA backend's MIG devices (from FakeNvml's MIG) and their GPU's counter set
are stored as published (memory in bytes); the bench's device in 63 partitions (192 counter uses in
one slice) is taken; the server's feature gates DRAConsumableCapacity, DRAPartitionableDevices,
DRADeviceTaints and DRAResourceClaimDeviceStatus are on (its ``kubernetes_feature_enabled``
metric), with no flag given.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdiplug.config import parse_config
from cdiplug.dra import status
from cdiplug.dra.claims import AllocatedDevice, ClaimRef, allocated
from cdiplug.dra.publisher import SlicePublisher
from cdiplug.kube.client import LightkubeClient
from cdiplug.kube.credentials import load_kubeconfig
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot
from cdiplug.models.sharing import CounterConsumption, CounterSet, DeviceSharing, PoolSharing, RequestPolicy
from cdiplug.models.world import World
from cdiplug_backends.fake import FakeBackend
from cdiplug_backends.nvidia.discovery import assign_migs, build_mig_snapshot, discover
from cdiplug_backends.nvidia.nvml import Nvml
from cdiplug_backends.nvidia.testing import FakeGpu, FakeMig, FakeNvml
from cdiplug_backends.nvidia.testing.values import NVML_DEVICE_MIG_ENABLE

pytestmark = pytest.mark.e2e

_spec = importlib.util.spec_from_file_location("_dra_apiserver_harness", Path(__file__).with_name("test_dra_apiserver.py"))
assert _spec is not None and _spec.loader is not None
_harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness)
apiserver = _harness.apiserver  # the module-scoped fixture: a server of this module's own
kubectl = _harness.kubectl
REPO = _harness.REPO
DRIVER = "gpu.example.com"


@pytest.fixture
async def client(apiserver: Path) -> AsyncIterator[LightkubeClient]:
    client = LightkubeClient(load_kubeconfig(apiserver))
    yield client
    await client.close()


def shared_device(i: int) -> Device:
    policy = RequestPolicy(default="1Gi", min="1Gi", max="80Gi", step="1Gi")
    return Device(
        f"gpu-{i}", capacity={"memory": "80Gi"}, sharing=DeviceSharing(shared=True, capacity_policies={"memory": policy})
    )


def partitions(whole: str) -> tuple[CounterSet, list[Device]]:
    counters = CounterSet(f"{whole}-counters", {f"slice-{k}": "1" for k in range(4)})
    devices = [
        Device(whole, sharing=DeviceSharing(consumes_counters=[CounterConsumption(counters.name, dict(counters.counters))]))
    ]
    for k in range(2):
        used = {f"slice-{2 * k + j}": "1" for j in range(2)}
        devices.append(
            Device(f"{whole}-{k + 1}of2", sharing=DeviceSharing(consumes_counters=[CounterConsumption(counters.name, used)]))
        )
    return counters, devices


async def test_shared_and_partitioned_devices_are_stored_as_published(client: LightkubeClient) -> None:
    publisher = SlicePublisher(client, DRIVER, "n1", backoff=(0.05, 0.5))
    task = asyncio.create_task(publisher.run(), name="publisher")
    try:
        sets, parts = [], []
        for w in range(10):  # ten counter sets: two counter slices of at most eight
            counters, devices = partitions(f"part-{w}")
            sets.append(counters)
            parts.extend(devices)
        snapshot = DeviceSnapshot("example.com/gpu", [shared_device(0), shared_device(1), *parts], sharing=PoolSharing(sets))
        publisher.want(snapshot)
        await asyncio.wait_for(publisher.wait_published(1), 30)
        slices, _ = await client.list_slices(DRIVER, "n1")
        items = [s.to_dict() for s in slices]  # the API's own field names
        by_name = {i["metadata"]["name"]: i["spec"] for i in items}
        assert len(items) == 3 and {s["pool"]["resourceSliceCount"] for s in by_name.values()} == {3}
        counter_slices = [s for s in by_name.values() if s.get("sharedCounters")]
        assert sorted(len(s["sharedCounters"]) for s in counter_slices) == [2, 8]
        assert all(not s.get("devices") for s in counter_slices)
        devices = {d["name"]: d for s in by_name.values() for d in s.get("devices") or ()}
        assert devices["gpu-0"]["allowMultipleAllocations"] is True  # DRAConsumableCapacity kept it
        assert devices["gpu-0"]["capacity"]["memory"] == {
            "value": "80Gi",
            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"}},
        }
        assert devices["part-3-2of2"]["consumesCounters"] == [  # DRAPartitionableDevices kept it
            {"counterSet": "part-3-counters", "counters": {"slice-2": {"value": "1"}, "slice-3": {"value": "1"}}}
        ]
        assert len(devices) == 32
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await publisher.withdraw()
    assert (await client.list_slices(DRIVER, "n1"))[0] == []


async def test_a_share_allocation_as_the_scheduler_writes_it(client: LightkubeClient, apiserver: Path) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "share", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": "30Gi"}}}}
                ]
            }
        },
    }
    created = json.loads(kubectl(apiserver, "create", "-f", "-", "-o", "json", input=claim))
    assert created["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "30Gi"}}
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0", "shareID": str(uuid.uuid4())}
    created["status"] = {"allocation": {"devices": {"results": [result | {"consumedCapacity": {"memory": "30Gi"}}]}}}
    kubectl(apiserver, "replace", "--subresource=status", "-f", "-", input=created)
    got = await client.get_claim("default", "share")
    assert got.metadata is not None and got.metadata.uid is not None
    assert got.status is not None and got.status.allocation is not None and got.status.allocation.devices is not None
    (stored,) = got.status.allocation.devices.results or ()
    assert stored.shareID == result["shareID"] and stored.consumedCapacity == {"memory": "30Gi"}
    uid = got.metadata.uid
    claim_read = allocated(got, ClaimRef("default", "share", uid), DRIVER, "n1")
    assert claim_read.results == (AllocatedDevice("gpu", "n1", "gpu-0", result["shareID"], (("memory", "30Gi"),)),)
    # The share's status entry (KEP-4817) names its share: the server keeps shareID.
    entry = status.device_status(DRIVER, "n1", "gpu-0", Device("gpu-0")) | {"shareID": result["shareID"]}
    assert await status.publish(lambda: client, DRIVER, "default", "share", uid, [entry])
    again = await client.get_claim("default", "share")
    assert again.status is not None
    assert [(d.device, d.shareID) for d in again.status.devices or ()] == [("gpu-0", result["shareID"])]


EXAMPLES = REPO / "deploy" / "examples" / "dra"


def example_config() -> list[Any]:
    data = yaml.safe_load((EXAMPLES / "cdiplug-config.yaml").read_text())
    return list(parse_config(yaml.safe_load(data["data"]["config.yaml"]), "cdiplug-config.yaml").resources)


async def test_the_example_config_s_fake_devices_are_stored_as_published(client: LightkubeClient, world: World) -> None:
    for resource in example_config():
        if resource.name == "example.com/fpga":
            continue
        snapshot = FakeBackend([resource], world).snapshot(resource, {})
        publisher = SlicePublisher(client, resource.settings.dra_driver, "n1", backoff=(0.05, 0.5))
        task = asyncio.create_task(publisher.run(), name="publisher")
        try:
            publisher.want(snapshot)
            await asyncio.wait_for(publisher.wait_published(1), 30)
            slices, _ = await client.list_slices(resource.settings.dra_driver, "n1")
            items = [s.to_dict() for s in slices]  # the API's own field names
            devices = {d["name"]: d for i in items for d in i["spec"].get("devices") or ()}
            counters = [c["name"] for i in items for c in i["spec"].get("sharedCounters") or ()]
            assert sorted(devices) == sorted(snapshot.ids)
            if resource.name == "example.com/tile":
                assert counters == ["tile-0-slices"] and len(devices) == 7
                assert devices["tile-0-2of4"]["attributes"]["parts"] == {"int": 4}
            else:
                assert devices["gpu-1"]["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "1Gi", "step": "1Gi"}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await publisher.withdraw()


def test_the_sharing_examples_are_accepted(apiserver: Path) -> None:
    kubectl(apiserver, "create", "namespace", "cdiplug-system")
    kubectl(apiserver, "create", "serviceaccount", "default")  # no controller manager here makes it
    for name in ("capacity.yaml", "partitions.yaml", "shared-claim.yaml", "cdiplug-config.yaml"):
        out = kubectl(apiserver, "apply", "--dry-run=server", "-o", "json", "-f", str(EXAMPLES / name))
        doc = json.loads(out)
        items = doc["items"] if "items" in doc else [doc]  # one object: no List
        kinds = sorted(i["kind"] for i in items)
        if name == "capacity.yaml":
            assert kinds == ["DeviceClass", "Pod", "Pod", "Pod", "ResourceClaimTemplate"]
            template = next(i for i in items if i["kind"] == "ResourceClaimTemplate")
            (request,) = template["spec"]["spec"]["devices"]["requests"]
            assert request["exactly"]["capacity"] == {"requests": {"memory": "30Gi"}}  # kept: the gate is on
        elif name == "partitions.yaml":
            assert kinds == ["DeviceClass", "Pod", "Pod", "Pod", "ResourceClaimTemplate", "ResourceClaimTemplate"]
        elif name == "shared-claim.yaml":
            assert kinds == ["Pod", "Pod", "ResourceClaim"]
            assert {p["spec"]["resourceClaims"][0]["resourceClaimName"] for p in items if p["kind"] == "Pod"} == {"shared-fpga"}
        else:
            assert kinds == ["ConfigMap"]


async def test_mig_devices_and_their_gpu_s_counter_set_are_stored_as_published(client: LightkubeClient, world: World) -> None:
    fake = FakeNvml(
        [
            FakeGpu(
                "GPU-mig-on",
                mig_mode=NVML_DEVICE_MIG_ENABLE,
                migs=[
                    FakeMig("MIG-0b5e0b8a-1111-2222-3333-444444444444", gi=7, gi_cap_minor=66, ci_cap_minor=67),
                    FakeMig("MIG-0b5e0b8a-5555-6666-7777-888888888888", gi=2, gi_slices=3, ci_slices=3, memory_mb=40192),
                ],
            )
        ]
    )
    fake.write_mig_files(world.dev_root)
    nvml = Nvml(fake)
    nvml.init()
    (resource,) = parse_config(
        {"resources": [{"name": "nvidia.com/mig", "backend": "nvidia", "api": "dra", "options": {"mig_profiles": ["*"]}}]}, "e2e"
    ).resources
    migs = assign_migs(discover(nvml, world).gpus, [resource])[resource.name]
    snapshot = build_mig_snapshot(resource.name, migs, {}, ContainerEdits())
    publisher = SlicePublisher(client, "mig.nvidia.com", "n1", backoff=(0.05, 0.5))
    task = asyncio.create_task(publisher.run(), name="publisher")
    try:
        publisher.want(snapshot)
        await asyncio.wait_for(publisher.wait_published(1), 30)
        slices, _ = await client.list_slices("mig.nvidia.com", "n1")
        items = [s.to_dict() for s in slices]  # the API's own field names
        (counters,) = [c for i in items for c in i["spec"].get("sharedCounters") or ()]
        assert counters == {"name": "gpu-0-mig", "counters": {"slices": {"value": "7"}, "memory": {"value": str(80 << 30)}}}
        devices = [d for i in items for d in i["spec"].get("devices") or ()]
        assert sorted(d["attributes"]["profile"]["string"] for d in devices) == ["1g.10gb", "3g.40gb"]
        big = next(d for d in devices if d["attributes"]["profile"]["string"] == "3g.40gb")
        assert big["consumesCounters"] == [
            {"counterSet": "gpu-0-mig", "counters": {"slices": {"value": "3"}, "memory": {"value": str(40192 << 20)}}}
        ]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await publisher.withdraw()


async def test_a_device_in_63_partitions_is_stored_as_published(client: LightkubeClient, world: World) -> None:
    # The bench's device (bench/bench_dra_partitions.py): the whole, halves ... 32nds, 192 counter uses in one slice.
    (resource,) = parse_config(
        {
            "resources": [
                {
                    "name": "example.com/tile",
                    "backend": "fake",
                    "api": "dra",
                    "options": {"count": 1, "partitions": [1, 2, 4, 8, 16, 32]},
                }
            ]
        },
        "e2e",
    ).resources
    snapshot = FakeBackend([resource], world).snapshot(resource, {})
    publisher = SlicePublisher(client, "tile.example.com", "n1", backoff=(0.05, 0.5))
    task = asyncio.create_task(publisher.run(), name="publisher")
    try:
        publisher.want(snapshot)
        await asyncio.wait_for(publisher.wait_published(1), 30)
        slices, _ = await client.list_slices("tile.example.com", "n1")
        items = [s.to_dict() for s in slices]  # the API's own field names
        devices = [d for i in items for d in i["spec"].get("devices") or ()]
        assert len(devices) == 63 and len(items) == 2 and publisher.failures == 0
        whole = next(d for d in devices if d["name"] == "tile-0")
        assert len(whole["consumesCounters"][0]["counters"]) == 32
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await publisher.withdraw()


def test_the_feature_gates_are_on_in_this_server(apiserver: Path) -> None:
    metrics = kubectl(apiserver, "get", "--raw", "/metrics")
    enabled = {
        line.split('name="', 1)[1].split('"', 1)[0]: line.rsplit(" ", 1)[1]
        for line in metrics.splitlines()
        if line.startswith("kubernetes_feature_enabled{")
    }
    gates = ("DRAConsumableCapacity", "DRAPartitionableDevices", "DRADeviceTaints", "DRAResourceClaimDeviceStatus")
    assert {g: enabled.get(g) for g in gates} == dict.fromkeys(gates, "1")
