"""Binding to vfio-pci and back (cdiplug_backends.pci.vfio) against a fake sysfs tree whose kernel side is
cdiplug_backends.pci.testing.FakeSysfsKernel: the exact write sequence (never new_id), idempotence, rollback on
errors, restoring the recorded driver, and journal recovery after a crash (SimulatedCrash) at every
step of a bind and of a restore (a half-done bind whose remaining functions an in-use check refuses
is rolled back, and a crash during that roll-back is recovered too); plus the state folder itself (atomic files, corrupt files, locks)."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from cdiplug.models.world import World
from cdiplug_backends.pci.journal import Journal, JournalEntry, JournalError, Op, PlannedFunction, Step
from cdiplug_backends.pci.safety import FunctionInUse
from cdiplug_backends.pci.sysfs import PciSysfs
from cdiplug_backends.pci.testing import FakeSysfsKernel, SimulatedCrash, SysfsTree
from cdiplug_backends.pci.vfio import VfioBinder, VfioError

from .conftest import add_nic_with_vfs

VF = "0000:3b:02.0"


def binder_for(world: World, kernel: FakeSysfsKernel, **kwargs) -> VfioBinder:
    return VfioBinder(PciSysfs(world.sysfs_root), Journal(world.state_dir), world.dev_root, kernel, verify_timeout=0.2, **kwargs)


@pytest.fixture
def vfs(tree: SysfsTree) -> list[str]:
    return add_nic_with_vfs(tree, vfs=2)


def test_bind_writes_override_unbind_probe_and_nothing_else(world: World, tree: SysfsTree, kernel, vfs) -> None:
    result = binder_for(world, kernel).bind_group("40", [VF], resource="example.com/vf")
    assert kernel.writes == [
        (f"bus/pci/devices/{VF}/driver_override", "vfio-pci"),
        ("bus/pci/drivers/iavf/unbind", VF),
        ("bus/pci/drivers_probe", VF),
    ]
    assert (result.bound, result.already, result.node) == ((VF,), (), "/dev/vfio/40")
    assert tree.driver_of(VF) == "vfio-pci"
    record = Journal(world.state_dir).bound(VF)
    assert (record.original_driver, record.netdevs, record.resource, record.group) == (
        "iavf",
        ("ens1f0v0",),
        "example.com/vf",
        "40",
    )
    assert Journal(world.state_dir).pending() == []


def test_bind_is_idempotent(world: World, tree: SysfsTree, kernel, vfs) -> None:
    binder = binder_for(world, kernel)
    binder.bind_group("40", [VF])
    kernel.writes.clear()
    again = binder.bind_group("40", [VF])
    assert kernel.writes == [] and again.already == (VF,) and again.bound == ()


def test_driverless_function_is_probed_without_unbind(world: World, tree: SysfsTree, kernel) -> None:
    tree.add_function("0000:00:03.0", vendor=0x1234, device=0x11E8, class_code=0x00FF00, iommu_group=3)
    binder_for(world, kernel).bind_group("3", ["0000:00:03.0"])
    assert [w[0] for w in kernel.writes] == ["bus/pci/devices/0000:00:03.0/driver_override", "bus/pci/drivers_probe"]
    assert Journal(world.state_dir).bound("0000:00:03.0").original_driver is None


def test_whole_group_is_bound_and_restored(world: World, tree: SysfsTree, kernel) -> None:
    tree.add_function("0000:01:00.0", vendor=0x10DE, class_code=0x030200, driver="nouveau", iommu_group=7)
    tree.add_function("0000:01:00.1", vendor=0x10DE, class_code=0x040300, driver="snd_hda_intel", iommu_group=7)
    binder = binder_for(world, kernel)
    binder.bind_group("7", ["0000:01:00.0", "0000:01:00.1"])
    assert tree.driver_of("0000:01:00.0") == tree.driver_of("0000:01:00.1") == "vfio-pci"
    result = binder.restore_group("7", ["0000:01:00.0", "0000:01:00.1"])
    assert result.restored == (("0000:01:00.0", "nouveau"), ("0000:01:00.1", "snd_hda_intel"))
    assert not (world.dev_root / "dev/vfio/7").exists()


def test_missing_vfio_driver_is_a_clear_error(world: World, tree: SysfsTree, kernel, vfs) -> None:
    (tree.drivers / "vfio-pci").rename(tree.drivers / "gone")
    with pytest.raises(VfioError, match="vfio-pci driver is not loaded"):
        binder_for(world, kernel).bind_group("40", [VF])
    assert kernel.writes == []


def test_failed_probe_rolls_back_to_the_original_driver(world: World, tree: SysfsTree, kernel, vfs) -> None:
    kernel.fail["drivers_probe"] = errno.EIO
    with pytest.raises(VfioError) as err:
        binder_for(world, kernel).bind_group("40", [VF])
    assert err.value.device == VF and "drivers_probe failed" in err.value.reason
    assert tree.driver_of(VF) == "iavf" and tree.driver_override(VF) is None
    assert Journal(world.state_dir).pending() == [] and Journal(world.state_dir).bound(VF) is None


def test_node_that_never_appears_fails_the_bind(world: World, tree: SysfsTree, kernel, vfs) -> None:
    kernel.on_write = lambda path, value: (world.dev_root / "dev/vfio/40").unlink(missing_ok=True)
    with pytest.raises(VfioError, match="/dev/vfio/40 did not appear"):
        binder_for(world, kernel).bind_group("40", [VF])
    assert tree.driver_of(VF) == "iavf"


def test_restore_without_record_probes_the_default_driver(world: World, tree: SysfsTree, kernel, vfs) -> None:
    tree.unbind(VF)
    tree.bind(VF, "vfio-pci")  # bound by someone else: no record
    result = binder_for(world, kernel).restore_group("40", [VF])
    assert result.restored == ((VF, "iavf"),)
    assert kernel.writes[-1] == ("bus/pci/drivers_probe", VF)


def test_restore_when_the_direct_bind_fails_falls_back_to_probe(world: World, tree: SysfsTree, kernel, vfs) -> None:
    binder = binder_for(world, kernel)
    binder.bind_group("40", [VF])
    kernel.fail["iavf/bind"] = errno.ENODEV
    assert binder.restore_group("40", [VF]).restored == ((VF, "iavf"),)


def test_noiommu_bind_finds_its_new_group(world: World, tree: SysfsTree, kernel) -> None:
    tree.enable_vfio(noiommu=True)
    tree.add_function("0000:00:05.0", driver="virtio-pci")
    result = binder_for(world, kernel).bind_group("noiommu:0000:00:05.0", ["0000:00:05.0"])
    assert result.node == "/dev/vfio/noiommu-1000"


# -- crash recovery ------------------------------------------------------------------------------


def crash_at(kernel: FakeSysfsKernel, n: int) -> None:
    kernel.crash_after = n


@pytest.mark.parametrize(
    ("writes", "step", "outcome"),
    [
        (1, Step.OVERRIDE, "rolled back"),  # override written, still on iavf
        (2, Step.UNBIND, "finished"),  # driverless: must not stay so
        (3, Step.PROBE, "finished"),  # already on vfio-pci: verify and close
    ],
)
def test_recovery_after_a_crash_during_bind(world: World, tree: SysfsTree, kernel, vfs, writes, step, outcome) -> None:
    crash_at(kernel, writes)
    with pytest.raises(SimulatedCrash):
        binder_for(world, kernel).bind_group("40", [VF], resource="example.com/vf")
    (entry,) = Journal(world.state_dir).pending()
    assert (entry.op, entry.step, entry.function) == (Op.BIND, step, VF)
    kernel.crash_after = None
    report = binder_for(world, kernel).recover()
    assert len(report) == 1 and outcome in report[0] and f"interrupted at {step.value}" in report[0]
    journal = Journal(world.state_dir)
    assert journal.pending() == []
    if outcome == "finished":
        assert tree.driver_of(VF) == "vfio-pci" and (world.dev_root / "dev/vfio/40").exists()
        assert journal.bound(VF).original_driver == "iavf"
    else:
        assert tree.driver_of(VF) == "iavf" and tree.driver_override(VF) is None
        assert journal.bound(VF) is None


def test_recovery_after_a_crash_before_the_first_write(world: World, tree: SysfsTree, kernel, vfs) -> None:
    def crash_on_record(entry):
        raise SimulatedCrash("after record")

    binder = binder_for(world, kernel)
    binder.journal.record_bound = lambda record, original=binder.journal.record_bound: (original(record), crash_on_record(record))
    with pytest.raises(SimulatedCrash):
        binder.bind_group("40", [VF])
    report = binder_for(world, kernel).recover()
    assert "rolled back" in report[0]
    assert Journal(world.state_dir).bound(VF) is None and kernel.writes == []


@pytest.mark.parametrize("writes", [1, 2, 3])
def test_recovery_after_a_crash_during_restore(world: World, tree: SysfsTree, kernel, vfs, writes) -> None:
    binder_for(world, kernel).bind_group("40", [VF])
    kernel.writes.clear()
    crash_at(kernel, writes)
    with pytest.raises(SimulatedCrash):
        binder_for(world, kernel).restore_group("40", [VF])
    kernel.crash_after = None
    report = binder_for(world, kernel).recover()
    assert "finished the restore" in report[0]
    assert tree.driver_of(VF) == "iavf" and tree.driver_override(VF) is None
    assert Journal(world.state_dir).bound(VF) is None and Journal(world.state_dir).pending() == []


GPU, AUDIO = "0000:01:00.0", "0000:01:00.1"


class InUseCheck:
    """A stand-in for the backend's safety check: records its calls, refuses the ``busy`` ones."""

    def __init__(self, busy: dict[str, str] | None = None) -> None:
        self.busy = busy or {}
        self.calls: list[tuple[str | None, tuple[str, ...]]] = []

    def __call__(self, resource, functions) -> None:
        self.calls.append((resource, tuple(fn.address for fn in functions)))
        for fn in functions:
            if fn.address in self.busy:
                raise FunctionInUse(fn.address, self.busy[fn.address])


def crash_half_way_through_a_gpu(world: World, tree: SysfsTree, kernel) -> None:
    """Group 7 (GPU + audio) left with the GPU on vfio-pci and the audio function on its driver."""
    tree.add_function(GPU, vendor=0x10DE, class_code=0x030200, driver="nouveau", iommu_group=7)
    tree.add_function(AUDIO, vendor=0x10DE, class_code=0x040300, driver="snd_hda_intel", iommu_group=7)
    crash_at(kernel, 4)  # first function bound, second has its override only
    with pytest.raises(SimulatedCrash):
        binder_for(world, kernel).bind_group("7", [GPU, AUDIO], resource="example.com/gpu")
    kernel.crash_after = None
    assert (tree.driver_of(GPU), tree.driver_of(AUDIO), tree.driver_override(AUDIO)) == ("vfio-pci", "snd_hda_intel", "vfio-pci")


def test_recovery_of_a_multi_function_group_crashed_half_way(world: World, tree: SysfsTree, kernel) -> None:
    crash_half_way_through_a_gpu(world, tree, kernel)
    check = InUseCheck()
    assert "finished the bind" in binder_for(world, kernel, check_in_use=check).recover()[0]
    assert tree.driver_of(GPU) == tree.driver_of(AUDIO) == "vfio-pci"
    assert check.calls == [("example.com/gpu", (AUDIO,))]  # the journal's resource; only what is still on a host driver


def assert_rolled_back(world: World, tree: SysfsTree) -> None:
    journal = Journal(world.state_dir)
    assert (tree.driver_of(GPU), tree.driver_of(AUDIO)) == ("nouveau", "snd_hda_intel")
    assert tree.driver_override(GPU) is None and tree.driver_override(AUDIO) is None
    assert journal.bound(GPU) is None and journal.bound(AUDIO) is None and journal.pending() == []
    assert not (world.dev_root / "dev/vfio/7").exists()


def test_recovery_rolls_back_a_bind_whose_remaining_function_is_in_use(world: World, tree: SysfsTree, kernel, caplog) -> None:
    crash_half_way_through_a_gpu(world, tree, kernel)
    check = InUseCheck({AUDIO: "in use by the host: block device sdz is mounted on /data"})
    (line,) = binder_for(world, kernel, check_in_use=check).recover()
    assert f"rolled back rather than bind {AUDIO}: in use by the host: block device sdz is mounted on /data" in line
    assert_rolled_back(world, tree)
    assert f"rather than bind {AUDIO}" in caplog.text and "mounted on /data" in caplog.text


def test_recovery_without_an_in_use_check_rolls_back(world: World, tree: SysfsTree, kernel) -> None:
    crash_half_way_through_a_gpu(world, tree, kernel)
    assert f"rather than bind {AUDIO}: still on snd_hda_intel" in binder_for(world, kernel).recover()[0]
    assert_rolled_back(world, tree)


@pytest.mark.parametrize("writes", [1, 2, 3, 4])
def test_a_crash_during_the_roll_back_is_recovered_as_a_restore(world: World, tree: SysfsTree, kernel, writes) -> None:
    crash_half_way_through_a_gpu(world, tree, kernel)
    kernel.writes.clear()
    crash_at(kernel, writes)
    with pytest.raises(SimulatedCrash):
        binder_for(world, kernel, check_in_use=InUseCheck({AUDIO: "busy"})).recover()
    (entry,) = Journal(world.state_dir).pending()
    assert entry.op is Op.RESTORE
    kernel.crash_after = None
    check = InUseCheck()  # free by now: the roll-back is finished all the same
    assert "finished the restore" in binder_for(world, kernel, check_in_use=check).recover()[0]
    assert_rolled_back(world, tree)
    assert check.calls == []


def test_next_bind_of_the_group_recovers_first(world: World, tree: SysfsTree, kernel, vfs) -> None:
    crash_at(kernel, 2)
    with pytest.raises(SimulatedCrash):
        binder_for(world, kernel).bind_group("40", [VF])
    kernel.crash_after = None
    result = binder_for(world, kernel).bind_group("40", [VF])
    assert result.already == (VF,) and Journal(world.state_dir).pending() == []


# -- the state folder --------------------------------------------------------------------------------


def test_state_files_are_private_and_complete(world: World) -> None:
    journal = Journal(world.state_dir)
    entry = JournalEntry(op=Op.BIND, group="40", functions=[PlannedFunction(VF, "iavf")], step=Step.UNBIND, function=VF)
    journal.write(entry)
    path = world.state_dir / "pci" / "journal" / "40.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((world.state_dir / "pci").stat().st_mode) == 0o700
    assert json.loads(path.read_text())["step"] == "unbind"
    assert journal.pending() == [entry]
    assert [p.name for p in path.parent.iterdir()] == ["40.json"]  # no temporary files left
    journal.done("40")
    assert journal.pending() == []


def test_corrupt_state_file_is_moved_aside(world: World, caplog) -> None:
    journal = Journal(world.state_dir)
    journal.ensure()
    (journal.journal_dir / "40.json").write_text("{not json")
    (journal.bound_dir / f"{VF}.json").write_text('{"address": 1}')
    assert journal.pending() == [] and journal.all_bound() == {}
    assert sorted(p.name.split(".json")[0] for p in journal.journal_dir.iterdir()) == ["40"]
    assert "unreadable" in caplog.text and not (journal.journal_dir / "40.json").exists()


def test_hostile_state_files_are_moved_aside_never_read_through(world: World, short_tmp: Path, caplog) -> None:
    """A FIFO, a folder, a symlink (even to a good file), a huge or deep or non-UTF-8
    file where a journal entry or record should be: moved aside with the reason, no hang, no crash."""
    journal = Journal(world.state_dir)
    journal.ensure()
    good = {"op": "bind", "group": "44", "functions": [{"address": VF, "original_driver": "iavf"}]}
    elsewhere = short_tmp / "elsewhere.json"
    elsewhere.write_text(json.dumps(good))
    j = journal.journal_dir
    os.mkfifo(j / "40.json")
    (j / "41.json").mkdir()
    (j / "42.json").write_bytes(b'{"op": "bind", "group": "\xff"}')
    (j / "43.json").write_text("[" * 30_000 + "]" * 30_000)
    (j / "44.json").symlink_to(elsewhere)
    (j / "45.json").write_text(" " * (1 << 20) + "{}")
    (j / "46.json").write_text('{"op": "bind", "group": "46", "started_at": 1' + "0" * 5000 + "}")
    (journal.bound_dir / f"{VF}.json").symlink_to("/dev/zero")
    assert journal.pending() == [] and journal.all_bound() == {}
    left = sorted(p.name for p in [*j.iterdir(), *journal.bound_dir.iterdir()])
    assert all(".corrupt-" in n for n in left) and len(left) == 8
    for reason in ("a FIFO", "a folder", "not UTF-8", "nested more than", "symbolic link", "too big", "integer of 5,"):
        assert reason in caplog.text
    assert max(len(r.getMessage()) for r in caplog.records) < 1000
    assert elsewhere.exists()  # what a symlink pointed at is never touched


def test_state_files_naming_bad_paths_or_other_functions_are_moved_aside(world: World, caplog) -> None:
    """What a state file names becomes sysfs paths and locks: anything odd is never acted on."""
    journal = Journal(world.state_dir)
    journal.ensure()
    good = {"op": "bind", "group": "40", "functions": [{"address": VF, "original_driver": "iavf"}]}
    for name, data in (
        ("40.json", {**good, "group": "../../x"}),
        ("41.json", {**good, "group": "40"}),  # group 40's entry under group 41's lock
        ("42.json", {**good, "group": "42", "functions": [{"address": "../../../etc"}]}),
        ("43.json", {**good, "group": "43", "functions": [{"address": VF, "original_driver": "../iavf"}]}),
    ):
        (journal.journal_dir / name).write_text(json.dumps(data))
    other = "0000:3b:02.1"
    (journal.bound_dir / f"{VF}.json").write_text(json.dumps({"address": other, "group": "41"}))
    assert journal.pending() == [] and journal.bound(VF) is None and journal.all_bound() == {}
    left = sorted(p.name for p in [*journal.journal_dir.iterdir(), *journal.bound_dir.iterdir()])
    assert sorted(n.split(".corrupt-")[0] for n in left) == sorted(["40.json", "41.json", "42.json", "43.json", f"{VF}.json"])
    assert all(".corrupt-" in n for n in left)
    assert "belongs in 40.json" in caplog.text and f"belongs in {other}.json" in caplog.text
    assert "not an IOMMU group key: '../../x'" in caplog.text and "not a driver name: '../iavf'" in caplog.text


def test_group_keys_never_leave_the_folder(world: World) -> None:
    journal = Journal(world.state_dir)
    for bad in ("../x", "7/../../etc", "noiommu:../../x"):
        with pytest.raises(ValueError):
            journal.done(bad)
    with pytest.raises(ValueError):
        journal.forget_bound("../../etc/passwd")


def test_group_lock_excludes_other_holders(world: World) -> None:
    journal = Journal(world.state_dir)
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with journal.locked("40"):
            order.append("first in")
            inside.set()
            release.wait(5)
            order.append("first out")

    t = threading.Thread(target=holder)
    t.start()
    inside.wait(5)

    def second() -> None:
        with Journal(world.state_dir).locked("40"):  # another open file: as another process would
            order.append("second in")

    t2 = threading.Thread(target=second)
    t2.start()
    t2.join(0.2)
    assert order == ["first in"]
    release.set()
    t.join(5)
    t2.join(5)
    assert order == ["first in", "first out", "second in"]
    assert os.path.exists(world.state_dir / "pci" / "locks" / "40.lock")


def test_a_group_lock_wait_is_bounded(world: World) -> None:
    """Another process stuck on a group fails this one's operation; it never blocks its thread for good."""
    with Journal(world.state_dir).locked("40"), pytest.raises(JournalError, match="IOMMU group 40 stayed locked"):
        with Journal(world.state_dir).locked("40", wait=0.1):
            pass


def test_temporary_files_of_dead_writers_are_removed_at_recovery(world: World, tree: SysfsTree, kernel, vfs) -> None:
    """A process killed while writing a state file leaves ``.<name>.<pid>.<tid>.tmp``: recovery
    removes those of dead processes, never a live one's."""
    journal = Journal(world.state_dir)
    journal.ensure()
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    left = journal.journal_dir / f".40.json.{dead}.1234.tmp"
    left.write_text("{half")
    ours = journal.bound_dir / f".{VF}.json.{os.getpid()}.1234.tmp"
    ours.write_text("{being written")
    binder_for(world, kernel).recover()
    assert not left.exists() and ours.exists()
