"""ResourceSlice bodies from snapshots (cdiplug.dra.slices): names, typed attributes, capacity, taints, splitting.

Checks the API server's rules the module promises to keep: device names are DNS labels (IDs that
are not map deterministically and distinctly), attribute names are C identifiers or
domain/identifier, values are typed (a bool is no int), at most 32 attributes and capacities,
``id`` always the original ID, at most 128 devices per slice (64 with taints), every slice with
the pool's generation and count.
"""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from cdiplug.dra.slices import (
    MAX_DEVICES,
    MAX_DEVICES_TAINTED,
    OwnerNode,
    UnhealthyPolicy,
    attribute_name,
    attribute_value,
    device_body,
    device_name,
    names_to_ids,
    pool_devices,
    slice_body,
    split,
)
from cdiplug.model import Device, DeviceSnapshot, Health, Version

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def test_an_id_that_is_a_dns_label_is_the_name() -> None:
    assert device_name("fpga-0") == "fpga-0"


def test_other_ids_map_to_distinct_labels() -> None:
    pci = device_name("0000:3b:00.1")
    assert pci.startswith("0000-3b-00-1-") and DNS_LABEL.fullmatch(pci)
    gpu = device_name("GPU-fef8089b-4820-abfc-e83e-94318197576e")
    assert DNS_LABEL.fullmatch(gpu) and gpu.startswith("gpu-fef8089b")
    assert device_name("0000:3b:00.1") != device_name("0000:3b:00:1")
    assert DNS_LABEL.fullmatch(device_name("::::")) and DNS_LABEL.fullmatch(device_name("x" * 300))


@given(st.text(min_size=1, max_size=200))
def test_every_id_maps_to_a_dns_label(device_id: str) -> None:
    assert DNS_LABEL.fullmatch(device_name(device_id))
    assert device_name(device_id) == device_name(device_id)


def test_attribute_names() -> None:
    assert attribute_name("speed") == "speed"
    assert attribute_name("numa-node") == "numa_node"
    assert attribute_name("resource.kubernetes.io/pcieRoot") == "resource.kubernetes.io/pcieRoot"
    assert attribute_name("3d") == "_3d"
    assert attribute_name("Bad Domain/x") is None
    assert attribute_name("a" * 40) == "a" * 32


def test_attribute_values_are_typed() -> None:
    assert attribute_value(True) == {"bool": True}
    assert attribute_value(9) == {"int": 9}
    assert attribute_value("x") == {"string": "x"}
    assert attribute_value(Version("12.4.0")) == {"version": "12.4.0"}
    assert attribute_value(Version("v1.2.3")) == {"version": "1.2.3"}
    assert attribute_value(Version("550.54")) == {"string": "550.54"}  # no semver: published as a string
    assert attribute_value("x" * 65) is None
    assert attribute_value(2**64) is None


def test_device_body_keeps_id_capacity_and_the_limit() -> None:
    attrs = {f"a{i}": i for i in range(40)}
    device = Device(id="0000:3b:00.1", attributes=attrs, capacity={"memory": "80Gi"})
    body = device_body(device, taint=False)
    assert body["attributes"]["id"] == {"string": "0000:3b:00.1"}
    assert body["capacity"] == {"memory": {"value": "80Gi"}}
    assert len(body["attributes"]) + len(body["capacity"]) == 32
    assert "taints" not in body


def test_unhealthy_devices_are_tainted_or_withdrawn() -> None:
    snap = DeviceSnapshot("example.com/fpga", [Device("fpga-0"), Device("fpga-1", health=Health.UNHEALTHY)])
    tainted = pool_devices(snap, UnhealthyPolicy.TAINT)
    assert [d["name"] for d in tainted] == ["fpga-0", "fpga-1"]
    assert tainted[1]["taints"] == [{"key": "cdiplug.dev/unhealthy", "value": "true", "effect": "NoSchedule"}]
    assert [d["name"] for d in pool_devices(snap, UnhealthyPolicy.WITHDRAW)] == ["fpga-0"]
    assert pool_devices(None, UnhealthyPolicy.TAINT) == []


def test_split_at_128_or_64_with_taints() -> None:
    devices = [device_body(Device(f"d-{i}"), taint=False) for i in range(300)]
    assert [len(s.devices) for s in split(devices)] == [MAX_DEVICES, MAX_DEVICES, 44]
    devices[0] = device_body(Device("d-0"), taint=True)
    assert [len(s.devices) for s in split(devices)] == [MAX_DEVICES_TAINTED] * 4 + [44]
    assert [len(s.devices) for s in split([])] == [0]  # an empty pool is still published


def test_slice_body() -> None:
    (spec,) = split([device_body(Device("fpga-0"), taint=False)])
    body = slice_body(spec, driver="fpga.example.com", node="n1", generation=3, count=1, owner=OwnerNode("n1", "u-1"))
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    assert body["metadata"]["name"] == "n1-fpga.example.com-0"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1", "controller": True}
    ]
    assert body["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    assert body["spec"]["driver"] == "fpga.example.com" and body["spec"]["nodeName"] == "n1"


def test_names_to_ids() -> None:
    assert names_to_ids([Device("0000:3b:00.1")]) == {device_name("0000:3b:00.1"): "0000:3b:00.1"}
