"""The minimal ``cdiVersion`` (``cdiplug.cdi.version``): one test per rule of the reference
library's ``specs-go/version.go`` plus 1.1.0, on specs built in memory."""

from __future__ import annotations

import pytest

from cdiplug.cdi.spec import ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec
from cdiplug.cdi.version import EARLIEST, KNOWN_VERSIONS, minimal_version, parse, requirements

ENV = ContainerEdits(env=["A=b"])


def spec(
    edits: ContainerEdits = ENV,
    *,
    common: ContainerEdits = ContainerEdits(),
    name: str = "dev0",
    kind: str = "example.com/fpga",
    annotations: dict[str, str] | None = None,
    device_annotations: dict[str, str] | None = None,
) -> Spec:
    device = Device(name=name, container_edits=edits, annotations=device_annotations or {})
    return Spec(cdi_version="", kind=kind, devices=[device], container_edits=common, annotations=annotations or {})


CASES = [
    ("floor", spec(), "0.3.0"),
    (
        "hooks and plain mounts need nothing",
        spec(ContainerEdits(hooks=[Hook("prestart", "/bin/true")], mounts=[Mount("/a", "/b", ["ro", "bind"])])),
        "0.3.0",
    ),
    (
        "device node without hostPath",
        spec(ContainerEdits(device_nodes=[DeviceNode("/dev/x", type="c", major=1, minor=3)])),
        "0.3.0",
    ),
    ("mount type", spec(ContainerEdits(mounts=[Mount("/a", "/b", type="bind")])), "0.4.0"),
    ("mount type at spec level", spec(common=ContainerEdits(mounts=[Mount("/a", "/b", type="tmpfs")])), "0.4.0"),
    ("hostPath", spec(ContainerEdits(device_nodes=[DeviceNode("/dev/x", host_path="/srv/x")])), "0.5.0"),
    ("hostPath at spec level", spec(common=ContainerEdits(device_nodes=[DeviceNode("/dev/x", host_path="/srv/x")])), "0.5.0"),
    ("name starts with a digit", spec(name="0000:3b:00.1"), "0.5.0"),
    ("spec annotations", spec(annotations={"a.com/b": "c"}), "0.6.0"),
    ("device annotations", spec(device_annotations={"x": "y"}), "0.6.0"),
    ("dot in the class", spec(kind="example.com/fpga.v2"), "0.6.0"),
    ("dot in the vendor only", spec(kind="ex.ample.com/fpga"), "0.3.0"),
    ("intelRdt", spec(ContainerEdits(env=["A=b"], intel_rdt=IntelRdt(clos_id="c1"))), "0.7.0"),
    ("additionalGids", spec(ContainerEdits(additional_gids=[44])), "0.7.0"),
    ("additionalGids at spec level", spec(common=ContainerEdits(additional_gids=[44])), "0.7.0"),
    ("netDevices", spec(ContainerEdits(net_devices=[NetDevice("eth1", "net0")])), "1.1.0"),
    ("intelRdt schemata", spec(ContainerEdits(intel_rdt=IntelRdt(schemata=["L3:0=f"]))), "1.1.0"),
    ("intelRdt enableMonitoring", spec(ContainerEdits(intel_rdt=IntelRdt(enable_monitoring=True))), "1.1.0"),
    ("highest rule wins", spec(ContainerEdits(mounts=[Mount("/a", "/b", type="bind")], additional_gids=[1]), name="0x"), "0.7.0"),
]


@pytest.mark.parametrize(("what", "the_spec", "expected"), CASES, ids=[c[0] for c in CASES])
def test_minimal_version(what: str, the_spec: Spec, expected: str) -> None:
    assert minimal_version(the_spec) == expected


def test_requirements_say_why() -> None:
    reasons = dict(requirements(spec(ContainerEdits(device_nodes=[DeviceNode("/dev/x", host_path="/h")]))))
    assert "hostPath" in reasons["0.5.0"] and "devices[0]" in reasons["0.5.0"]


def test_versions() -> None:
    assert EARLIEST == "0.3.0"
    assert [parse(v) for v in KNOWN_VERSIONS] == sorted(parse(v) for v in KNOWN_VERSIONS)
    assert parse("v1.1.0") == (1, 1, 0)
    for bad in ("1.0", "a.b.c", "1.0.0-rc1", ""):
        with pytest.raises(ValueError):
            parse(bad)
