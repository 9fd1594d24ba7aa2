"""cdiplug.kube.node_labels, .events and .config_label: what the daemon writes on and reads from its Node.

Label names and values from snapshots (shared attributes, a backend's ModelLabels, what cannot be
a label left out), the merge patch touching only cdiplug.dev/ keys but the configuration label;
then NodeLabeler, NodeEvents and ConfigLabelWatch through the real lightkube client against the
API-server stand-in (real HTTP): labels written, coalesced into one patch per interval, removed
when the resource leaves, others' labels kept; Events rate-limited per reason with a count;
the configuration label read first and followed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from cdiplug.kube.client import LightkubeClient
from cdiplug.kube.config_label import ConfigLabelWatch
from cdiplug.kube.events import NodeEvents, health_changes
from cdiplug.kube.node_labels import NodeLabeler, label_patch, label_value, resource_labels
from cdiplug.models.devices import Device, DeviceSnapshot, Health, HealthCause
from cdiplug.testing import ApiServerStandIn

FPGA = "example.com/fpga"


def fpgas(count: int, **attributes: object) -> DeviceSnapshot:
    return DeviceSnapshot(FPGA, [Device(f"fpga-{i}", attributes={"model": "fake fpga", **attributes}) for i in range(count)])


# -- names and values --------------------------------------------------------------------------


def test_labels_from_what_every_device_shares() -> None:
    devices = [
        Device("fpga-0", attributes={"model": "fake fpga", "speed": 9, "fast": True, "slot": 0, "temp": -3}),
        Device("fpga-1", attributes={"model": "fake fpga", "speed": 9, "fast": True, "slot": 1, "temp": -3}),
    ]
    labels, left_out = resource_labels(DeviceSnapshot(FPGA, devices))
    assert labels == {
        "cdiplug.dev/example.com.fpga.count": "2",
        "cdiplug.dev/example.com.fpga.speed": "9",  # plain digits: node affinity's Gt 5 compares it
        "cdiplug.dev/example.com.fpga.fast": "true",
        "cdiplug.dev/example.com.fpga.model": "fake-fpga",
    }  # slot differs between devices; a negative number is no label value
    assert left_out == ["temp: '-3' cannot be a label value"]
    assert resource_labels(DeviceSnapshot(FPGA, [])) == ({}, [])  # no devices: no labels at all


def test_values_and_names_that_cannot_be_labels() -> None:
    assert label_value("NVIDIA H200 (141 GB)") == "NVIDIA-H200-141-GB"
    assert label_value("x" * 80) == "x" * 63
    assert label_value("!!!") is None and label_value(-1) is None and label_value(False) == "false"
    long = DeviceSnapshot(FPGA, [Device("fpga-0", attributes={"a" * 60: 1})])
    labels, left_out = resource_labels(long)
    assert list(labels) == ["cdiplug.dev/example.com.fpga.count"]
    assert left_out[0].startswith("aaaa") and "is no label name" in left_out[0]


def test_a_backends_model_labels_replace_the_shared_attributes() -> None:
    class Model:
        def model_labels(self, resource: str, snapshot: DeviceSnapshot) -> Mapping[str, str | int]:
            return {"product": "NVIDIA H200", "memory": 143771}

    labels, _ = resource_labels(fpgas(1, speed=9), Model())
    assert labels == {
        "cdiplug.dev/example.com.fpga.product": "NVIDIA-H200",
        "cdiplug.dev/example.com.fpga.memory": "143771",
        "cdiplug.dev/example.com.fpga.count": "1",
    }


def test_the_patch_names_only_owned_keys() -> None:
    current = {"kubernetes.io/hostname": "n1", "cdiplug.dev/config": "gpu", "cdiplug.dev/old.x.count": "1", "cdiplug.dev/a": "1"}
    patch = label_patch(current, {"cdiplug.dev/a": "1", "cdiplug.dev/b": "2"})
    assert patch == {"metadata": {"labels": {"cdiplug.dev/b": "2", "cdiplug.dev/old.x.count": None}}}
    assert label_patch({"cdiplug.dev/a": "1", "cdiplug.dev/config": "x"}, {"cdiplug.dev/a": "1"}) is None


# -- against the stand-in ----------------------------------------------------------------------


def node_labels(api: ApiServerStandIn) -> dict[str, str]:
    return dict(api.node("n1")["metadata"].get("labels") or {})


async def test_the_labeler_writes_coalesces_and_removes(api: ApiServerStandIn, client: LightkubeClient) -> None:
    api.put_node("n1")
    api._objects[("nodes", "", "n1")]["metadata"]["labels"] = {"kubernetes.io/hostname": "n1", "cdiplug.dev/config": "fast"}
    labeler = NodeLabeler(lambda: client, "n1", interval=0.3, settle=5, backoff=(0.05, 0.1))
    labeler.expect([FPGA, "example.com/accel"])
    task = asyncio.create_task(labeler.run())
    try:
        labeler.offer(fpgas(2, speed=9))
        await asyncio.sleep(0.1)
        assert labeler.patches == 0  # not before every configured resource has reported (or settle passed)
        labeler.offer(DeviceSnapshot("example.com/accel", [Device("accel-0")]))
        await asyncio.wait_for(api.wait_for(lambda: "cdiplug.dev/example.com.accel.count" in node_labels(api)), 5)
        assert node_labels(api) == {
            "kubernetes.io/hostname": "n1",
            "cdiplug.dev/config": "fast",
            "cdiplug.dev/example.com.fpga.count": "2",
            "cdiplug.dev/example.com.fpga.speed": "9",
            "cdiplug.dev/example.com.fpga.model": "fake-fpga",
            "cdiplug.dev/example.com.accel.count": "1",
        }
        await asyncio.wait_for(labeler.wait_until(lambda it: it.patches >= 1), 5)  # its answer read
        assert labeler.patches == 1
        for count in (3, 4, 5):  # within one interval: one more patch, with the last
            labeler.offer(fpgas(count, speed=9))
        await asyncio.wait_for(api.wait_for(lambda: node_labels(api)["cdiplug.dev/example.com.fpga.count"] == "5"), 5)
        await asyncio.wait_for(labeler.wait_until(lambda it: it.patches >= 2), 5)
        assert labeler.patches == 2
        labeler.expect(["example.com/accel"])  # the FPGAs left the configuration
        await asyncio.wait_for(api.wait_for(lambda: "cdiplug.dev/example.com.fpga.count" not in node_labels(api)), 5)
        assert node_labels(api) == {
            "kubernetes.io/hostname": "n1",
            "cdiplug.dev/config": "fast",
            "cdiplug.dev/example.com.accel.count": "1",
        }
        labeler.offer(DeviceSnapshot("example.com/accel", []))  # its devices went
        await asyncio.wait_for(
            api.wait_for(lambda: node_labels(api) == {"kubernetes.io/hostname": "n1", "cdiplug.dev/config": "fast"}), 5
        )
        merges = [r for r in api.received if r.method == "PATCH"]
        assert {r.content_type for r in merges} == {"application/merge-patch+json"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_labeler_retries_a_refused_patch(api: ApiServerStandIn, client: LightkubeClient) -> None:
    api.put_node("n1")
    api.forbidden = {"patch nodes"}
    labeler = NodeLabeler(lambda: client, "n1", interval=0.05, settle=0, backoff=(0.05, 0.1))
    labeler.expect([FPGA])
    labeler.offer(fpgas(1))
    task = asyncio.create_task(labeler.run())
    try:
        await asyncio.wait_for(labeler.wait_until(lambda it: it.failures >= 2), 5)  # refused, and asked again
        assert labeler.patches == 0
        api.forbidden = set()
        await asyncio.wait_for(api.wait_for(lambda: "cdiplug.dev/example.com.fpga.count" in node_labels(api)), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_labeler_retries_after_an_answer_without_a_content_type(
    api: ApiServerStandIn, client: LightkubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    api.put_node("n1")
    api.raw_answer = b"HTTP/1.1 307 Temporary Redirect\r\nLocation: https://elsewhere.example/\r\nContent-Length: 0\r\n\r\n"
    labeler = NodeLabeler(lambda: client, "n1", interval=0.05, settle=0, backoff=(0.05, 0.1))
    labeler.expect([FPGA])
    labeler.offer(fpgas(1))
    task = asyncio.create_task(labeler.run())
    try:
        await asyncio.wait_for(labeler.wait_until(lambda it: it.failures >= 2), 5)  # failed, and asked again
        api.raw_answer = None
        await asyncio.wait_for(api.wait_for(lambda: "cdiplug.dev/example.com.fpga.count" in node_labels(api)), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert "cannot read Node n1 on" in caplog.text and "HTTP 307 Temporary Redirect to https://elsewhere.example/" in caplog.text


def test_health_changes_name_the_devices() -> None:
    well = fpgas(3)
    sick = DeviceSnapshot(
        FPGA, [Device("fpga-0"), Device("fpga-1", health=Health.UNHEALTHY, health_cause=HealthCause("xid")), Device("fpga-2")]
    )
    assert health_changes(None, well) == []
    assert health_changes(well, sick) == [("DeviceUnhealthy", "example.com/fpga: fpga-1 (xid) Unhealthy", True)]
    assert health_changes(sick, sick) == []
    assert health_changes(sick, well) == [("DeviceHealthy", "example.com/fpga: fpga-1 Healthy again", False)]


async def test_events_are_rate_limited_per_reason(api: ApiServerStandIn, client: LightkubeClient) -> None:
    events = NodeEvents(lambda: client, "n1", interval=0.5, backoff=(0.05, 0.1))
    task = asyncio.create_task(events.run())
    try:
        events.emit("DeviceUnhealthy", "fpga-1 Unhealthy", warning=True)
        await asyncio.wait_for(api.wait_for(lambda: len(api.events("default")) == 1), 5)
        for i in range(5):  # within the interval: held, the last one sent with the count
            events.emit("DeviceUnhealthy", f"fpga-{i} Unhealthy", warning=True)
        events.emit("ConfigurationError", "no configuration named 'x'", warning=True)  # another reason: at once
        await asyncio.wait_for(api.wait_for(lambda: len(api.events("default")) == 2), 5)
        assert api.events("default")[1]["reason"] == "ConfigurationError"
        await asyncio.wait_for(api.wait_for(lambda: len(api.events("default")) == 3), 5)
        first, _, held = api.events("default")
        assert (held["reason"], held["message"], held["count"], held["type"]) == (
            "DeviceUnhealthy",
            "fpga-4 Unhealthy",
            5,
            "Warning",
        )
        assert first["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"}
        assert first["metadata"]["name"].startswith("n1.cdiplug.")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_configuration_label_is_read_then_followed(api: ApiServerStandIn, client: LightkubeClient) -> None:
    api.put_node("n1")
    api._objects[("nodes", "", "n1")]["metadata"]["labels"] = {"cdiplug.dev/config": "gpu-node"}
    seen: list[str | None] = []
    changed = asyncio.Event()

    def on_change(name: str | None) -> None:
        seen.append(name)
        changed.set()

    watch = ConfigLabelWatch(lambda: client, "n1", on_change, backoff=(0.05, 0.1))
    task = asyncio.create_task(watch.run())
    try:
        assert await watch.first(5) == "gpu-node"
        changed.clear()
        await client.patch_node("n1", {"metadata": {"labels": {"cdiplug.dev/config": None, "other": "x"}}})
        await asyncio.wait_for(changed.wait(), 5)
        assert seen == ["gpu-node", None]
        await client.patch_node("n1", {"metadata": {"labels": {"other": "y"}}})  # another label: nothing to do
        changed.clear()
        await client.patch_node("n1", {"metadata": {"labels": {"cdiplug.dev/config": "fpga-node"}}})
        await asyncio.wait_for(changed.wait(), 5)
        assert seen == ["gpu-node", None, "fpga-node"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
