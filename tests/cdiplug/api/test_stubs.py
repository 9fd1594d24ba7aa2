"""The checked-in gRPC stubs in cdiplug/api match their .proto sources.

Regenerates them with hack/gen-protos.sh (grpcio-tools, pinned in the test extras) into a fresh
folder and compares byte for byte, so editing a .proto without regenerating fails here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
API = ROOT / "cdiplug" / "api"
GENERATED = sorted(p.name for p in API.glob("*_pb2*.py*"))


def test_there_are_stubs_for_both_protos() -> None:
    assert {
        "deviceplugin_v1beta1_pb2.py",
        "deviceplugin_v1beta1_pb2_grpc.py",
        "podresources_v1_pb2.py",
        "podresources_v1_pb2_grpc.py",
    } <= set(GENERATED)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run(["bash", str(ROOT / "hack" / "gen-protos.sh"), str(out)], check=True, cwd=ROOT)
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
