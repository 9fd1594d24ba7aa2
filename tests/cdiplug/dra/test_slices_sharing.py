"""Slice bodies for shared devices (KEP-5075) and partitions (KEP-4815) (cdiplug.dra.slices).

Covers: a shared device carries ``allowMultipleAllocations`` and each capacity's
``requestPolicy`` (default, valid values or a range), a device not shared carries neither (a
policy without sharing is refused by the API server); partitions carry ``consumesCounters``
and fill slices of at most 64; counter sets go in slices of their own after the devices (at
most 8 each, never beside devices), counted in every slice's ``resourceSliceCount``; a pool
without counter sets is published as before.
"""

from __future__ import annotations

from cdiplug.dra.slices import UnhealthyPolicy, pool_counters, pool_devices, slice_body, split
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.sharing import CounterConsumption, CounterSet, DeviceSharing, PoolSharing, RequestPolicy


def test_a_shared_device_carries_its_request_policies() -> None:
    ranged = RequestPolicy(default="1Gi", min="1Gi", max="80Gi", step="1Gi")
    steps = RequestPolicy(default="10", valid_values=("10", "50", "100"))
    sharing = DeviceSharing(shared=True, capacity_policies={"memory": ranged, "cores": steps})
    device = Device("gpu-0", capacity={"memory": "80Gi", "cores": "100"}, sharing=sharing)
    (body,) = pool_devices(DeviceSnapshot("example.com/gpu", [device]), UnhealthyPolicy.TAINT)
    assert body["allowMultipleAllocations"] is True
    assert body["capacity"] == {
        "memory": {
            "value": "80Gi",
            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"}},
        },
        "cores": {"value": "100", "requestPolicy": {"default": "10", "validValues": ["10", "50", "100"]}},
    }
    plain = Device(
        "gpu-1", capacity={"memory": "80Gi"}, sharing=DeviceSharing(capacity_policies={"memory": ranged})
    )  # not shared
    (body,) = pool_devices(DeviceSnapshot("example.com/gpu", [plain]), UnhealthyPolicy.TAINT)
    assert "allowMultipleAllocations" not in body and body["capacity"] == {"memory": {"value": "80Gi"}}


def partitioned(count: int) -> DeviceSnapshot:
    sets, devices = [], []
    for w in range(count):
        sets.append(CounterSet(f"fpga-{w}-counters", {"slice-0": "1", "slice-1": "1"}))
        for k in range(2):
            devices.append(
                Device(
                    f"fpga-{w}-{k + 1}of2",
                    sharing=DeviceSharing(consumes_counters=[CounterConsumption(f"fpga-{w}-counters", {f"slice-{k}": "1"})]),
                )
            )
    return DeviceSnapshot("example.com/fpga", devices, sharing=PoolSharing(sets))


def test_partitions_and_their_counter_sets_go_in_slices_of_their_own() -> None:
    snapshot = partitioned(40)  # 80 partitions, 40 counter sets
    specs = split(pool_devices(snapshot, UnhealthyPolicy.TAINT), pool_counters(snapshot))
    assert [(len(s.devices), len(s.shared_counters)) for s in specs] == [(64, 0), (16, 0), (0, 8), (0, 8), (0, 8), (0, 8), (0, 8)]
    assert specs[0].devices[0]["consumesCounters"] == [{"counterSet": "fpga-0-counters", "counters": {"slice-0": {"value": "1"}}}]
    bodies = [slice_body(s, driver="fpga.example.com", node="n1", generation=3, count=len(specs), owner=None) for s in specs]
    assert [sorted(b["spec"]) for b in bodies[1:3]] == [
        ["devices", "driver", "nodeName", "pool"],
        ["driver", "nodeName", "pool", "sharedCounters"],  # never devices beside counter sets
    ]
    assert bodies[2]["spec"]["sharedCounters"][0] == {
        "name": "fpga-0-counters",
        "counters": {"slice-0": {"value": "1"}, "slice-1": {"value": "1"}},
    }
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {7}


def test_a_pool_without_counter_sets_is_sliced_as_before() -> None:
    snapshot = DeviceSnapshot("example.com/fpga", [Device(f"fpga-{i}") for i in range(130)])
    specs = split(pool_devices(snapshot, UnhealthyPolicy.TAINT), pool_counters(snapshot))
    assert [(len(s.devices), s.shared_counters) for s in specs] == [(128, ()), (2, ())]
