"""The checked-in gRPC stubs in cdiplug/api match their .proto sources, and speak the kubelet's wire names.

Regenerates them with hack/gen-protos.sh (grpcio-tools, pinned in the test extras) into a fresh
folder and compares byte for byte, so editing a .proto without regenerating fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
API = ROOT / "cdiplug" / "api"
GENERATED = sorted(p.name for p in API.glob("*_pb2*.py*"))


PROTOS = [
    "deviceplugin_v1beta1",
    "podresources_v1",
    "dra_v1",
    "dra_v1beta1",
    "pluginregistration_v1",
    "drahealth_v1alpha1",
    "drahealth_v1beta1",
]


def test_there_are_stubs_for_every_proto() -> None:
    assert {f"{p}{suffix}" for p in PROTOS for suffix in ("_pb2.py", "_pb2_grpc.py")} <= set(GENERATED)
    assert {p.stem for p in API.glob("*.proto")} == set(PROTOS)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stubs")
    env = {**os.environ, "PYTHON": sys.executable}  # grpcio-tools is in the test environment, not on PATH
    subprocess.run(["bash", str(ROOT / "hack" / "gen-protos.sh"), str(out)], check=True, cwd=ROOT, env=env)
    return out


@pytest.mark.parametrize("name", GENERATED)
def test_checked_in_stub_is_fresh(name: str, regenerated: Path) -> None:
    fresh = (regenerated / name).read_text()
    assert (API / name).read_text() == fresh, f"cdiplug/api/{name} is stale: run hack/gen-protos.sh"


def test_device_plugin_messages_have_the_kubelet_field_numbers() -> None:
    # The kubelet speaks the wire format: field numbers, not names, must match upstream.
    from cdiplug.api import deviceplugin_v1beta1_pb2 as pb

    fields = {f.name: f.number for f in pb.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    assert {f.name: f.number for f in pb.Device.DESCRIPTOR.fields} == {"ID": 1, "health": 2, "topology": 3}
    assert {f.name: f.number for f in pb.ContainerPreferredAllocationRequest.DESCRIPTOR.fields} == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }


def test_dra_services_have_the_kubelet_wire_names() -> None:
    # What the kubelet 1.36 calls (the strings are in its binary): the DRA services under their
    # full package names, registration and health under short ones.
    from cdiplug.api import dra_v1_pb2_grpc, dra_v1beta1_pb2_grpc, drahealth_v1alpha1_pb2_grpc, pluginregistration_v1_pb2_grpc

    assert "'/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources'" in Path(dra_v1_pb2_grpc.__file__).read_text()
    v1beta1 = Path(dra_v1beta1_pb2_grpc.__file__).read_text()
    assert "'/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources'" in v1beta1
    assert "'/pluginregistration.Registration/GetInfo'" in Path(pluginregistration_v1_pb2_grpc.__file__).read_text()
    assert "'/v1alpha1.DRAResourceHealth/NodeWatchResources'" in Path(drahealth_v1alpha1_pb2_grpc.__file__).read_text()


def test_dra_messages_have_the_kubelet_field_numbers() -> None:
    from cdiplug.api import dra_v1_pb2, dra_v1beta1_pb2

    for pb in (dra_v1_pb2, dra_v1beta1_pb2):
        assert {f.name: f.number for f in pb.Claim.DESCRIPTOR.fields} == {"namespace": 1, "uid": 2, "name": 3}
        assert {f.name: f.number for f in pb.Device.DESCRIPTOR.fields} == {
            "request_names": 1,
            "pool_name": 2,
            "device_name": 3,
            "cdi_device_ids": 4,
            "share_id": 5,
        }
        assert {f.name: f.number for f in pb.NodePrepareResourceResponse.DESCRIPTOR.fields} == {"devices": 1, "error": 2}


def test_every_stub_loads_in_one_process() -> None:
    # One descriptor pool: two protos defining the same full message name would fail here.
    import importlib

    for proto in PROTOS:
        importlib.import_module(f"cdiplug.api.{proto}_pb2_grpc")
