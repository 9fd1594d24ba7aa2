"""The slice publisher's watch against a REAL kube-apiserver that ends every watch after 1 s.

The real etcd and kube-apiserver of tests/e2e/test_dra_apiserver.py (its ``apiserver`` fixture:
own loopback ports, own temporary folder). The client asks the server to end each watch after
``watch_timeout=1`` s (``timeoutSeconds``), so in a few seconds the publisher goes through several
watches that the real server ended, each opened again from the last version by the publisher
itself (one watch request per call: lightkube's own reopen is refused) — and a slice deleted
with kubectl after them is still seen and put back, without a request storm (watches counted
by the requests the client sent).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from cdiplug.dra.publisher import SlicePublisher
from cdiplug.kube.client import LightkubeClient
from cdiplug.kube.credentials import load_kubeconfig
from cdiplug.models.devices import Device, DeviceSnapshot

from .test_dra_apiserver import apiserver, kubectl

__all__ = ["apiserver"]  # the fixture, shared with test_dra_apiserver.py

pytestmark = pytest.mark.e2e  # a real kube-apiserver and etcd

DRIVER = "watch.example.com"


@pytest.fixture
async def client(apiserver: Path) -> AsyncIterator[LightkubeClient]:
    client = LightkubeClient(load_kubeconfig(apiserver), watch_timeout=1, watch_grace=5)
    yield client
    await client.close()


async def test_watches_the_server_ends_are_opened_again_and_see_a_deletion(client: LightkubeClient, apiserver: Path) -> None:
    watches: list[str] = []

    async def seen(request: httpx2.Request) -> None:
        if request.url.params.get("watch") == "true":
            watches.append(str(request.url.params.get("resourceVersion")))

    http = client._client._client._client  # lightkube's httpx client: count what is sent
    http.event_hooks = {**http.event_hooks, "request": [*http.event_hooks["request"], seen]}
    publisher = SlicePublisher(client, DRIVER, "n1", backoff=(0.05, 0.5))
    task = asyncio.create_task(publisher.run(), name="publisher")
    try:
        publisher.want(DeviceSnapshot("example.com/watch", [Device("w-0"), Device("w-1")]))
        await asyncio.wait_for(publisher.wait_published(1), 30)
        await asyncio.sleep(4)  # several watches of 1 s end meanwhile; nothing to wait on but time
        assert 3 <= len(watches) <= 10, watches
        kubectl(apiserver, "delete", "resourceslice", f"n1-{DRIVER}-0")
        await asyncio.wait_for(publisher.wait_published(2), 30)
        items, _ = await client.list_slices(DRIVER, "n1")
        assert [i.metadata.name for i in items if i.metadata] == [f"n1-{DRIVER}-0"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await publisher.withdraw()
