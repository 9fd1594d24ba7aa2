"""kill -9 in the middle of work that must survive it: CDI spec writes of a real daemon, and VFIO
binds journaled against the fake sysfs kernel.

Specs: a real ``python -m cdiplug serve`` rewrites its spec on every SIGHUP (the device count
changes); it is killed with SIGKILL at a random moment, then the folder must hold only whole specs
(parsing) and, once a new daemon has started, no temporary file. Bound: 12 cycles, ~25 s.

VFIO: a child process (``vfio_child.py``) binds and restores one group in a loop and is killed
after a random write; recovery in a fresh binder must leave the function consistent: bound to
vfio-pci with its record, or back on iavf without override or record, the journal empty. Bound:
20 cycles, ~15 s. ``CDIPLUG_CHAOS_SCALE`` multiplies both.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path

from cdiplug.cdi.spec import from_json
from cdiplug.models.world import World
from cdiplug.testing.process import daemon_process
from cdiplug_backends.pci.journal import Journal
from cdiplug_backends.pci.sysfs import PciSysfs
from cdiplug_backends.pci.testing import FakeSysfsKernel, SysfsTree
from cdiplug_backends.pci.vfio import VfioBinder

from .conftest import SCALE, figure, write_config

FPGA = "example.com/fpga"


def whole_specs(cdi_dir: Path) -> list[str]:
    names = sorted(os.listdir(cdi_dir))
    for name in names:
        if name.startswith("cdiplug-") and name.endswith(".json"):
            from_json((cdi_dir / name).read_bytes())  # raises on half a file
    return names


async def test_kill_9_during_spec_writes(chaos_world: World, short_tmp: Path) -> None:
    world = chaos_world
    rng = random.Random(12)
    cycles = 12 * SCALE
    config = write_config(short_tmp / "config.yaml", {FPGA: 3})
    temps_seen = 0
    for cycle in range(cycles):
        async with daemon_process(world, config) as daemon:
            await daemon.wait_for("serving example.com/fpga")
            assert not [n for n in os.listdir(world.cdi_dir) if n.endswith(".tmp")]  # a start cleans up
            deadline = asyncio.get_running_loop().time() + rng.uniform(0.0, 0.4)
            n = 0
            while asyncio.get_running_loop().time() < deadline:
                n += 1
                write_config(config, {FPGA: 2 + (cycle + n) % 7})
                daemon.proc.send_signal(signal.SIGHUP)
                await asyncio.sleep(rng.uniform(0.0, 0.02))  # the moments of the kill, not a wait
            await daemon.kill()
        names = whole_specs(world.cdi_dir)
        temps_seen += sum(n.endswith(".tmp") for n in names)
        daemon.check_log(str(config))
    async with daemon_process(world, config) as daemon:
        await daemon.wait_for("serving example.com/fpga")
        assert await daemon.stop() == 0
    assert [n for n in whole_specs(world.cdi_dir) if not n.startswith(".")] == ["cdiplug-example.com-fpga.json"]
    assert not [n for n in os.listdir(world.cdi_dir) if n.endswith(".tmp")]
    figure("kill -9 cycles during spec writes (every spec whole)", cycles)
    figure("temporary files found after a kill (removed at the next start)", temps_seen)


async def test_kill_9_during_vfio_binds(world: World) -> None:
    tree = SysfsTree(world.sysfs_root, world.dev_root)
    tree.enable_vfio()
    tree.add_function("0000:3b:00.0", vendor=0x8086, device=0x1572, driver="i40e", iommu_group=5, netdevs=["ens1f0"])
    (vf,) = tree.add_vfs("0000:3b:00.0", ["0000:3b:02.0"], device=0x154C, driver="iavf", first_group=40, netdev_prefix="ens1f0")
    child = Path(__file__).with_name("vfio_child.py")
    rng = random.Random(40)
    cycles = 20 * SCALE
    outcomes = {"vfio-pci": 0, "iavf": 0}
    for _ in range(cycles):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(child),
            str(world.sysfs_root),
            str(world.dev_root),
            str(world.state_dir),
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        target = rng.randint(1, 8)  # a bind is 3 writes, a restore 3: any point of either
        try:
            async with asyncio.timeout(30):
                while True:
                    line = await proc.stdout.readline()
                    assert line, "the child ended by itself"
                    if int(line.split()[1]) >= target:
                        break
                await asyncio.sleep(rng.uniform(0.0, 0.04))  # inside the child's pause after that write
        finally:
            proc.kill()
            await proc.wait()
        binder = VfioBinder(PciSysfs(world.sysfs_root), Journal(world.state_dir), world.dev_root, FakeSysfsKernel(tree))
        binder.recover()
        journal = Journal(world.state_dir)
        assert journal.pending() == []
        driver = tree.driver_of(vf)
        if driver == "vfio-pci":
            assert journal.bound(vf) is not None and (world.dev_root / "dev/vfio/40").exists()
        else:
            assert driver == "iavf" and tree.driver_override(vf) is None and journal.bound(vf) is None
        outcomes[driver] += 1
        assert not [n for n in os.listdir(journal.journal_dir) if n.endswith(".tmp") or ".corrupt-" in n]
    figure("kill -9 cycles during VFIO binds/restores (consistent after recovery)", f"{cycles} ({outcomes})")
