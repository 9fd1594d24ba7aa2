"""The slice publisher (cdiplug.dra.publisher) against the API-server stand-in over real HTTP (lightkube).

Covers: a pool spread over several slices, each with the pool's generation and count; shrinking
deletes the slices no longer needed and bumps the generation; an unchanged snapshot writes
nothing; slices of other drivers and nodes are never touched; a server that is down at first is
retried; withdraw deletes only our slices; the client maps API errors to KubernetesError; a daemon
without DRA resources never imports the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from cdiplug.dra.publisher import SlicePublisher
from cdiplug.dra.slices import UnhealthyPolicy
from cdiplug.errors import KubernetesError
from cdiplug.kube.client import LightkubeClient, slice_object
from cdiplug.models.devices import Device, DeviceSnapshot, Health, HealthCause
from cdiplug.telemetry.recorder import NullRecorder
from cdiplug.testing import ApiServerStandIn

DRIVER = "many.example.com"


def snapshot(count: int) -> DeviceSnapshot:
    return DeviceSnapshot("example.com/many", [Device(f"many-{i}") for i in range(count)])


@pytest.fixture
def node_name() -> str:
    """The node the shared ``api`` fixture (tests/conftest.py) knows."""
    return "n1"


@pytest.fixture
async def publisher(client: LightkubeClient) -> AsyncIterator[SlicePublisher]:
    publisher = SlicePublisher(client, DRIVER, "n1", backoff=(0.01, 0.05))
    task = asyncio.create_task(publisher.run(), name="publisher under test")
    yield publisher
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def pool(api: ApiServerStandIn) -> list[tuple[str, int, int, int]]:
    return [
        (
            s["metadata"]["name"],
            len(s["spec"]["devices"]),
            s["spec"]["pool"]["generation"],
            s["spec"]["pool"]["resourceSliceCount"],
        )
        for s in api.slices(spec__driver=DRIVER, spec__nodeName="n1")
    ]


async def test_many_devices_spread_shrink_and_stay(api: ApiServerStandIn, publisher: SlicePublisher) -> None:
    foreign = {"metadata": {"name": "x"}, "spec": {"driver": "other.example.com", "nodeName": "n1", "pool": {"name": "n1"}}}
    api.put_slice(foreign)
    publisher.want(snapshot(300))
    await asyncio.wait_for(publisher.wait_published(1), 10)
    assert pool(api) == [(f"n1-{DRIVER}-0", 128, 1, 3), (f"n1-{DRIVER}-1", 128, 1, 3), (f"n1-{DRIVER}-2", 44, 1, 3)]
    publisher.want(snapshot(100))
    await asyncio.wait_for(publisher.wait_published(2), 10)
    assert pool(api) == [(f"n1-{DRIVER}-0", 100, 2, 1)]
    writes = len(api.requests)
    publisher.want(snapshot(100))  # the same devices: nothing to write
    await asyncio.wait_for(publisher.wait_idle(), 10)
    assert publisher.publishes == 2 and len(api.requests) == writes
    await publisher.withdraw()
    assert pool(api) == [] and len(api.slices()) == 1  # the other driver's slice is still there
    assert all(method in ("GET", "DELETE") for method, _ in api.requests[writes:])


def taints(api: ApiServerStandIn) -> dict[str, object]:
    return {
        d["name"]: d.get("taints") for s in api.slices(spec__driver=DRIVER, spec__nodeName="n1") for d in s["spec"]["devices"]
    }


async def test_taints_per_cause_go_on_and_come_off(api: ApiServerStandIn, client: LightkubeClient) -> None:
    """Through the API-server stand-in: an XID taint on, its code changed, off once the GPU recovers,
    the generic key for a cause-less unhealthy device; each write counted by the recorder."""
    seen: list[bool] = []

    class Publishes(NullRecorder):
        def slices_published(self, resource: str, driver: str, ok: bool) -> None:
            assert (resource, driver) == ("example.com/gpu", DRIVER)
            seen.append(ok)

    publisher = SlicePublisher(client, DRIVER, "n1", backoff=(0.01, 0.05), resource="example.com/gpu", recorder=Publishes())
    task = asyncio.create_task(publisher.run(), name="publisher under test")
    try:

        async def publish(*devices: Device) -> None:
            publisher.want(DeviceSnapshot("example.com/gpu", devices))
            await asyncio.wait_for(publisher.wait_published(len(seen) + 1), 10)

        down = Health.UNHEALTHY
        await publish(Device("gpu-0", health=down, health_cause=HealthCause("xid", "79")), Device("gpu-1"))
        assert taints(api) == {"gpu-0": [{"key": "cdiplug.dev/xid", "value": "79", "effect": "NoSchedule"}], "gpu-1": None}
        await publish(Device("gpu-0", health=down, health_cause=HealthCause("xid", "48")), Device("gpu-1", health=down))
        assert taints(api) == {
            "gpu-0": [{"key": "cdiplug.dev/xid", "value": "48", "effect": "NoSchedule"}],
            "gpu-1": [{"key": "cdiplug.dev/unhealthy", "value": "true", "effect": "NoSchedule"}],
        }
        await publish(Device("gpu-0"), Device("gpu-1"))  # both recovered
        assert taints(api) == {"gpu-0": None, "gpu-1": None}
        assert seen == [True, True, True] and publisher.policy is UnhealthyPolicy.TAINT
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_server_down_at_first_is_retried(api: ApiServerStandIn, publisher: SlicePublisher) -> None:
    await api.stop()
    publisher.want(snapshot(2))
    await asyncio.wait_for(publisher.wait_failed(1), 10)
    await api.start()  # the same port
    await asyncio.wait_for(publisher.wait_published(1), 10)
    assert pool(api) == [(f"n1-{DRIVER}-0", 2, 1, 1)]


async def test_an_answer_without_a_content_type_is_retried(api: ApiServerStandIn, publisher: SlicePublisher) -> None:
    api.raw_answer = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops"  # a proxy's, say
    publisher.want(snapshot(2))
    await asyncio.wait_for(publisher.wait_failed(2), 10)  # failed, asked again, failed: not crashed
    api.raw_answer = None
    await asyncio.wait_for(publisher.wait_published(1), 10)
    assert pool(api) == [(f"n1-{DRIVER}-0", 2, 1, 1)]


async def test_errors_become_kubernetes_errors(client: LightkubeClient, api: ApiServerStandIn) -> None:
    with pytest.raises(KubernetesError) as info:
        await client.get_claim("default", "missing")
    assert info.value.status == 404
    pool = {"name": "n1", "generation": 1, "resourceSliceCount": 0}
    bad = {"metadata": {"name": "bad"}, "spec": {"driver": DRIVER, "nodeName": "n1", "pool": pool}}
    with pytest.raises(KubernetesError) as info:
        await client.create_slice(slice_object(bad))  # resourceSliceCount 0: the server refuses it
    assert info.value.status == 422
    await api.stop()
    with pytest.raises(KubernetesError) as info:
        await client.get_node("n1")
    assert info.value.status is None


def test_a_daemon_without_dra_never_imports_the_kubernetes_client() -> None:
    code = (
        "import sys, cdiplug.daemon, cdiplug.node, cdiplug.cli;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2') or m.startswith('cdiplug.dra')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
