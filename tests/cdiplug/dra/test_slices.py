"""ResourceSlice bodies from snapshots (cdiplug.dra.slices): names, typed attributes, capacity, taints, splitting.

Checks the API server's rules the module promises to keep: device names are DNS labels (IDs that
are not map deterministically and distinctly), attribute names are C identifiers or
domain/identifier, values are typed (a bool is no int), at most 32 attributes and capacities,
``id`` always the original ID, at most 128 devices per slice (64 with taints), every slice with
the pool's generation and count; taints named per cause (``cdiplug.dev/<cause>=<code>``,
``NoSchedule`` while Unhealthy, ``None`` when informational), gone once a device recovers.
"""

from __future__ import annotations

import re

import pytest
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
    names_to_ids,
    pool_devices,
    slice_body,
    split,
)
from cdiplug.models.devices import Device, DeviceSnapshot, Health, HealthCause, Version
from cdiplug.models.names import dns_label_for

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def test_an_id_that_is_a_dns_label_is_the_name() -> None:
    assert dns_label_for("fpga-0") == "fpga-0"


def test_other_ids_map_to_distinct_labels() -> None:
    pci = dns_label_for("0000:3b:00.1")
    assert pci.startswith("0000-3b-00-1-") and DNS_LABEL.fullmatch(pci)
    gpu = dns_label_for("GPU-fef8089b-4820-abfc-e83e-94318197576e")
    assert DNS_LABEL.fullmatch(gpu) and gpu.startswith("gpu-fef8089b")
    assert dns_label_for("0000:3b:00.1") != dns_label_for("0000:3b:00:1")
    assert DNS_LABEL.fullmatch(dns_label_for("::::")) and DNS_LABEL.fullmatch(dns_label_for("x" * 300))


@given(st.text(min_size=1, max_size=200))
def test_every_id_maps_to_a_dns_label(device_id: str) -> None:
    assert DNS_LABEL.fullmatch(dns_label_for(device_id))
    assert dns_label_for(device_id) == dns_label_for(device_id)


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
    body = device_body(device)
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


def test_each_cause_is_its_own_taint_key_with_its_code() -> None:
    xid = Device("gpu-0", health=Health.UNHEALTHY, health_cause=HealthCause("xid", "79"))
    link = Device("nic-0", health=Health.UNHEALTHY, health_cause=HealthCause("link-down"))
    note = Device("gpu-1", health_cause=HealthCause("xid-ignored", "13"))  # Healthy: informational
    snap = DeviceSnapshot("r", [xid, link, note, Device("gpu-2")])
    taints = {d["name"]: d.get("taints") for d in pool_devices(snap, UnhealthyPolicy.TAINT)}
    assert taints == {
        "gpu-0": [{"key": "cdiplug.dev/xid", "value": "79", "effect": "NoSchedule"}],
        "nic-0": [{"key": "cdiplug.dev/link-down", "value": "true", "effect": "NoSchedule"}],
        "gpu-1": [{"key": "cdiplug.dev/xid-ignored", "value": "13", "effect": "None"}],
        "gpu-2": None,
    }
    # Withdrawing (no device taints on the server) drops the unhealthy ones, keeps the healthy one.
    assert [d["name"] for d in pool_devices(snap, UnhealthyPolicy.WITHDRAW)] == ["gpu-1", "gpu-2"]


def test_a_recovered_device_loses_its_taint() -> None:
    sick = Device("gpu-0", health=Health.UNHEALTHY, health_cause=HealthCause("xid", "48"))
    recovered = Device("gpu-0")  # what a backend reports once the GPU is back
    assert pool_devices(DeviceSnapshot("r", [sick]), UnhealthyPolicy.TAINT)[0]["taints"]
    assert "taints" not in pool_devices(DeviceSnapshot("r", [recovered]), UnhealthyPolicy.TAINT)[0]
    # The generic cause keeps the key current users select on.
    plain = pool_devices(DeviceSnapshot("r", [Device("gpu-0", health=Health.UNHEALTHY)]), UnhealthyPolicy.TAINT)
    assert plain[0]["taints"] == [{"key": "cdiplug.dev/unhealthy", "value": "true", "effect": "NoSchedule"}]


@pytest.mark.parametrize(
    ("name", "code"), [("XID", "1"), ("-x", "1"), ("a" * 64, "1"), ("xid", ""), ("xid", "a b"), ("xid", "x" * 64)]
)
def test_a_cause_that_is_no_taint_key_or_value_is_refused(name: str, code: str) -> None:
    with pytest.raises(ValueError, match="health cause"):
        HealthCause(name, code)


def test_split_at_128_or_64_with_taints() -> None:
    devices = [device_body(Device(f"d-{i}")) for i in range(300)]
    assert [len(s.devices) for s in split(devices)] == [MAX_DEVICES, MAX_DEVICES, 44]
    devices[0] = device_body(Device("d-0", health=Health.UNHEALTHY))
    assert [len(s.devices) for s in split(devices)] == [MAX_DEVICES_TAINTED] * 4 + [44]
    assert [len(s.devices) for s in split([])] == [0]  # an empty pool is still published


def test_slice_body() -> None:
    (spec,) = split([device_body(Device("fpga-0"))])
    body = slice_body(spec, driver="fpga.example.com", node="n1", generation=3, count=1, owner=OwnerNode("n1", "u-1"))
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    assert body["metadata"]["name"] == "n1-fpga.example.com-0"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1", "controller": True}
    ]
    assert body["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    assert body["spec"]["driver"] == "fpga.example.com" and body["spec"]["nodeName"] == "n1"


def test_names_to_ids() -> None:
    assert names_to_ids([Device("0000:3b:00.1")]) == {dns_label_for("0000:3b:00.1"): "0000:3b:00.1"}


def test_standard_pci_attributes_keep_their_domain() -> None:
    # resource.kubernetes.io/pciBusID and pcieRoot are the names KubeVirt and the scheduler read: published as they are.
    device = Device(
        id="0000:3b:00.1",
        attributes={"resource.kubernetes.io/pciBusID": "0000:3b:00.1", "resource.kubernetes.io/pcieRoot": "pci0000:3a"},
    )
    published = device_body(device)["attributes"]
    assert published["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.1"}
    assert published["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:3a"}
