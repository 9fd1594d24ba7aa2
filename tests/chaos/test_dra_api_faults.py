"""The DRA slice publisher against an API server that fails: gone, watches cut, 410 Gone, silent, 409s, 429s.

The real :class:`~cdiplug.dra.publisher.SlicePublisher` over the real lightkube client and HTTP,
against the API-server stand-in's fault switches (:mod:`cdiplug.testing.apiserver`). Covers:

- the server gone (connections refused) while a device turns unhealthy: the change is published
  once it is back, with bounded backoff (attempts counted while it was gone) and one list on the
  way back;
- a watch cut mid-stream, answered 410 Gone, or opened on a server that never answers (and so
  silent: given up after ``watch_timeout`` + ``watch_grace``): watched again, and a slice someone
  deleted in the gap is put back;
- a second writer answering 409 to every other update, and 429 with ``Retry-After``: every
  change lands, the last state wins, retries are bounded, no request comes sooner than the
  server's Retry-After, and the process spends under 10% of a core over the run.

Times are short (backoff 0.2 s to 2 s, outage 3 s, watch timeout 1 s): the same code paths as the
defaults (0.5 s to 30 s, a 30 s outage, 300 s) with shorter numbers. Jitter uses a fixed seed.
Bound: ~20 s in all on 2 shared cores.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from cdiplug.dra.publisher import JITTER, SlicePublisher
from cdiplug.kube.client import LightkubeClient
from cdiplug.kube.credentials import load_kubeconfig
from cdiplug.models.devices import Device, DeviceSnapshot, Health, HealthCause
from cdiplug.testing import ApiServerStandIn

from .conftest import figure

DRIVER = "faults.example.com"
NODE = "n1"
BACKOFF = (0.2, 2.0)
OUTAGE = 3.0  # seconds; 30 s behaves the same with the default backoff, only slower


def snapshot(unhealthy: int | None = None, count: int = 3) -> DeviceSnapshot:
    sick = {"health": Health.UNHEALTHY, "health_cause": HealthCause("link-down", "true")}
    devices = [Device(f"dev-{i}", **(sick if i == unhealthy else {})) for i in range(count)]
    return DeviceSnapshot("example.com/faults", devices)


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    random.seed(23)  # the backoff's jitter: the same delays every run
    async with ApiServerStandIn() as server:
        server.put_node(NODE)
        yield server


@pytest.fixture
async def publisher(api: ApiServerStandIn, tmp_path: Path) -> AsyncIterator[SlicePublisher]:
    credentials = load_kubeconfig(api.kubeconfig(tmp_path / "kubeconfig"))
    client = LightkubeClient(credentials, timeout=1.0, watch_timeout=1, watch_grace=0.5)
    publisher = SlicePublisher(client, DRIVER, NODE, backoff=BACKOFF)
    task = asyncio.create_task(publisher.run(), name="publisher under faults")
    yield publisher
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await client.close()


def ours(api: ApiServerStandIn) -> list[dict[str, Any]]:
    return api.slices(spec__driver=DRIVER, spec__nodeName=NODE)


def tainted(api: ApiServerStandIn) -> list[str]:
    return [d["name"] for s in ours(api) for d in s["spec"]["devices"] if d.get("taints")]


async def settle(api: ApiServerStandIn, predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    await asyncio.wait_for(api.wait_for(predicate), timeout)


def attempts_bound(seconds: float) -> int:
    """The most tries one loop makes in ``seconds`` with BACKOFF and its jitter (and the first)."""
    tries, waited, delay = 1, 0.0, BACKOFF[0]
    while waited < seconds:
        waited += delay * (1 - JITTER)
        delay = min(delay * 2, BACKOFF[1])
        tries += 1
    return tries


async def test_server_gone_then_back_publishes_the_change_once(api: ApiServerStandIn, publisher: SlicePublisher) -> None:
    publisher.want(snapshot())
    await asyncio.wait_for(publisher.wait_published(1), 10)
    api.refuse = True
    api.drop_connections()
    gone = time.monotonic()
    publisher.want(snapshot(unhealthy=1))  # a device turned unhealthy while the server is gone
    await asyncio.sleep(OUTAGE)
    lists_before = api.count("GET", "resourceslices", watch=False)
    refused = api.refused
    api.refuse = False
    await settle(api, lambda: tainted(api) == ["dev-1"])
    back = time.monotonic()
    await asyncio.wait_for(publisher.wait_idle(), 5)
    lists = api.count("GET", "resourceslices", watch=False) - lists_before
    # Two loops (publish, watch) retry while it is gone, each with its own backoff.
    bound = 2 * attempts_bound(back - gone)
    assert refused <= bound, f"{refused} connections in {back - gone:.1f} s: more than backoff allows ({bound})"
    assert lists == 1, f"{lists} lists on the way back"
    figure(
        "DRA API server gone (publisher)",
        f"{OUTAGE:g} s: {refused} tries refused (bound {bound}), change published {back - gone - OUTAGE:.2f} s after "
        f"the return, {lists} list on the way back",
    )


@pytest.mark.parametrize("fault", ["cut", "gone", "silent"])
async def test_a_slice_deleted_while_the_watch_is_down_comes_back(
    api: ApiServerStandIn, publisher: SlicePublisher, fault: str
) -> None:
    publisher.want(snapshot(count=200))  # two slices
    await asyncio.wait_for(publisher.wait_published(1), 10)
    await settle(api, lambda: len(api._watches) == 1)
    name = f"{NODE}-{DRIVER}-1"
    watches = api.count("GET", "resourceslices", watch=True)
    if fault == "gone":
        api.gone_watches = 1
    if fault == "silent":
        api.stall = True  # the watch opened next is accepted and never answered
    assert api.cut_watches() == 1
    api.delete_object("resourceslices", name)  # someone deletes it in the gap
    if fault == "silent":
        await settle(api, lambda: api.count("GET", "resourceslices", watch=True) > watches)
        api.stall = False  # the server is fine again; the stalled watch is given up after 1.5 s
    started = time.monotonic()
    await settle(api, lambda: name in {s["metadata"]["name"] for s in ours(api)})
    took = time.monotonic() - started
    assert [s["spec"]["pool"]["generation"] for s in ours(api)] == [2, 2]
    # Later changes are seen too: the watch itself came back (a silent one was given up).
    await asyncio.wait_for(publisher.wait_idle(), 5)
    api.delete_object("resourceslices", name)
    await settle(api, lambda: name in {s["metadata"]["name"] for s in ours(api)})
    figure(f"DRA watch {fault}: deleted slice back after", f"{took:.2f} s")


async def test_conflicts_and_throttling_land_the_last_state_without_a_busy_loop(
    api: ApiServerStandIn, publisher: SlicePublisher
) -> None:
    publisher.want(snapshot())
    await asyncio.wait_for(publisher.wait_published(1), 10)
    cpu, wall = time.process_time(), time.monotonic()
    api.conflict_every_other = True
    changes = 8
    for i in range(changes):
        publisher.want(snapshot(unhealthy=i % 3))
        await asyncio.wait_for(publisher.wait_idle(), 10)
    failures = publisher.failures
    api.conflict_every_other = False
    api.throttle, api.retry_after = 3, 1
    publisher.want(snapshot(unhealthy=None))
    publisher.want(snapshot(unhealthy=2))  # the latest wins
    await settle(api, lambda: tainted(api) == ["dev-2"] and api.throttle == 0)
    await asyncio.wait_for(publisher.wait_idle(), 10)
    assert tainted(api) == ["dev-2"]
    used = (time.process_time() - cpu) / (time.monotonic() - wall)
    conflicts = failures
    assert conflicts <= 2 * changes, f"{conflicts} retries for {changes} changes"
    # No request (watches aside) sooner than Retry-After after a 429.
    for at in api.throttled_at:
        later = [r for r in api.received_at if r > at + 0.001]
        assert not later or later[0] - at >= 0.95 * api.retry_after, f"a request {later[0] - at:.3f} s after a 429"
    assert used < 0.10, f"{used:.1%} of a core"
    figure(
        "DRA 409 every other update + 429 Retry-After",
        f"{changes} changes, {conflicts} conflicts retried, 3 x 429 honoured, CPU {used:.1%} of a core",
    )


async def test_a_server_ending_every_watch_at_once_is_no_busy_loop(api: ApiServerStandIn, tmp_path: Path) -> None:
    # timeoutSeconds=0: the stand-in ends every watch as soon as it is open, cleanly, as a bad proxy might.
    client = LightkubeClient(load_kubeconfig(api.kubeconfig(tmp_path / "kubeconfig")), timeout=1.0, watch_timeout=0)
    publisher = SlicePublisher(client, DRIVER, NODE, backoff=BACKOFF)
    task = asyncio.create_task(publisher.run(), name="publisher, watches ended at once")
    try:
        publisher.want(snapshot())
        await asyncio.wait_for(publisher.wait_published(1), 10)
        cpu, wall, watches = time.process_time(), time.monotonic(), api.count("GET", "resourceslices", watch=True)
        await asyncio.sleep(OUTAGE)  # a length of time with nothing to wait on: the loop must idle through it
        opened = api.count("GET", "resourceslices", watch=True) - watches
        used = (time.process_time() - cpu) / (time.monotonic() - wall)
        assert opened <= attempts_bound(OUTAGE), f"{opened} watches in {OUTAGE:g} s"
        assert used < 0.10, f"{used:.1%} of a core"
        api.delete_object("resourceslices", f"{NODE}-{DRIVER}-0")  # still seen, by the next watch's replay
        await settle(api, lambda: len(ours(api)) == 1)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
    figure(
        "DRA watches ended at once by the server", f"{opened} watches in {OUTAGE:g} s (lightkube alone: ~1,000), CPU {used:.1%}"
    )
