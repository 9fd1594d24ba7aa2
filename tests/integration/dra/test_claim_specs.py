"""A prepared claim's CDI spec is kept by the one owner of the CDI folder, like a resource's.

The real daemon in-process, the DRA kubelet and API-server stand-ins, real inotify: a claim spec
deleted or edited while its claim is prepared is back, byte for byte, within a second, without a
prepare; after a restart the spec the earlier run wrote is kept the same way; after an unprepare
it stays gone. A named instance writes ``cdiplug.<instance>.claim-<uid>.json`` and keeps its
checkpoint in its own state folder. Each wait is on an inotify watch of the test's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import attrs

from cdiplug.config import Config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn, started_daemon
from cdiplug.testing.dra_kubelet import DraPluginConnection
from cdiplug.testing.dra_objects import allocated_claim, claim_ref
from cdiplug.toolkit.filewatch import FolderWatch

DRIVER = "fpga.example.com"
NODE = "node-a"
UID = "11111111-2222-3333-4444-555555555555"
DEADLINE = 5.0  # a hang stops here; the repair itself takes milliseconds

claim = partial(allocated_claim, driver=DRIVER, pool=NODE)


@contextlib.asynccontextmanager
async def serving(config: Config, world: World, kubelet: DraKubeletStandIn) -> AsyncIterator[DraPluginConnection]:
    async with started_daemon(config, world) as d:
        assert d.node is not None
        await asyncio.wait_for(d.node.host.specs.armed.wait(), DEADLINE)
        yield await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)


async def until(folder: Path, check: Callable[[], bool]) -> float:
    """Seconds until ``check()`` holds, woken by inotify events on ``folder``."""
    started = time.monotonic()
    async with asyncio.timeout(DEADLINE):
        while not check():
            async with FolderWatch(folder) as events:  # armed before the next look: no event missed
                if not check():
                    await anext(aiter(events))
    return time.monotonic() - started


def holds(path: Path, good: bytes) -> bool:
    try:
        return path.read_bytes() == good and path.stat().st_mode & 0o777 == 0o644
    except OSError:
        return False


async def test_a_claim_spec_deleted_while_prepared_is_back_within_a_second(
    config: Config, dra_world: World, api: ApiServerStandIn
) -> None:
    spec = dra_world.cdi_dir / f"cdiplug-claim-{UID}.json"
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        async with serving(config, dra_world, kubelet) as conn:
            obj = api.put_claim(claim(UID, [("fpga", "fpga-1")]))
            assert (await conn.prepare([claim_ref(obj)]))[UID].error == ""
            good = spec.read_bytes()
            for tamper in (Path.unlink, lambda p: p.write_bytes(b"{}"), lambda p: p.chmod(0o600)):
                tamper(spec)
                assert await until(dra_world.cdi_dir, lambda: holds(spec, good)) < 1.0
        # A restarted daemon keeps the spec its earlier run wrote.
        async with serving(config, dra_world, kubelet) as conn:
            spec.unlink()
            assert await until(dra_world.cdi_dir, lambda: holds(spec, good)) < 1.0
            assert await conn.unprepare([claim_ref(obj)]) == {UID: ""}
            assert not spec.exists()
            marker = dra_world.cdi_dir / "not-ours.json"
            marker.write_text("{}")  # one more event through the watch: the spec stays gone
            await until(dra_world.cdi_dir, marker.exists)
            assert not spec.exists() and marker.read_text() == "{}"


async def test_a_named_instance_names_its_claim_specs_and_state(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    world = attrs.evolve(dra_world, instance="blue")
    spec = world.cdi_dir / f"cdiplug.blue.claim-{UID}.json"
    default_spec = world.cdi_dir / "cdiplug-claim-00000000-0000-0000-0000-000000000000.json"
    default_spec.write_text("{}")  # the default instance's, not in blue's checkpoint: never blue's to sweep
    async with DraKubeletStandIn(world.plugins_registry_dir) as kubelet, serving(config, world, kubelet) as conn:
        obj = api.put_claim(claim(UID, [("fpga", "fpga-0")]))
        assert (await conn.prepare([claim_ref(obj)]))[UID].error == ""
        assert spec.exists() and default_spec.read_text() == "{}"
        assert (world.state_dir / "instances" / "blue" / "dra-claims.json").exists()
        assert not (world.state_dir / "dra-claims.json").exists()
        good = spec.read_bytes()
        spec.unlink()
        await until(world.cdi_dir, lambda: holds(spec, good))
        assert await conn.unprepare([claim_ref(obj)]) == {UID: ""}
        assert not spec.exists() and default_spec.exists()
