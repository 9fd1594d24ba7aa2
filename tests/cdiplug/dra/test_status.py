"""A ResourceClaim's device status (cdiplug.dra.status): the entries built from prepared devices and how they are written.

Covers: an entry names driver, pool and device with a Ready condition (True once prepared; False
with the failure's reason and a bounded message) and data from what the device carries (typed
attributes, versions as strings, NUMA nodes, device-node host paths such as the VFIO group
device); data too large for the API server is cut to the ID; the apply body (UID precondition, no
devices key when clearing); publish applies with the driver's own field manager and never raises
(a refused write, an unanswered one within its bound, a client without the call), and treats a
claim already gone as cleared; a driver's background writes are bounded in number, in order per
claim, and one still waiting is replaced by a newer one of its claim; one asked for while a
kubelet's call is handled begins once that call's answer is sent (or after a bound when it never
is), one asked for outside a call at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from cdiplug.dra import status, statuswriter
from cdiplug.dra.handler import after_answer
from cdiplug.errors import KubernetesError
from cdiplug.models.devices import ContainerEdits, Device, DeviceNode, Version
from cdiplug.testing.poll import eventually

PCI = Device(
    "0000:3b:00.0",
    numa_nodes=(1,),
    edits=ContainerEdits(device_nodes=[DeviceNode(path="/dev/vfio/42")]),
    prepare_group="42",
    attributes={"address": "0000:3b:00.0", "iommu_group": "42", "numa_node": 1, "driver": "vfio-pci"},
)


def test_a_prepared_device_is_ready_with_its_data() -> None:
    entry = status.device_status("pci.example.com", "n1", "pci-0000-3b-00-0", PCI, now="2026-01-01T00:00:00Z")
    assert entry == {
        "driver": "pci.example.com",
        "pool": "n1",
        "device": "pci-0000-3b-00-0",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared by pci.example.com",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "data": {
            "id": "0000:3b:00.0",
            "attributes": {"address": "0000:3b:00.0", "iommu_group": "42", "numa_node": 1, "driver": "vfio-pci"},
            "numaNodes": [1],
            "deviceNodes": ["/dev/vfio/42"],
        },
    }


def test_a_failed_prepare_is_not_ready_with_a_bounded_message() -> None:
    failure = status.Failure(status.PREPARE_FAILED, "x" * 5000)
    entry = status.device_status("d.example.com", "n1", "dev", Device("dev"), failure, generation=3)
    (condition,) = entry["conditions"]
    assert (condition["status"], condition["reason"], condition["observedGeneration"]) == ("False", "PrepareFailed", 3)
    assert len(condition["message"]) == status.MAX_MESSAGE and condition["message"].endswith("…")
    assert condition["lastTransitionTime"].endswith("Z")


def test_data_carries_typed_attributes_and_versions_as_strings() -> None:
    gpu = Device("GPU-1", attributes={"uuid": "GPU-1", "minor": "0", "driverVersion": Version("550.54.0"), "gpuIndex": 0})
    assert status.device_data(gpu) == {
        "id": "GPU-1",
        "attributes": {"uuid": "GPU-1", "minor": "0", "driverVersion": "550.54.0", "gpuIndex": 0},
    }


def test_data_too_large_for_the_server_keeps_only_the_id() -> None:
    big = Device("big", attributes={f"a{i}": "v" * 400 for i in range(40)})
    assert status.device_data(big) == {"id": "big", "truncated": True}


def test_apply_body_names_the_claim_and_clears_with_no_devices() -> None:
    entry = status.device_status("d.example.com", "n1", "dev", Device("dev"))
    body = status.apply_body("ns", "c", "uid-1", [entry])
    assert body["metadata"] == {"name": "c", "namespace": "ns", "uid": "uid-1"}
    assert (body["apiVersion"], body["kind"], body["status"]) == ("resource.k8s.io/v1", "ResourceClaim", {"devices": [entry]})
    assert status.apply_body("ns", "c", "uid-1", [])["status"] == {}


class Client:
    def __init__(self, error: BaseException | None = None, stall: bool = False) -> None:
        self.calls: list[tuple[str, str, Mapping[str, Any], str]] = []
        self.error, self.stall = error, stall

    async def apply_claim_status(self, namespace: str, name: str, body: Mapping[str, Any], manager: str) -> dict[str, Any]:
        self.calls.append((namespace, name, body, manager))
        if self.stall:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error
        return dict(body)


async def test_publish_applies_as_the_drivers_field_manager() -> None:
    client = Client()
    assert await status.publish(lambda: client, "d.example.com", "ns", "c", "u", [])  # type: ignore[arg-type,return-value]
    ((ns, name, body, manager),) = client.calls
    assert (ns, name, manager) == ("ns", "c", "cdiplug-status-d.example.com")
    assert body["metadata"]["uid"] == "u"


async def test_publish_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    entry = [status.device_status("d.example.com", "n1", "dev", Device("dev"))]
    refused = Client(KubernetesError("resourceclaims/driver is forbidden", 403))
    with caplog.at_level(logging.WARNING):
        assert not await status.publish(lambda: refused, "d.example.com", "ns", "c", "u", entry)  # type: ignore[arg-type,return-value]
    assert "cannot write the device status of claim ns/c" in caplog.text and "forbidden" in caplog.text
    stalled = Client(stall=True)
    assert not await status.publish(lambda: stalled, "d.example.com", "ns", "c", "u", entry, timeout=0.05)  # type: ignore[arg-type,return-value]
    assert "no answer within 0.05 s" in caplog.text
    assert not await status.publish(lambda: object(), "d.example.com", "ns", "c", "u", entry)  # type: ignore[arg-type,return-value]


async def test_clearing_a_claim_that_is_gone_is_done() -> None:
    gone = Client(KubernetesError("not found", 404))
    assert await status.publish(lambda: gone, "d.example.com", "ns", "c", "u", [])  # type: ignore[arg-type,return-value]
    entry = [status.device_status("d.example.com", "n1", "dev", Device("dev"))]
    assert not await status.publish(lambda: gone, "d.example.com", "ns", "c", "u", entry)  # type: ignore[arg-type,return-value]


async def test_status_writes_are_bounded_in_order_and_a_waiting_one_is_replaced() -> None:
    class Gated(Client):
        def __init__(self) -> None:
            super().__init__()
            self.gate, self.full = asyncio.Event(), asyncio.Event()
            self.busy = self.most = 0

        async def apply_claim_status(self, namespace: str, name: str, body: Mapping[str, Any], manager: str) -> dict[str, Any]:
            self.busy += 1
            self.most = max(self.most, self.busy)
            if self.busy == statuswriter.WRITERS:
                self.full.set()
            await self.gate.wait()
            self.busy -= 1
            return await super().apply_claim_status(namespace, name, body, manager)

    client = Gated()
    writer = statuswriter.StatusWriter(lambda: client, "d.example.com")  # type: ignore[arg-type,return-value]
    entry = [status.device_status("d.example.com", "n1", "dev", Device("dev"))]
    claims = [f"c{i}" for i in range(statuswriter.WRITERS + 3)]
    for name in claims:
        writer.write("ns", name, f"u-{name}", entry)
    late = claims[-1]
    writer.write("ns", late, f"u-{late}", [])  # prepared and unprepared before its turn: written once, cleared
    await asyncio.wait_for(client.full.wait(), 5)  # every writer waits on the server
    client.gate.set()
    await asyncio.wait_for(writer.settled(), 5)
    assert client.most == statuswriter.WRITERS
    written = {name: bool(body["status"]) for _, name, body, _ in client.calls}
    assert len(client.calls) == len(claims) and written[late] is False and all(written[n] for n in claims[:-1])


async def test_a_status_write_begins_once_the_answer_of_its_call_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client()
    writer = statuswriter.StatusWriter(lambda: client, "d.example.com")  # type: ignore[arg-type,return-value]
    entry = [status.device_status("d.example.com", "n1", "dev", Device("dev"))]
    answered = asyncio.Event()
    with after_answer(answered):
        writer.write("ns", "during", "u-during", entry)
    writer.write("ns", "outside", "u-outside", entry)  # no call: at once
    # "during" was asked for first: had it not waited for its call's answer, it would be written first
    await eventually(lambda: client.calls, "the write outside a call")
    assert [name for _, name, _, _ in client.calls] == ["outside"]
    answered.set()
    await asyncio.wait_for(writer.settled(), 5)
    assert [name for _, name, _, _ in client.calls] == ["outside", "during"]

    monkeypatch.setattr(statuswriter, "ANSWER_WAIT", 0.05)
    with after_answer(asyncio.Event()):  # a call whose end never comes: written after the bound
        writer.write("ns", "never", "u-never", entry)
    await asyncio.wait_for(writer.settled(), 5)
    assert client.calls[-1][1] == "never"
