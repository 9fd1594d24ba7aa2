"""The DRA driver while the API server is gone, and while the kubelet gives up on a prepare.

The real daemon, in-process (:func:`~cdiplug.testing.daemon.running_daemon`), serving the fake
backend as DRA driver ``fpga.example.com`` with its visible preparation (``prepared_dir``), against
the DRA kubelet stand-in (real gRPC) and the API-server stand-in (HTTP, lightkube). Covers:

- the API server gone (every connection refused, then closed) for :data:`OUTAGE` seconds while a
  claim is prepared: its spec and devices stay; a repeated prepare of it is answered from the
  checkpoint; a new claim's prepare is answered at once with an error naming the claim and the
  server (the kubelet retries), and prepares once the server is back; a device turned unhealthy
  meanwhile is tainted in the slices once it is back, after one list;
- the kubelet restarting mid-prepare (its call cancelled after the backend prepared, and after
  the spec was written), and the claim deleted from the API server meanwhile: nothing is left
  (no spec, no record, no device prepared): it was never answered, so the kubelet's next
  prepare, if any, is a fresh one.

:data:`OUTAGE` is 3 s, not 30 s: the daemon's backoff (0.5 s doubling to 30 s, jittered)
takes the same path, only its last delay is longer. Bound: ~15 s in all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_kubelet import ClaimRef

from .conftest import figure

DRIVER = "fpga.example.com"
NODE = "node-o"
OUTAGE = 3.0
UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"


class LogEvents(logging.Handler):
    """Wakes :meth:`wait_for` on every log record (no polling)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self._loop.call_soon_threadsafe(self._changed.set)

    async def wait_for(self, text: str, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not any(text in m for m in self.messages):
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def logs() -> AsyncIterator[LogEvents]:
    handler = LogEvents()
    root = logging.getLogger("cdiplug")
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    random.seed(23)
    async with ApiServerStandIn() as server:
        server.put_node(NODE)
        yield server


@pytest.fixture
def marks(short_tmp: Path) -> Path:
    return short_tmp / "prepared"


@pytest.fixture
def config(short_tmp: Path, marks: Path) -> Config:
    options = {"count": 2, "prepared_dir": str(marks), "health_file": str(short_tmp / "health.yaml")}
    resource = {"name": "example.com/fpga", "backend": "fake", "api": "dra", "options": options}
    return parse_config({"resources": [resource]}, source="test_dra_outage")


@pytest.fixture
def dra_world(world: World, short_tmp: Path, api: ApiServerStandIn) -> Iterator[World]:
    yield attrs.evolve(
        world,
        plugins_registry_dir=short_tmp / "reg",
        plugins_dir=short_tmp / "plugins",
        node_name=NODE,
        kubeconfig=api.kubeconfig(short_tmp / "kubeconfig"),
    )


def put_claim(api: ApiServerStandIn, uid: str, device: str) -> ClaimRef:
    name = f"claim-{uid[:8]}"
    results = [{"request": "fpga", "driver": DRIVER, "pool": NODE, "device": device}]
    api.put_claim(
        {
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
    )
    return ClaimRef("default", name, uid)


def checkpoint(world: World) -> dict[str, Any]:
    path = world.state_dir / "dra-claims.json"
    return dict(json.loads(path.read_text())["claims"]) if path.exists() else {}


def tainted(api: ApiServerStandIn) -> list[str]:
    return [d["name"] for s in api.slices(spec__driver=DRIVER) for d in s["spec"]["devices"] if d.get("taints")]


async def test_api_server_gone_with_a_claim_prepared(
    config: Config, dra_world: World, api: ApiServerStandIn, marks: Path, short_tmp: Path
) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await asyncio.wait_for(api.wait_for(lambda: len(api.slices(spec__driver=DRIVER)) == 1), 10)
        a = put_claim(api, UID_A, "fpga-0")
        b = put_claim(api, UID_B, "fpga-1")
        first = (await conn.prepare([a]))[UID_A]
        assert not first.error

        api.refuse = True
        api.drop_connections()
        gone = time.monotonic()
        again = (await conn.prepare([a]))[UID_A]  # answered from the checkpoint
        assert again == first
        started = time.monotonic()
        refused = (await conn.prepare([b]))[UID_B]
        answered_in = time.monotonic() - started
        assert f"default/{b.name}" in refused.error and api.url in refused.error, refused.error
        assert answered_in < 5, f"the kubelet waited {answered_in:.1f} s for the answer"
        assert UID_B not in checkpoint(dra_world) and not (marks / "fpga-1").exists()
        (short_tmp / "health.yaml").write_text("fpga-1: Unhealthy\n")  # meanwhile
        await asyncio.sleep(OUTAGE - (time.monotonic() - gone))
        lists = api.count("GET", "resourceslices", watch=False)
        api.refuse = False

        await asyncio.wait_for(api.wait_for(lambda: tainted(api) == ["fpga-1"]), 40)
        back = time.monotonic() - gone - OUTAGE
        assert api.count("GET", "resourceslices", watch=False) - lists == 1
        late = (await conn.prepare([b]))[UID_B]
        assert not late.error and late.devices[0].device == "fpga-1"
        # The running pod's claim kept its devices and spec throughout.
        assert (marks / "fpga-0").exists() and (dra_world.cdi_dir / f"cdiplug-claim-{UID_A}.json").exists()
        await conn.close()
    figure(
        "DRA API server gone (daemon)",
        f"{OUTAGE:g} s: known claim answered from the checkpoint, new claim refused in {answered_in * 1000:.0f} ms "
        f"and prepared after; taint published {back:.2f} s after the return, 1 list; {api.refused} connections refused",
    )


@pytest.mark.parametrize("step", ["prepared", "spec"])
@pytest.mark.parametrize("deleted", [False, True], ids=["kubelet-restart", "claim-deleted"])
async def test_a_prepare_the_kubelet_gives_up_leaves_nothing(
    config: Config,
    dra_world: World,
    api: ApiServerStandIn,
    marks: Path,
    logs: LogEvents,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    deleted: bool,
) -> None:
    monkeypatch.setenv("CDIPLUG_DRA_PAUSE_AFTER", step)
    spec = dra_world.cdi_dir / f"cdiplug-claim-{UID_A}.json"
    async with running_daemon(config, dra_world):
        async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            a = put_claim(api, UID_A, "fpga-0")
            call = asyncio.create_task(conn.prepare([a]))
            await logs.wait_for(f"DRA paused after {step}")
            assert (marks / "fpga-0").exists() and checkpoint(dra_world)[UID_A]["state"] == "PrepareStarted"
            if deleted:
                api.delete_object("resourceclaims", a.name, "default")
            await conn.close()  # the kubelet goes away: its call is cancelled
            with pytest.raises((Exception, asyncio.CancelledError)):  # however grpc says the call ended
                await call
            await logs.wait_for("the prepare call was cancelled (the kubelet went away); rolled back")
        assert not (marks / "fpga-0").exists(), "the device is still prepared"
        assert not spec.exists() and checkpoint(dra_world) == {}
    figure("DRA prepare cancelled by the kubelet (after prepared / spec, claim kept / deleted)", "nothing left, 4 cases")
