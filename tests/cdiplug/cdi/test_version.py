"""The minimal ``cdiVersion`` (``cdiplug.cdi.version``): one test per rule of the reference
library's ``specs-go/version.go`` plus 1.1.0, on specs built in memory."""

from __future__ import annotations

import pytest

from cdiplug.cdi.spec import CdiContainerEdits, CdiDevice, CdiDeviceNode, CdiHook, CdiIntelRdt, CdiMount, CdiNetDevice, CdiSpec
from cdiplug.cdi.version import EARLIEST, KNOWN_VERSIONS, minimal_version, parse, requirements

ENV = CdiContainerEdits(env=["A=b"])


def spec(
    edits: CdiContainerEdits = ENV,
    *,
    common: CdiContainerEdits = CdiContainerEdits(),
    name: str = "dev0",
    kind: str = "example.com/fpga",
    annotations: dict[str, str] | None = None,
    device_annotations: dict[str, str] | None = None,
) -> CdiSpec:
    device = CdiDevice(name=name, container_edits=edits, annotations=device_annotations or {})
    return CdiSpec(cdi_version="", kind=kind, devices=[device], container_edits=common, annotations=annotations or {})


CASES = [
    ("floor", spec(), "0.3.0"),
    (
        "hooks and plain mounts need nothing",
        spec(CdiContainerEdits(hooks=[CdiHook("prestart", "/bin/true")], mounts=[CdiMount("/a", "/b", ["ro", "bind"])])),
        "0.3.0",
    ),
    (
        "device node without hostPath",
        spec(CdiContainerEdits(device_nodes=[CdiDeviceNode("/dev/x", type="c", major=1, minor=3)])),
        "0.3.0",
    ),
    ("mount type", spec(CdiContainerEdits(mounts=[CdiMount("/a", "/b", type="bind")])), "0.4.0"),
    ("mount type at spec level", spec(common=CdiContainerEdits(mounts=[CdiMount("/a", "/b", type="tmpfs")])), "0.4.0"),
    ("hostPath", spec(CdiContainerEdits(device_nodes=[CdiDeviceNode("/dev/x", host_path="/srv/x")])), "0.5.0"),
    (
        "hostPath at spec level",
        spec(common=CdiContainerEdits(device_nodes=[CdiDeviceNode("/dev/x", host_path="/srv/x")])),
        "0.5.0",
    ),
    ("name starts with a digit", spec(name="0000:3b:00.1"), "0.5.0"),
    ("spec annotations", spec(annotations={"a.com/b": "c"}), "0.6.0"),
    ("device annotations", spec(device_annotations={"x": "y"}), "0.6.0"),
    ("dot in the class", spec(kind="example.com/fpga.v2"), "0.6.0"),
    ("dot in the vendor only", spec(kind="ex.ample.com/fpga"), "0.3.0"),
    ("intelRdt", spec(CdiContainerEdits(env=["A=b"], intel_rdt=CdiIntelRdt(clos_id="c1"))), "0.7.0"),
    ("additionalGids", spec(CdiContainerEdits(additional_gids=[44])), "0.7.0"),
    ("additionalGids at spec level", spec(common=CdiContainerEdits(additional_gids=[44])), "0.7.0"),
    ("netDevices", spec(CdiContainerEdits(net_devices=[CdiNetDevice("eth1", "net0")])), "1.1.0"),
    ("intelRdt schemata", spec(CdiContainerEdits(intel_rdt=CdiIntelRdt(schemata=["L3:0=f"]))), "1.1.0"),
    ("intelRdt enableMonitoring", spec(CdiContainerEdits(intel_rdt=CdiIntelRdt(enable_monitoring=True))), "1.1.0"),
    (
        "highest rule wins",
        spec(CdiContainerEdits(mounts=[CdiMount("/a", "/b", type="bind")], additional_gids=[1]), name="0x"),
        "0.7.0",
    ),
]


@pytest.mark.parametrize(("what", "the_spec", "expected"), CASES, ids=[c[0] for c in CASES])
def test_minimal_version(what: str, the_spec: CdiSpec, expected: str) -> None:
    assert minimal_version(the_spec) == expected


def test_requirements_say_why() -> None:
    reasons = dict(requirements(spec(CdiContainerEdits(device_nodes=[CdiDeviceNode("/dev/x", host_path="/h")]))))
    assert "hostPath" in reasons["0.5.0"] and "devices[0]" in reasons["0.5.0"]


def test_versions() -> None:
    assert EARLIEST == "0.3.0"
    assert [parse(v) for v in KNOWN_VERSIONS] == sorted(parse(v) for v in KNOWN_VERSIONS)
    assert parse("v1.1.0") == (1, 1, 0)
    for bad in ("1.0", "a.b.c", "1.0.0-rc1", ""):
        with pytest.raises(ValueError):
            parse(bad)
