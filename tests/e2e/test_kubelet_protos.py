"""Our DRA health protos against the REAL kubelet v1.36.2 (the node kit in ../shared/k8s).

A Go binary embeds the descriptor of every .proto it was built with. This reads the kubelet's
``dra-health`` descriptors out of the binary and checks that every field it knows has the same
number and type in our stubs (a wrong number would make the kubelet drop or misread the stream),
for each version the kubelet has: today v1alpha1; v1beta1 (Kubernetes 1.37) is served with the
same schema.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from cdiplug.api import drahealth_v1alpha1_pb2, drahealth_v1beta1_pb2

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
KIT = REPO.parent / "shared" / "k8s"
OURS = {"v1alpha1": drahealth_v1alpha1_pb2, "v1beta1": drahealth_v1beta1_pb2}
MAX_DESCRIPTOR = 16 << 10  # bytes past the file name to look for the descriptor's end


def kubelet_binary(folder: Path) -> Path:
    cached = sorted(Path("/var/tmp/cdiplug-cache").glob("k8s-*/kubelet"))
    if cached:
        return cached[0]
    archives = sorted(KIT.glob("kubernetes-*.tar.xz"))
    assert archives, f"no node kit in {KIT} (kubernetes-*.tar.xz)"
    with tarfile.open(archives[0]) as tar:
        tar.extract("kubelet", folder, filter="data")
    return folder / "kubelet"


def embedded(binary: bytes, version: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The FileDescriptorProto of dra-health/<version>/api.proto in the binary, if it has one."""
    name = f"staging/src/k8s.io/kubelet/pkg/apis/dra-health/{version}/api.proto".encode()
    start = binary.find(b"\x0a" + bytes([len(name)]) + name)  # field 1 (name) opens the descriptor
    if start < 0:
        return None
    for end in range(start + len(name), start + MAX_DESCRIPTOR):
        fd = descriptor_pb2.FileDescriptorProto()
        try:
            fd.ParseFromString(binary[start:end])
        except DecodeError:
            continue
        if fd.service and fd.syntax:  # the shortest prefix that is the whole file
            return fd
    raise AssertionError(f"the descriptor of {name.decode()} does not parse")


def fields(messages: object) -> dict[tuple[str, str], tuple[int, int]]:
    return {(m.name, f.name): (f.number, f.type) for m in messages for f in m.field}  # type: ignore[attr-defined]


def test_our_health_protos_number_every_field_as_the_kubelet_does(tmp_path: Path) -> None:
    binary = kubelet_binary(tmp_path).read_bytes()
    found = {v: fd for v in OURS if (fd := embedded(binary, v)) is not None}
    assert "v1alpha1" in found, "the kubelet 1.36 serves health through v1alpha1"
    for version, theirs in found.items():
        ours = descriptor_pb2.FileDescriptorProto()
        OURS[version].DESCRIPTOR.CopyToProto(ours)
        assert theirs.package == ours.package == version
        assert [(s.name, [m.name for m in s.method]) for s in theirs.service] == [
            (s.name, [m.name for m in s.method]) for s in ours.service
        ]
        kubelet, cdiplug = fields(theirs.message_type), fields(ours.message_type)
        assert {k: v for k, v in kubelet.items()} == {k: cdiplug.get(k) for k in kubelet}, version
    # v1beta1 keeps v1alpha1's schema (what 1.37 is to call): the same fields, numbers and types
    alpha, beta = descriptor_pb2.FileDescriptorProto(), descriptor_pb2.FileDescriptorProto()
    drahealth_v1alpha1_pb2.DESCRIPTOR.CopyToProto(alpha)
    drahealth_v1beta1_pb2.DESCRIPTOR.CopyToProto(beta)
    assert fields(alpha.message_type) == fields(beta.message_type)
