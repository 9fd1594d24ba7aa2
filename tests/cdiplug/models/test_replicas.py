"""Replica IDs for shared devices (cdiplug.models.replicas), against hand-built snapshots."""

from __future__ import annotations

import pytest

from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot, Health
from cdiplug.models.replicas import expand, replica_id, replica_index, underlying


def snapshot() -> DeviceSnapshot:
    return DeviceSnapshot(
        "example.com/gpu",
        [
            Device("gpu-0", health=Health.UNHEALTHY, numa_nodes=(1,), edits=ContainerEdits(env={"A": "0"}), prepare_group="g"),
            Device("gpu-1", numa_nodes=(0,)),
        ],
        ids_env="GPUS",
    )


def test_one_replica_is_the_same_snapshot():
    s = snapshot()
    assert expand(s, 1) is s


def test_each_device_advertised_n_times_with_its_properties():
    s = snapshot()
    e = expand(s, 3)
    assert e.ids == ("gpu-0::0", "gpu-0::1", "gpu-0::2", "gpu-1::0", "gpu-1::1", "gpu-1::2")
    for i in range(3):
        r = e.get(f"gpu-0::{i}")
        assert r is not None
        assert (r.health, r.numa_nodes, r.edits, r.prepare_group) == (Health.UNHEALTHY, (1,), s.devices[0].edits, "g")
    assert e.ids_env == "GPUS" and e.resource == s.resource and e.healthy_count() == 3


def test_zero_replicas_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        expand(snapshot(), 0)


@pytest.mark.parametrize(
    ("advertised", "device", "index"),
    [
        ("gpu-0::0", "gpu-0", 0),
        ("gpu-0::12", "gpu-0", 12),
        ("GPU-uuid-1::3", "GPU-uuid-1", 3),
        ("a::b::4", "a::b", 4),
        ("gpu-0", "gpu-0", None),
        ("gpu-0::", "gpu-0::", None),
        ("gpu-0::01", "gpu-0::01", None),
        ("gpu-0::x", "gpu-0::x", None),
        ("::3", "::3", None),
        ("gpu-0::3\n", "gpu-0::3\n", None),
    ],
)
def test_underlying_and_index(advertised, device, index):
    assert underlying(advertised) == device
    assert replica_index(advertised) == index


def test_replica_id_round_trips():
    assert replica_id("0000:3b:00.1", 7) == "0000:3b:00.1::7"
    assert underlying(replica_id("0000:3b:00.1", 7)) == "0000:3b:00.1"
    assert replica_index(replica_id("0000:3b:00.1", 7)) == 7
