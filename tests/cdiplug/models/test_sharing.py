"""How DRA shares a device (cdiplug.models.sharing), as a backend attaches it to a Device."""

from __future__ import annotations

import attrs

from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.sharing import CounterConsumption, CounterSet, DeviceSharing, PoolSharing, RequestPolicy


def test_nothing_shared_is_no_sharing_at_all() -> None:
    # A backend may build its devices the same way shared or not: the empty value is kept as None,
    # so the device equals the one built without it and no change is seen where there is none.
    assert Device("gpu-0", sharing=DeviceSharing()) == Device("gpu-0")
    assert Device("gpu-0", sharing=DeviceSharing()).sharing is None
    assert DeviceSnapshot("r", [Device("gpu-0")], sharing=PoolSharing(())) == DeviceSnapshot("r", [Device("gpu-0")])


def test_sharing_takes_part_in_the_device_s_equality() -> None:
    shared = Device("gpu-0", capacity={"memory": "80Gi"}, sharing=DeviceSharing(shared=True))
    policed = attrs.evolve(shared, sharing=DeviceSharing(shared=True, capacity_policies={"memory": RequestPolicy("1Gi")}))
    assert shared != Device("gpu-0", capacity={"memory": "80Gi"}) and policed != shared
    assert dict(policed.sharing.capacity_policies) == {"memory": RequestPolicy("1Gi")}


def test_mappings_become_pairs_in_order() -> None:
    part = DeviceSharing(consumes_counters=[CounterConsumption("gpu-0-mig", {"slices": "3", "memory": "40Gi"})])
    assert part.consumes_counters[0].counters == (("slices", "3"), ("memory", "40Gi"))
    pool = PoolSharing([CounterSet("gpu-0-mig", {"slices": "7"})])
    assert pool.counter_sets == (CounterSet("gpu-0-mig", (("slices", "7"),)),)
    assert DeviceSharing(capacity_env={"memory": "GPU_MEMORY_0"}).capacity_env == (("memory", "GPU_MEMORY_0"),)
