"""KEP-5304 device metadata files (cdiplug.dra.metadata): their content, where they lie on the host
and in the container, the claim spec mounting them read-only per request, refusal of names no path
may be built from, and removal (not of a folder a newer claim of the same name wrote).

Real files under tmp_path; the claim spec is rendered by cdiplug.dra.claimspec as prepare does.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from lightkube.resources.resource_v1 import ResourceClaim

from cdiplug.dra import claimspec, metadata
from cdiplug.dra.checkpoint import PreparedClaim, PreparedDevice
from cdiplug.errors import CdiError, InvalidRequest
from cdiplug.models.devices import ContainerEdits, Device, DeviceNode, DeviceSnapshot, Version
from cdiplug.models.instance import Instance

DRIVER = "pci.example.com"
UID = "5f1c2d3e-0000-4000-8000-000000000001"


def record(namespace: str = "default", name: str = "vm-gpu", uid: str = UID) -> PreparedClaim:
    devices = (
        PreparedDevice(("gpu",), "node-1", "0000-3b-00-1-x", "0000:3b:00.1", ("k8s.pci.example.com/claim=a",)),
        PreparedDevice(("nic/fast", "gpu"), "node-1", "0000-5e-00-0-y", "0000:5e:00.0", ("k8s.pci.example.com/claim=b",)),
    )
    return PreparedClaim(uid, namespace, name, DRIVER, "example.com/dev", devices, claimspec.file_name(Instance(), uid))


def devices() -> dict[str, Device]:
    def dev(address: str) -> Device:
        return Device(
            id=address,
            edits=ContainerEdits(device_nodes=(DeviceNode(path="/dev/vfio/12"),)),
            attributes={
                "resource.kubernetes.io/pciBusID": address,
                "resource.kubernetes.io/pcieRoot": "pci0000:3a",
                "numa_node": 1,
                "driverVersion": Version("1.2.3"),
            },
        )

    return {"0000-3b-00-1-x": dev("0000:3b:00.1"), "0000-5e-00-0-y": dev("0000:5e:00.0")}


def test_one_device_metadata_per_request_with_the_slice_attributes(tmp_path: Path) -> None:
    paths = metadata.write(tmp_path, record(), devices())
    folder = tmp_path / DRIVER / "dra-device-metadata" / "default_vm-gpu"
    assert paths == [folder / "gpu" / "metadata.json", folder / "nic" / "metadata.json"]  # nic/fast filed under nic
    gpu = json.loads(paths[0].read_bytes())
    assert gpu["apiVersion"] == "metadata.resource.k8s.io/v1alpha1" and gpu["kind"] == "DeviceMetadata"
    assert gpu["metadata"] == {"name": "vm-gpu", "namespace": "default", "uid": UID, "generation": 1}
    (request,) = gpu["requests"]
    assert request["name"] == "gpu"
    assert [(d["name"], d["driver"], d["pool"]) for d in request["devices"]] == [
        ("0000-3b-00-1-x", DRIVER, "node-1"),
        ("0000-5e-00-0-y", DRIVER, "node-1"),
    ]
    attributes = request["devices"][0]["attributes"]
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.1"}
    assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:3a"}
    assert attributes["numa_node"] == {"int": 1} and attributes["driverVersion"] == {"version": "1.2.3"}
    nic = json.loads(paths[1].read_bytes())
    assert nic["requests"][0]["name"] == "nic/fast"  # as the allocation result names it
    assert [d["name"] for d in nic["requests"][0]["devices"]] == ["0000-5e-00-0-y"]
    assert "podClaimName" not in gpu
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert not [p for p in folder.rglob(".*")]  # no temporary file left


def test_the_claim_spec_mounts_each_request_into_its_devices_read_only(tmp_path: Path) -> None:
    rec = record()
    devs = devices()
    snapshot = DeviceSnapshot(resource="example.com/dev", devices=list(devs.values()))
    spec = json.loads(claimspec.render(DRIVER, UID, snapshot, list(devs.items()), metadata.mounts(tmp_path, rec)))
    by_name = {d["name"]: d["containerEdits"].get("mounts", []) for d in spec["devices"]}
    host = tmp_path / DRIVER / "dra-device-metadata" / "default_vm-gpu"
    root = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu"
    gpu_mount = {
        "hostPath": str(host / "gpu" / "metadata.json"),
        "containerPath": f"{root}/gpu/{DRIVER}-metadata.json",
        "options": ["ro", "bind"],
    }
    nic_mount = {
        "hostPath": str(host / "nic" / "metadata.json"),
        "containerPath": f"{root}/nic/{DRIVER}-metadata.json",
        "options": ["ro", "bind"],
    }
    assert [{k: m[k] for k in gpu_mount} for m in by_name[f"{UID}-0000-3b-00-1-x"]] == [gpu_mount]
    assert [{k: m[k] for k in gpu_mount} for m in by_name[f"{UID}-0000-5e-00-0-y"]] == [nic_mount, gpu_mount]


def test_a_claim_made_from_a_template_is_found_by_its_pod_claim_name(tmp_path: Path) -> None:
    obj = {"metadata": {"name": "pod-x-gpu-abcde", "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}}}
    pod_claim = metadata.pod_claim_name(ResourceClaim.from_dict(obj))
    assert pod_claim == "gpu"
    rec = record(name="pod-x-gpu-abcde")
    (path, _) = metadata.write(tmp_path, rec, devices(), pod_claim)
    assert json.loads(path.read_bytes())["podClaimName"] == "gpu"
    assert metadata.written_pod_claim(tmp_path, rec) == "gpu"  # what a rewrite after a reboot uses
    (mount,) = metadata.mounts(tmp_path, rec, pod_claim)["0000-3b-00-1-x"]
    assert mount.container_path == (
        f"/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json"
    )
    assert mount.host_path == str(tmp_path / DRIVER / "dra-device-metadata" / "default_pod-x-gpu-abcde" / "gpu" / "metadata.json")
    assert metadata.pod_claim_name(ResourceClaim.from_dict({"metadata": {"name": "direct"}})) is None
    assert metadata.written_pod_claim(tmp_path, record(name="never-written")) is None


@pytest.mark.parametrize("value", ["../x", "A", 5, "a" * 64])
def test_a_hostile_pod_claim_annotation_is_refused(value: object) -> None:
    with pytest.raises(InvalidRequest, match="resource.kubernetes.io/pod-claim-name"):
        metadata.pod_claim_name(
            ResourceClaim.from_dict({"metadata": {"annotations": {"resource.kubernetes.io/pod-claim-name": value}}})
        )


def test_without_mounts_the_claim_spec_is_as_before(tmp_path: Path) -> None:
    devs = devices()
    snapshot = DeviceSnapshot(resource="example.com/dev", devices=list(devs.values()))
    assert claimspec.render(DRIVER, UID, snapshot, list(devs.items())) == claimspec.render(
        DRIVER, UID, snapshot, list(devs.items()), {}
    )


@pytest.mark.parametrize(
    ("namespace", "name", "message"),
    [
        ("..", "c", "namespace '..' is not a DNS label"),
        ("a/b", "c", "namespace 'a/b' is not a DNS label"),
        ("default", "../../etc", "claim name '../../etc' is not a DNS subdomain"),
        ("default", "a/b", "claim name 'a/b' is not a DNS subdomain"),
        ("default", "", "claim name '' is not a DNS subdomain"),
        ("Default", "c", "namespace 'Default' is not a DNS label"),
        ("n" * 63, "c" * 253, "metadata folder name would be over 255 bytes"),
    ],
)
def test_names_no_path_may_hold_are_refused_before_anything_is_written(
    tmp_path: Path, namespace: str, name: str, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message.replace(".", r"\.").replace("(", r"\(")):
        metadata.write(tmp_path, record(namespace, name), devices())
    with pytest.raises(InvalidRequest):
        metadata.mounts(tmp_path, record(namespace, name))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("request_name", ["..", "a/../b", "GPU", "x" * 64, ""])
def test_hostile_request_names_are_refused(tmp_path: Path, request_name: str) -> None:
    rec = record()
    bad = PreparedClaim(
        rec.uid, rec.namespace, rec.name, rec.driver, rec.resource,
        (PreparedDevice((request_name,), "node-1", "0000-3b-00-1-x", "0000:3b:00.1", ()),), rec.spec_file,
    )  # fmt: skip
    with pytest.raises(InvalidRequest, match="request name"):
        metadata.write(tmp_path, bad, devices())
    assert list(tmp_path.iterdir()) == []


def test_a_file_over_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "MAX_FILE", 200)
    with pytest.raises(CdiError, match="over 200 bytes"):
        metadata.write(tmp_path, record(), devices())


def test_removal_takes_the_claims_folder_and_only_it(tmp_path: Path) -> None:
    metadata.write(tmp_path, record(), devices())
    other = record(name="other-claim", uid="6f1c2d3e-0000-4000-8000-000000000002")
    metadata.write(tmp_path, other, devices())
    assert metadata.remove(tmp_path, DRIVER, "default", "vm-gpu", UID) is True
    root = tmp_path / DRIVER / "dra-device-metadata"
    assert sorted(p.name for p in root.iterdir()) == ["default_other-claim"]
    assert metadata.remove(tmp_path, DRIVER, "default", "vm-gpu", UID) is False  # already gone


def test_a_newer_claim_of_the_same_name_keeps_its_files(tmp_path: Path) -> None:
    newer = record(uid="7f1c2d3e-0000-4000-8000-000000000003")
    metadata.write(tmp_path, newer, devices())
    assert metadata.remove(tmp_path, DRIVER, "default", "vm-gpu", UID) is False
    assert (tmp_path / DRIVER / "dra-device-metadata" / "default_vm-gpu" / "gpu" / "metadata.json").exists()


def test_removal_does_not_follow_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    metadata.write(tmp_path, record(), devices())
    (tmp_path / DRIVER / "dra-device-metadata" / "default_vm-gpu" / "link").symlink_to(outside)
    assert metadata.remove(tmp_path, DRIVER, "default", "vm-gpu", UID) is True
    assert (outside / "keep").exists()


def test_stale_folders_are_swept_and_kept_ones_stay(tmp_path: Path) -> None:
    metadata.write(tmp_path, record(), devices())
    metadata.write(tmp_path, record(name="gone"), devices())
    removed = metadata.remove_stale(tmp_path, DRIVER, [("default", "vm-gpu")])
    assert [p.name for p in removed] == ["default_gone"]
    assert [p.name for p in (tmp_path / DRIVER / "dra-device-metadata").iterdir()] == ["default_vm-gpu"]
    assert metadata.remove_stale(tmp_path, "none.example.com", []) == []
