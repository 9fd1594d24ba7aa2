"""cdiplug.daemon: what a started daemon leaves switched on.

``cdiplug serve`` turns the garbage collector off while it imports and starts (cdiplug.__main__);
the daemon must turn it back on once it serves, or reference cycles made while serving would
never be freed. The daemon runs in the test's event loop with the fake backend and the kubelet
stand-in of ``cdiplug.testing``.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from cdiplug.daemon import Daemon
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn


async def test_the_collector_is_on_again_once_the_daemon_serves(world: World, short_tmp: Path) -> None:
    config = short_tmp / "config.yaml"
    config.write_text("resources:\n  - {name: example.com/fpga, backend: fake, options: {count: 2}}\n")
    gc.disable()  # as cdiplug.__main__ leaves it for serve
    try:
        async with KubeletStandIn(world.kubelet_dir) as kubelet:
            d = Daemon(config, world)
            task = asyncio.create_task(d.run(handle_signals=False), name="daemon under test")
            try:
                await asyncio.wait_for(d.started.wait(), 10)
                await kubelet.wait_registered("example.com/fpga")
                enabled, frozen = gc.isenabled(), gc.get_freeze_count()
            finally:
                d.request_stop()
                assert await asyncio.wait_for(task, 10) == 0
            assert enabled
            assert frozen > 0  # what start-up made is out of the collector's passes
    finally:
        gc.unfreeze()
        gc.enable()
