"""The CDI spec model (``cdiplug.cdi.spec``): JSON keys exactly as the spec spells them, empty fields
left out, lossless round trips, and ``build_spec`` from our device model. In memory; every spec
built here is also checked against the official JSON schema and our strict validator."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdiplug.cdi.build import build_spec
from cdiplug.cdi.spec import (
    CdiContainerEdits,
    CdiDevice,
    CdiDeviceNode,
    CdiHook,
    CdiIntelRdt,
    CdiMount,
    CdiNetDevice,
    CdiSpec,
    from_dict,
    from_json,
    to_dict,
    to_json,
)
from cdiplug.cdi.validate import check_spec
from cdiplug.errors import CdiError
from cdiplug.models import devices as model
from cdiplug.models.names import cdi_device_name

FULL = CdiSpec(
    cdi_version="1.1.0",
    kind="example.com/fpga",
    annotations={"example.com/owner": "cdiplug"},
    devices=[
        CdiDevice(
            name="fpga-0",
            annotations={"note": "first"},
            container_edits=CdiContainerEdits(
                env=["A=1"],
                device_nodes=[
                    CdiDeviceNode(
                        "/dev/f0",
                        host_path="/srv/f0",
                        type="c",
                        major=10,
                        minor=0,
                        file_mode=0o660,
                        permissions="rw",
                        uid=0,
                        gid=44,
                    )
                ],
                net_devices=[CdiNetDevice(host_interface_name="eth3", name="net0")],
                hooks=[CdiHook("createContainer", "/usr/bin/hook", args=["hook", "x"], env=["H=1"], timeout=5)],
                mounts=[CdiMount("/srv/lib", "/lib/x", options=["ro", "bind"], type="bind")],
                intel_rdt=CdiIntelRdt(
                    clos_id="c1", l3_cache_schema="L3:0=f", mem_bw_schema="MB:0=50", schemata=["L2:0=3"], enable_monitoring=True
                ),
                additional_gids=[44, 45],
            ),
        )
    ],
    container_edits=CdiContainerEdits(env=["COMMON=1"]),
)


def test_json_keys_are_the_specs() -> None:
    data = to_dict(FULL)
    assert list(data) == ["cdiVersion", "kind", "annotations", "devices", "containerEdits"]
    device = data["devices"][0]
    assert list(device) == ["name", "annotations", "containerEdits"]
    edits = device["containerEdits"]
    assert list(edits) == ["env", "deviceNodes", "netDevices", "hooks", "mounts", "intelRdt", "additionalGids"]
    assert list(edits["deviceNodes"][0]) == [
        "path",
        "hostPath",
        "type",
        "major",
        "minor",
        "fileMode",
        "permissions",
        "uid",
        "gid",
    ]
    assert edits["netDevices"] == [{"hostInterfaceName": "eth3", "name": "net0"}]
    assert edits["hooks"][0] == {
        "hookName": "createContainer",
        "path": "/usr/bin/hook",
        "args": ["hook", "x"],
        "env": ["H=1"],
        "timeout": 5,
    }
    assert edits["mounts"][0] == {"hostPath": "/srv/lib", "containerPath": "/lib/x", "options": ["ro", "bind"], "type": "bind"}
    assert edits["intelRdt"] == {
        "closID": "c1",
        "l3CacheSchema": "L3:0=f",
        "memBwSchema": "MB:0=50",
        "schemata": ["L2:0=3"],
        "enableMonitoring": True,
    }
    assert edits["additionalGids"] == [44, 45]


def test_round_trip() -> None:
    assert from_json(to_json(FULL)) == FULL
    assert from_dict(json.loads(to_json(FULL))) == FULL


def test_empty_fields_are_left_out() -> None:
    minimal = CdiSpec(
        cdi_version="0.3.0",
        kind="example.com/fpga",
        devices=[CdiDevice("d0", CdiContainerEdits(device_nodes=[CdiDeviceNode("/dev/x")]))],
    )
    assert to_dict(minimal) == {
        "cdiVersion": "0.3.0",
        "kind": "example.com/fpga",
        "devices": [{"name": "d0", "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}],
    }
    assert from_dict(to_dict(minimal)) == minimal


def test_a_device_always_has_its_container_edits_key() -> None:
    data = to_dict(CdiSpec(cdi_version="0.3.0", kind="ab/cd", devices=[CdiDevice("d", CdiContainerEdits())]))
    assert data["devices"][0]["containerEdits"] == {}


@pytest.mark.parametrize(
    "data",
    [
        {"cdiVersion": "0.3.0", "kind": "ab/cd", "devices": [], "extra": 1},
        {"cdiVersion": "0.3.0", "kind": "ab/cd", "devices": [{"name": "d", "containerEdits": {"additionalGIDs": [1]}}]},
        {"cdiVersion": "0.3.0", "kind": "ab/cd"},
        {"cdiVersion": "0.3.0", "kind": "ab/cd", "devices": [{"name": "d"}]},
    ],
)
def test_structuring_refuses_unknown_or_missing_keys(data: dict) -> None:
    with pytest.raises(CdiError):
        from_dict(data)


def test_from_json_refuses_non_objects() -> None:
    with pytest.raises(CdiError):
        from_json("[]")
    with pytest.raises(CdiError):
        from_json("{")


def test_build_spec(fpga_snapshot: model.DeviceSnapshot, schema_errors) -> None:
    spec = build_spec("example.com/fpga", fpga_snapshot)
    assert spec.kind == "example.com/fpga"
    assert spec.cdi_version == "0.5.0"  # hostPath on the device nodes
    assert spec.device_names() == ("fpga-0", "fpga-1", "fpga-2")
    assert spec.container_edits == CdiContainerEdits(env=["FPGA_DRIVER=fake"])
    dev = spec.devices[1]
    assert dev.container_edits.env == ("FPGA_1=fpga-1",)
    assert dev.container_edits.device_nodes == (CdiDeviceNode("/dev/fpga1", host_path="/srv/dev/fpga1", permissions="rw"),)
    # read-only bind mounts say so in their options, without a type (a type would need 0.4.0)
    assert dev.container_edits.mounts == (CdiMount("/srv/fw/1", "/fw/1", options=["ro", "bind"]),)
    assert schema_errors(to_dict(spec)) == []
    assert check_spec(spec) == []


def test_build_spec_keeps_things_minimal() -> None:
    snap = model.DeviceSnapshot(
        resource="example.com/fpga",
        devices=[
            model.Device(
                id="fpga-0",
                edits=model.ContainerEdits(
                    device_nodes=[model.DeviceNode(path="/dev/x", host_path="/dev/x")],
                    mounts=[model.Mount("/a", "/b", read_only=False, options=["rbind"])],
                ),
            )
        ],
    )
    spec = build_spec("example.com/fpga", snap)
    assert spec.cdi_version == "0.3.0"  # a hostPath equal to the path is not written
    assert spec.devices[0].container_edits.mounts[0].options == ("rbind",)
    assert "containerEdits" not in to_dict(spec)


def test_build_spec_maps_bad_ids() -> None:
    snap = model.DeviceSnapshot(
        resource="example.com/fpga", devices=[model.Device(id="a/b", edits=model.ContainerEdits(env={"A": "1"}))]
    )
    spec = build_spec("example.com/fpga", snap)
    assert spec.device_names() == (cdi_device_name("a/b"),)
    assert check_spec(spec) == []


def test_a_device_without_edits_is_an_error_naming_it() -> None:
    snap = model.DeviceSnapshot(
        resource="example.com/fpga",
        devices=[model.Device(id="fpga-0", edits=model.ContainerEdits(env={"A": "1"})), model.Device(id="fpga-1")],
    )
    with pytest.raises(CdiError, match=r"example.com/fpga.*'fpga-1'.*no container edits"):
        build_spec("example.com/fpga", snap)


def test_ids_mapping_to_the_same_name_are_an_error() -> None:
    clash = cdi_device_name("a/b")
    snap = model.DeviceSnapshot(
        resource="example.com/fpga",
        devices=[
            model.Device(id="a/b", edits=model.ContainerEdits(env={"A": "1"})),
            model.Device(id=clash, edits=model.ContainerEdits(env={"A": "2"})),
        ],
    )
    with pytest.raises(CdiError, match="both map to CDI name"):
        build_spec("example.com/fpga", snap)


def test_bad_kind_is_an_error() -> None:
    snap = model.DeviceSnapshot(
        resource="example.com/fpga", devices=[model.Device(id="x", edits=model.ContainerEdits(env={"A": "1"}))]
    )
    with pytest.raises(CdiError):
        build_spec("../etc", snap)


_ENV_KEY = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True)
_PATH = st.from_regex(r"/[a-z0-9/_.-]{1,20}", fullmatch=True)
_EDITS = st.builds(
    model.ContainerEdits,
    env=st.dictionaries(_ENV_KEY, st.text(max_size=8), max_size=3),
    device_nodes=st.lists(
        st.builds(model.DeviceNode, path=_PATH, host_path=st.none() | _PATH, permissions=st.sampled_from(["r", "rw", "rwm"])),
        max_size=2,
    ),
    mounts=st.lists(
        st.builds(model.Mount, host_path=_PATH, container_path=_PATH, read_only=st.booleans(), type=st.none() | st.just("bind")),
        max_size=2,
    ),
    additional_gids=st.lists(st.integers(0, 2**32 - 1), max_size=2),
).filter(lambda e: not e.is_empty())
_SNAPSHOTS = st.builds(
    model.DeviceSnapshot,
    resource=st.just("example.com/fpga"),
    devices=st.lists(
        st.builds(model.Device, id=st.text(min_size=1, max_size=12), edits=_EDITS),
        min_size=1,
        max_size=5,
        unique_by=lambda d: d.id,
    ),
    common_edits=st.just(model.ContainerEdits()) | _EDITS,
)


@settings(max_examples=60, deadline=None)
@given(snapshot=_SNAPSHOTS)
def test_every_spec_built_is_valid_and_minimal(schema_errors, snapshot: model.DeviceSnapshot) -> None:
    """Whatever well-formed snapshot a backend reports, the spec passes the official schema and
    our strict validator, declares exactly the version its content needs, and round-trips."""
    from cdiplug.cdi.version import minimal_version

    spec = build_spec("example.com/fpga", snapshot)
    assert schema_errors(to_dict(spec)) == []
    assert check_spec(spec) == []
    assert spec.cdi_version == minimal_version(spec)
    assert from_json(to_json(spec)) == spec
    assert sorted(spec.device_names()) == sorted(cdi_device_name(d.id) for d in snapshot.devices)


def test_a_spec_a_runtime_would_refuse_is_never_built() -> None:
    snap = model.DeviceSnapshot(
        resource="example.com/fpga",
        devices=[model.Device(id="fpga-0", edits=model.ContainerEdits(device_nodes=[model.DeviceNode(path="/dev/x", type="z")]))],
    )
    with pytest.raises(CdiError, match="invalid device node type 'z'"):
        build_spec("example.com/fpga", snap)
    snap = model.DeviceSnapshot(
        resource="example.com/fpga", devices=[model.Device(id="fpga-0", edits=model.ContainerEdits(env={"": "x"}))]
    )
    with pytest.raises(CdiError, match="NAME=value"):
        build_spec("example.com/fpga", snap)
