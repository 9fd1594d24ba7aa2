"""The PCI backend on the event loop (cdiplug_backends.pci.backend) over fake sysfs trees with the fake
kernel: first snapshots, journal recovery at start (a half-done bind is finished only when what is
left of it passes the safety checks, else rolled back), rescans on pyudev-like events (a fake monitor
read through loop.add_reader) and on the fallback timer, prepare (whole group, safety refusals,
force, concurrency: a repeated or concurrent prepare binds once, groups locked across resources),
restore (refused while the group node or an iommufd cdev is open), and status."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cdiplug.backend import abilities_of
from cdiplug.errors import DeviceInUse, PreparationError
from cdiplug.host import Preparations
from cdiplug.models.world import World
from cdiplug_backends.pci import PciBackend
from cdiplug_backends.pci.journal import Journal
from cdiplug_backends.pci.testing import FakeSysfsKernel, FakeUdevMonitor, SimulatedCrash, SysfsTree

from .conftest import add_nic_with_vfs, make_backend, running

VFIO_VF = ("example.com/nic-vfio", {"selectors": [{"pf": "ens1f0"}], "vfio": True})


async def test_first_snapshots_for_every_resource(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=2)
    backend = make_backend(world, [VFIO_VF, ("example.com/none", {"selectors": [{"vendor": "0xabcd"}]})], writer=kernel)
    assert abilities_of(backend).preparer is backend
    async with running(backend) as sink:
        assert sink.latest["example.com/nic-vfio"].ids == ("0000:3b:02.0", "0000:3b:02.1")
        assert sink.latest["example.com/none"].devices == ()


async def test_recovery_at_start_finishes_a_half_done_bind(world: World, tree: SysfsTree, kernel, caplog) -> None:
    add_nic_with_vfs(tree, vfs=1)
    crashing = make_backend(world, [VFIO_VF], writer=kernel)
    kernel.crash_after = 2  # right after the unbind
    await crashing.rescan()
    with pytest.raises(SimulatedCrash):
        await crashing.prepare("example.com/nic-vfio", crashing.state.snapshots["example.com/nic-vfio"].devices)
    assert tree.driver_of("0000:3b:02.0") is None
    kernel.crash_after = None
    async with running(make_backend(world, [VFIO_VF], writer=kernel)) as sink:
        d = sink.latest["example.com/nic-vfio"].get("0000:3b:02.0")
        assert d.attribute("driver") == "vfio-pci" and d.attribute("original_driver") == "iavf"
    assert "finished the bind" in caplog.text


NVME0, NVME1 = "0000:5e:00.0", "0000:5e:00.1"


@pytest.mark.parametrize(
    ("mounted", "force", "outcome"),
    [(False, False, "finished"), (True, False, "rolled back"), (True, True, "finished")],
)
async def test_recovery_at_start_checks_what_is_left_of_a_half_done_bind(
    world: World, tree: SysfsTree, kernel, tmp_path: Path, caplog, mounted, force, outcome
) -> None:
    """Two disks in one group; the crash leaves the second still on nvme. Mounted by the time the
    daemon starts again, it must not be taken off its driver (unless the resource says force)."""
    for address, disk, dev in ((NVME0, "nvme0n1", "259:0"), (NVME1, "nvme1n1", "259:1")):
        tree.add_function(address, vendor=0x144D, device=0xA808, class_code=0x010802, driver="nvme", iommu_group=9)
        tree.add_block(address, disk, dev)
    (tmp_path / "mountinfo").write_text("")
    spec = (
        "example.com/nvme",
        {"selectors": [{"class": "0x010802"}], "vfio": True, "mountinfo": str(tmp_path / "mountinfo"), "force": force},
    )
    crashing = make_backend(world, [spec], writer=kernel)
    kernel.crash_after = 4  # the first disk on vfio-pci, the second with its override only
    await crashing.rescan()
    with pytest.raises(SimulatedCrash):
        await crashing.prepare("example.com/nvme", crashing.state.snapshots["example.com/nvme"].devices)
    assert (tree.driver_of(NVME0), tree.driver_of(NVME1)) == ("vfio-pci", "nvme")
    kernel.crash_after = None
    if mounted:
        (tmp_path / "mountinfo").write_text("30 1 259:1 / /var/lib/data rw - ext4 /dev/nvme1n1 rw\n")
    async with running(make_backend(world, [spec], writer=kernel)) as sink:
        drivers = {d.id: d.attribute("driver") for d in sink.latest["example.com/nvme"].devices}
    journal = Journal(world.state_dir)
    assert journal.pending() == []
    if outcome == "finished":
        assert drivers == {NVME0: "vfio-pci", NVME1: "vfio-pci"} and "finished the bind" in caplog.text
    else:
        assert drivers == {NVME0: "nvme", NVME1: "nvme"}
        assert tree.driver_override(NVME0) is None and tree.driver_override(NVME1) is None
        assert journal.all_bound() == {}
        assert (
            f"rolled back rather than bind {NVME1}: in use by the host: block device nvme1n1 (259:1) is mounted on /var/lib/data"
            in caplog.text
        )


async def test_udev_events_trigger_rescans_and_removal_is_immediate(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    monitor = FakeUdevMonitor()
    backend = make_backend(world, [VFIO_VF], writer=kernel, udev_monitor=monitor)
    try:
        async with running(backend) as sink:
            assert monitor.started
            tree.add_vfs("0000:3b:00.0", ["0000:3b:02.0", "0000:3b:02.1"], driver="iavf", first_group=40)
            monitor.emit("add", "0000:3b:02.1")
            await sink.until("example.com/nic-vfio", lambda s: "0000:3b:02.1" in s)
            # Removal: the snapshot drops the function before any rescan could see it.
            published = len(sink.history)
            monitor.emit("remove", "0000:3b:02.1")
            snap = await sink.until("example.com/nic-vfio", lambda s: "0000:3b:02.1" not in s)
            assert snap is sink.history[published]
    finally:
        monitor.close()


async def test_periodic_rescan_without_udev(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    spec = ("example.com/nic-vfio", {**VFIO_VF[1], "rescan_interval": 0.05})
    async with running(make_backend(world, [spec], writer=kernel)) as sink:
        tree.set_numa_node("0000:3b:02.0", 3)
        snap = await sink.until("example.com/nic-vfio", lambda s: s.get("0000:3b:02.0").numa_nodes == (3,))
        assert snap.get("0000:3b:02.0").numa_nodes == (3,)


async def test_prepare_binds_and_publishes_the_new_driver(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=2)
    backend = make_backend(world, [VFIO_VF], writer=kernel)
    async with running(backend) as sink:
        device = sink.latest["example.com/nic-vfio"].get("0000:3b:02.1")
        await backend.prepare("example.com/nic-vfio", [device])
        snap = sink.latest["example.com/nic-vfio"]
        assert snap.get("0000:3b:02.1").attribute("driver") == "vfio-pci"
        assert snap.get("0000:3b:02.0").attribute("driver") == "iavf"
        assert (world.dev_root / "dev/vfio/41").exists()


async def test_concurrent_and_repeated_prepares_bind_once(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=2)
    backend = make_backend(world, [VFIO_VF], writer=kernel)
    async with running(backend) as sink:
        devices = sink.latest["example.com/nic-vfio"].devices
        await asyncio.gather(*(backend.prepare("example.com/nic-vfio", [devices[0]]) for _ in range(5)))
        await backend.prepare("example.com/nic-vfio", [devices[0]])
    assert [w for w in kernel.writes if w[0] == "bus/pci/drivers_probe"] == [("bus/pci/drivers_probe", "0000:3b:02.0")]


async def test_one_group_is_worked_on_once_at_a_time(world: World, tree: SysfsTree, kernel) -> None:
    """Prepares of two functions of one group, through the host's Preparations as every front end
    prepares, never interleave: the group is bound once."""
    tree.add_function("0000:01:00.0", vendor=0x10DE, class_code=0x030200, driver="nouveau", iommu_group=7)
    tree.add_function("0000:01:00.1", vendor=0x10DE, class_code=0x040300, driver="snd_hda_intel", iommu_group=7)
    specs = [("example.com/gpu", {"selectors": [{"vendor": "0x10de"}], "vfio": True})]
    backend = make_backend(world, specs, writer=kernel)
    active = 0
    overlap = []

    def on_write(path: str, value: str) -> None:
        overlap.append(active)

    kernel.on_write = on_write
    original = backend.binder.bind_group

    def counting(*args, **kwargs):
        nonlocal active
        active += 1
        try:
            return original(*args, **kwargs)
        finally:
            active -= 1

    backend.binder.bind_group = counting
    preparations = Preparations("pci", backend, backend)
    async with running(backend) as sink:
        gpu, audio = sink.latest["example.com/gpu"].devices
        await asyncio.gather(
            preparations.prepare("example.com/gpu", [gpu]),
            preparations.prepare("example.com/gpu", [audio]),
        )
    assert overlap and max(overlap) == 1
    assert len([w for w in kernel.writes if w[0] == "bus/pci/drivers_probe"]) == 2  # one bind of two functions


async def test_prepare_refuses_a_function_in_use_unless_forced(world: World, tree: SysfsTree, kernel, tmp_path: Path) -> None:
    tree.add_function("0000:5e:00.0", vendor=0x144D, device=0xA808, class_code=0x010802, driver="nvme", iommu_group=9)
    tree.add_block("0000:5e:00.0", "nvme0n1", "259:0")
    (tmp_path / "mountinfo").write_text("30 1 259:0 / /var/lib/data rw - ext4 /dev/nvme0n1 rw\n")
    options = {"selectors": [{"class": "0x010802"}], "vfio": True, "mountinfo": str(tmp_path / "mountinfo")}
    backend = make_backend(world, [("example.com/nvme", options)], writer=kernel)
    async with running(backend) as sink:
        with pytest.raises(DeviceInUse) as err:
            await backend.prepare("example.com/nvme", sink.latest["example.com/nvme"].devices)
        assert err.value.device == "0000:5e:00.0" and "mounted on /var/lib/data" in err.value.reason
        assert kernel.writes == [] and tree.driver_of("0000:5e:00.0") == "nvme"
    forced = make_backend(world, [("example.com/nvme", {**options, "force": True})], writer=kernel)
    async with running(forced) as sink:
        await forced.prepare("example.com/nvme", sink.latest["example.com/nvme"].devices)
    assert tree.driver_of("0000:5e:00.0") == "vfio-pci"


async def test_prepare_of_a_device_no_longer_advertised(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    backend = make_backend(world, [VFIO_VF], writer=kernel)
    async with running(backend) as sink:
        device = sink.latest["example.com/nic-vfio"].get("0000:3b:02.0")
        tree.remove_function("0000:3b:02.0")
        with pytest.raises(PreparationError, match="not advertised any more: gone from sysfs"):
            await backend.prepare("example.com/nic-vfio", [device])


async def test_prepare_without_vfio_does_nothing(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    backend = make_backend(world, [("example.com/vf", {"selectors": [{"pf": "ens1f0"}]})], writer=kernel)
    async with running(backend) as sink:
        await backend.prepare("example.com/vf", sink.latest["example.com/vf"].devices)
    assert kernel.writes == []


async def test_restore_refuses_an_open_group_node(world: World, tree: SysfsTree, kernel, tmp_path: Path) -> None:
    add_nic_with_vfs(tree, vfs=1)
    proc = tmp_path / "proc"
    (proc / "4242" / "fd").mkdir(parents=True)
    (proc / "4242" / "fd" / "9").symlink_to("/dev/vfio/40")
    (proc / "4242" / "comm").write_text("qemu-kvm\n")
    spec = ("example.com/nic-vfio", {**VFIO_VF[1], "proc_root": str(proc)})
    backend = make_backend(world, [spec], writer=kernel)
    async with running(backend) as sink:
        await backend.prepare("example.com/nic-vfio", sink.latest["example.com/nic-vfio"].devices)
        with pytest.raises(DeviceInUse, match=r"/dev/vfio/40 is open by 4242 \(qemu-kvm\)"):
            await backend.restore(["0000:3b:02.0"])
        assert tree.driver_of("0000:3b:02.0") == "vfio-pci"
        (result,) = await backend.restore(["0000:3b:02.0"], force=True)
        assert result.restored == (("0000:3b:02.0", "iavf"),)
        snap = await sink.until("example.com/nic-vfio", lambda s: s.get("0000:3b:02.0").attribute("driver") == "iavf")
        assert snap.get("0000:3b:02.0").attribute("original_driver") is None


async def test_restore_refuses_an_open_iommufd_device_node(world: World, tree: SysfsTree, tmp_path: Path) -> None:
    """A VMM on iommufd holds /dev/vfio/devices/vfioN and never the group node."""
    tree.enable_vfio(iommufd=True)
    add_nic_with_vfs(tree, vfs=1)
    kernel = FakeSysfsKernel(tree, iommufd=True)
    proc = tmp_path / "proc"
    (proc / "4242" / "fd").mkdir(parents=True)
    (proc / "4242" / "comm").write_text("qemu-kvm\n")
    spec = ("example.com/nic-vfio", {**VFIO_VF[1], "proc_root": str(proc)})
    backend = make_backend(world, [spec], writer=kernel)
    async with running(backend) as sink:
        await backend.prepare("example.com/nic-vfio", sink.latest["example.com/nic-vfio"].devices)
        (cdev,) = [
            n.path for n in sink.latest["example.com/nic-vfio"].get("0000:3b:02.0").edits.device_nodes if "devices" in n.path
        ]
        (proc / "4242" / "fd" / "9").symlink_to(cdev)
        with pytest.raises(DeviceInUse, match=rf"{cdev} is open by 4242 \(qemu-kvm\)"):
            await backend.restore(["0000:3b:02.0"])
        assert tree.driver_of("0000:3b:02.0") == "vfio-pci"
        (proc / "4242" / "fd" / "9").unlink()
        (result,) = await backend.restore(["0000:3b:02.0"])
        assert result.restored == (("0000:3b:02.0", "iavf"),)


async def test_bind_unbind_and_status_by_address(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    backend = PciBackend((), world, writer=kernel)  # as ``cdiplug vfio`` makes it: no resources
    status = await backend.status("0000:3b:02.0")
    assert (status.function.driver, status.record, status.node, status.node_present) == ("iavf", None, "/dev/vfio/40", False)
    result = await backend.bind_address("0000:3b:02.0")
    assert result.bound == ("0000:3b:02.0",)
    status = await backend.status("0000:3b:02.0")
    assert status.driver_override == "vfio-pci" and status.node_present and status.record.original_driver == "iavf"
    assert status.group_members == (("0000:3b:02.0", "vfio-pci"),)
    (restored,) = await backend.unbind_address("0000:3b:02.0")
    assert restored.restored == (("0000:3b:02.0", "iavf"),)
    assert Journal(world.state_dir).all_bound() == {}
    with pytest.raises(PreparationError, match="no such device 0000:99:00.0: no PCI function"):
        await backend.status("0000:99:00.0")


async def test_fake_kernel_udev_events_reach_the_backend(world: World, tree: SysfsTree) -> None:
    add_nic_with_vfs(tree, vfs=1)
    monitor = FakeUdevMonitor()
    kernel = FakeSysfsKernel(tree, udev=monitor)
    backend = make_backend(world, [("example.com/vf", {"selectors": [{"pf": "ens1f0"}]})], writer=kernel, udev_monitor=monitor)
    try:
        async with running(backend) as sink:
            # Someone else binds the VF by hand: the bind event makes the backend look again.
            await asyncio.to_thread(kernel.write, tree.function_dir("0000:3b:02.0") / "driver_override", "vfio-pci")
            await asyncio.to_thread(kernel.write, tree.drivers / "iavf" / "unbind", "0000:3b:02.0")
            await asyncio.to_thread(kernel.write, tree.root / "bus/pci/drivers_probe", "0000:3b:02.0")
            await sink.until("example.com/vf", lambda s: s.get("0000:3b:02.0").attribute("driver") == "vfio-pci")
    finally:
        monitor.close()


async def test_clean_up_returns_only_this_instances_functions(world: World, tree: SysfsTree, kernel) -> None:
    import attrs

    from cdiplug_backends.pci import make_plugin

    add_nic_with_vfs(tree, vfs=2)
    blue, green = attrs.evolve(world, instance="blue"), attrs.evolve(world, instance="green")
    await PciBackend((), blue, writer=kernel).bind_address("0000:3b:02.0")
    await PciBackend((), green, writer=kernel).bind_address("0000:3b:02.1")
    plugin = make_plugin(writer=kernel)
    assert plugin.clean_up is not None
    assert await plugin.clean_up(blue) == ["0000:3b:02.0: returned to iavf"]
    assert (tree.driver_of("0000:3b:02.0"), tree.driver_of("0000:3b:02.1")) == ("iavf", "vfio-pci")
    assert Journal(blue.own_state_dir).all_bound() == {}
    assert list(Journal(green.own_state_dir).all_bound()) == ["0000:3b:02.1"]
    assert await plugin.clean_up(blue) == []  # nothing left: nothing done
