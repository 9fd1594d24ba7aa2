"""Binding PCI functions to vfio-pci and back, one IOMMU group at a time, journaled and idempotent.

The bind sequence for each function of a group (never ``new_id``, which would grab every
function with the same IDs):

1. record the original driver and network interfaces (``journal.BoundRecord``),
2. write ``vfio-pci`` to ``driver_override``,
3. unbind from the current driver,
4. write the address to ``bus/pci/drivers_probe`` (the PCI core honours the override),
5. verify the ``driver`` link names vfio-pci and the group's node exists under ``--dev-root``:
   ``/dev/vfio/<group>`` (no-IOMMU mode: ``/dev/vfio/noiommu-<group>``).

A function already on vfio-pci is left as it is. Restoring clears ``driver_override``, unbinds
from vfio-pci and binds the recorded original driver (``drivers_probe`` when none was recorded).

Each step is journaled before it is taken. :meth:`VfioBinder.recover` deals with what a crash
left: a bind where every function still has its original driver is rolled back (the override is
cleared); a bind that already took a function off its driver is finished (a function must never be
left driverless), but only after the functions of the group still on a host driver pass the same
in-use check a bind gets (``check_in_use``, given by the backend: the journal entry's resource
picks its ``force``, denylist and checker; no resource means the strictest). Should one be in use,
the bind is rolled back instead, as a restore (journaled as one, so a crash during it finishes the
restore): every function back to its recorded original driver. A restore is always finished. An
error (not a crash) during a bind rolls back the functions touched so far and raises
:class:`VfioError`.

Everything here blocks (sysfs writes, fsync, ``flock``): the backend calls it through
``asyncio.to_thread``. Writes go through a writer object (``write(path, value)``), the real one
here, :class:`cdiplug_backends.pci.testing.FakeSysfsKernel` in unit tests. Test hook: the environment
variable ``CDIPLUG_PCI_PAUSE_AFTER=<step>`` (a :class:`~cdiplug_backends.pci.journal.Step` value) makes a
bind stop for good after taking that step, printing ``cdiplug-test-hook: paused after <step>`` to
stderr, so an end-to-end test can kill the process mid-bind.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from attrs import evolve, frozen

from cdiplug.sdk import DeviceInUse, PreparationError

from .journal import BoundRecord, Journal, JournalEntry, Op, PlannedFunction, Step
from .sysfs import PciFunction, PciSysfs

log = logging.getLogger(__name__)

VFIO_DRIVER = "vfio-pci"
PAUSE_ENV = "CDIPLUG_PCI_PAUSE_AFTER"
VERIFY_TIMEOUT = 5.0


class VfioError(PreparationError):
    """Binding or restoring a function failed; ``device`` names it, ``reason`` says why."""


InUseCheck = Callable[[str | None, Sequence[PciFunction]], None]
"""``check(resource, functions)``: raise :class:`~cdiplug.errors.DeviceInUse` when one of the
functions must not be bound (``resource`` is the journal entry's, None when it named none). Blocking."""


class SysfsWriter(Protocol):
    def write(self, path: Path, value: str) -> None: ...


class OsSysfsWriter:
    """Writes a sysfs attribute in one ``write(2)``, as the kernel wants it."""

    def write(self, path: Path, value: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


@frozen
class BindResult:
    """What a bind did: the functions it moved, and those already on vfio-pci."""

    group: str
    bound: tuple[str, ...] = ()
    already: tuple[str, ...] = ()
    node: str | None = None


@frozen
class RestoreResult:
    group: str
    restored: tuple[tuple[str, str | None], ...] = ()  # (address, driver now)


class VfioBinder:
    """Binds and restores groups of functions. One instance per process; callers serialize per group."""

    def __init__(
        self,
        sysfs: PciSysfs,
        journal: Journal,
        dev_root: Path,
        writer: SysfsWriter | None = None,
        pause_after: str | None = None,
        verify_timeout: float = VERIFY_TIMEOUT,
        clock: Callable[[], float] = time.time,
        check_in_use: InUseCheck | None = None,
    ) -> None:
        self.sysfs = sysfs
        self.journal = journal
        self.dev_root = Path(dev_root)
        self.writer = writer or OsSysfsWriter()
        self.pause_after = pause_after if pause_after is not None else os.environ.get(PAUSE_ENV) or None
        self.verify_timeout = verify_timeout
        self.clock = clock
        # Without a check, recovery cannot tell whether a function is free, so it never finishes
        # a bind that would take one more function off its host driver.
        self.check_in_use = check_in_use

    # -- helpers -----------------------------------------------------------------------------------

    def _write(self, address: str, path: Path, value: str, what: str) -> None:
        try:
            self.writer.write(path, value)
        except OSError as exc:
            raise VfioError(address, f"{what} failed: writing {value.strip()!r} to {path}: {exc.strerror or exc}") from exc

    def _read(self, address: str) -> PciFunction:
        fn = self.sysfs.read_function(address)
        if fn is None:
            raise VfioError(address, "the function is gone from sysfs")
        return fn

    def _step(self, entry: JournalEntry, step: Step, address: str) -> JournalEntry:
        entry = evolve(entry, step=step, function=address)
        self.journal.write(entry)
        return entry

    def _pause_hook(self, step: Step) -> None:
        if self.pause_after == step.value:
            print(f"cdiplug-test-hook: paused after {step.value}", file=sys.stderr, flush=True)
            while True:  # the test kills us here
                time.sleep(3600)

    def node_for(self, fn: PciFunction) -> str | None:
        """The group's device node path (as in the container), once the function has a group."""
        if fn.iommu_group is None:
            return None
        if self.sysfs.group_is_noiommu(fn.iommu_group):
            return f"/dev/vfio/noiommu-{fn.iommu_group}"
        return f"/dev/vfio/{fn.iommu_group}"

    def host_node(self, node: str) -> Path:
        return self.dev_root / node.lstrip("/")

    # -- bind ----------------------------------------------------------------------------------------

    def bind_group(self, group: str, addresses: Sequence[str], resource: str | None = None) -> BindResult:
        """Bind every function in ``addresses`` (one IOMMU group) to vfio-pci. Idempotent.

        Safety checks are the caller's job (they need the event loop for netlink).
        """
        with self.journal.locked(group):
            self._recover_group(group)
            functions = [self._read(a) for a in addresses]
            todo = [fn for fn in functions if fn.driver != VFIO_DRIVER]
            already = tuple(fn.address for fn in functions if fn.driver == VFIO_DRIVER)
            if not todo:
                node = self._verify_node(functions[0].address)
                return BindResult(group=group, already=already, node=node)
            if not self.sysfs.driver_loaded(VFIO_DRIVER):
                raise VfioError(todo[0].address, "the vfio-pci driver is not loaded (modprobe vfio-pci)")
            planned = []
            for fn in todo:
                previous = self.journal.bound(fn.address)
                # A function found driverless that we bound before keeps its first record.
                original = fn.driver if fn.driver is not None or previous is None else previous.original_driver
                netdevs = fn.netdevs or (previous.netdevs if previous else ())
                planned.append(PlannedFunction(fn.address, original, netdevs))
            entry = JournalEntry(op=Op.BIND, group=group, functions=planned, resource=resource, started_at=self.clock())
            entry = self._step(entry, Step.RECORD, planned[0].address)
            for p in planned:
                self.journal.record_bound(
                    BoundRecord(p.address, group, p.original_driver, p.netdevs, resource, bound_at=self.clock())
                )
            self._pause_hook(Step.RECORD)
            try:
                self._bind_steps(entry, planned)
                node = self._verify_node(planned[0].address)
            except PreparationError as exc:
                log.warning("binding IOMMU group %s failed (%s); rolling back", group, exc.reason)
                self._rollback(entry)
                raise
            self.journal.done(group)
            log.info("bound IOMMU group %s to vfio-pci: %s", group, ", ".join(p.address for p in planned))
            return BindResult(group=group, bound=tuple(p.address for p in planned), already=already, node=node)

    def _bind_steps(self, entry: JournalEntry, planned: Sequence[PlannedFunction]) -> None:
        for p in planned:
            address = p.address
            fn = self._read(address)
            if fn.driver == VFIO_DRIVER:
                continue
            entry = self._step(entry, Step.OVERRIDE, address)
            self._write(address, self.sysfs.function_dir(address) / "driver_override", VFIO_DRIVER, "driver_override")
            self._pause_hook(Step.OVERRIDE)
            if fn.driver is not None:
                entry = self._step(entry, Step.UNBIND, address)
                self._write(address, self.sysfs.driver_dir(fn.driver) / "unbind", address, f"unbind from {fn.driver}")
                self._pause_hook(Step.UNBIND)
            entry = self._step(entry, Step.PROBE, address)
            self._write(address, self.sysfs.drivers_probe, address, "drivers_probe")
            self._pause_hook(Step.PROBE)
            entry = self._step(entry, Step.VERIFY, address)
            self._verify_driver(address, VFIO_DRIVER)

    def _wait(self, check: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + self.verify_timeout
        while True:
            if check():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)  # sysfs and devtmpfs offer nothing to wait on

    def _verify_driver(self, address: str, driver: str) -> None:
        def bound() -> bool:
            fn = self.sysfs.read_function(address)
            return fn is not None and fn.driver == driver

        if not self._wait(bound):
            fn = self.sysfs.read_function(address)
            now = fn.driver if fn is not None else "gone"
            raise VfioError(address, f"after drivers_probe the driver is {now or 'none'}, not {driver}")

    def _verify_node(self, address: str) -> str | None:
        fn = self._read(address)
        if fn.driver != VFIO_DRIVER:
            raise VfioError(address, f"bound to {fn.driver or 'no driver'}, not vfio-pci")
        node = self.node_for(fn)
        if node is None:
            raise VfioError(address, "bound to vfio-pci but has no IOMMU group")
        if not self._wait(lambda: self.host_node(node).exists()):
            raise VfioError(address, f"bound to vfio-pci but {node} did not appear (under {self.dev_root})")
        return node

    # -- restore -------------------------------------------------------------------------------------

    def restore_group(self, group: str, addresses: Sequence[str]) -> RestoreResult:
        """Return each function to its recorded original driver (``drivers_probe`` when none is
        recorded) and clear ``driver_override``. Open-device checks are the caller's job."""
        with self.journal.locked(group):
            self._recover_group(group)
            planned = []
            for address in addresses:
                record = self.journal.bound(address)
                fn = self._read(address)
                netdevs = record.netdevs if record else fn.netdevs
                planned.append(PlannedFunction(address, record.original_driver if record else None, netdevs))
            entry = JournalEntry(op=Op.RESTORE, group=group, functions=planned, started_at=self.clock())
            done = self._restore_steps(entry, planned, known=[self.journal.bound(p.address) is not None for p in planned])
            self.journal.done(group)
            return RestoreResult(group=group, restored=tuple(done))

    def _restore_steps(
        self, entry: JournalEntry, planned: Sequence[PlannedFunction], known: Sequence[bool]
    ) -> list[tuple[str, str | None]]:
        done = []
        for p, recorded in zip(planned, known, strict=True):
            address = p.address
            fn = self._read(address)
            entry = self._step(entry, Step.CLEAR_OVERRIDE, address)
            if self.sysfs.read_driver_override(address) is not None:
                self._write(address, self.sysfs.function_dir(address) / "driver_override", "\n", "clearing driver_override")
            if fn.driver == VFIO_DRIVER:
                entry = self._step(entry, Step.UNBIND_VFIO, address)
                self._write(address, self.sysfs.driver_dir(VFIO_DRIVER) / "unbind", address, "unbind from vfio-pci")
                fn = self._read(address)
            if fn.driver is None and (p.original_driver is not None or not recorded):
                entry = self._step(entry, Step.REBIND, address)
                self._rebind(address, p.original_driver)
            now = self._read(address).driver
            if p.original_driver is not None and now != p.original_driver:
                raise VfioError(address, f"restored to {now or 'no driver'}, not the original {p.original_driver}")
            self.journal.forget_bound(address)
            log.info("restored %s to %s", address, now or "no driver")
            done.append((address, now))
        return done

    def _rebind(self, address: str, driver: str | None) -> None:
        if driver is not None and self.sysfs.driver_loaded(driver):
            try:
                self.writer.write(self.sysfs.driver_dir(driver) / "bind", address)
                self._verify_driver(address, driver)
                return
            except (OSError, VfioError) as exc:
                log.warning("binding %s to %s directly failed (%s); asking drivers_probe", address, driver, exc)
        self._write(address, self.sysfs.drivers_probe, address, "drivers_probe")
        if driver is not None:
            self._verify_driver(address, driver)

    def _rollback(self, entry: JournalEntry) -> None:
        """Undo a failed bind: every function back where it was. Leaves the journal when it cannot."""
        try:
            self._restore_steps(entry, entry.functions, known=[True] * len(entry.functions))
        except PreparationError as exc:
            log.error("rolling back IOMMU group %s failed: %s; the journal stays for recovery", entry.group, exc)
            return
        self.journal.done(entry.group)

    # -- recovery ------------------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Finish or roll back every operation a crash left half done. Returns what it did, for logs."""
        report = []
        self.journal.clean_leftovers()
        for entry in self.journal.pending():
            with self.journal.locked(entry.group):
                report.extend(self._recover_group(entry.group))
        return report

    def _in_use(self, entry: JournalEntry, functions: Sequence[PciFunction]) -> DeviceInUse | None:
        """Why finishing ``entry`` would bind a function in use: those still on a host driver
        get the bind's in-use check. None when nothing is on a host driver or all are free."""
        on_host = [fn for fn in functions if fn.driver not in (None, VFIO_DRIVER)]
        if not on_host:
            return None
        if self.check_in_use is None:
            return DeviceInUse(on_host[0].address, f"still on {on_host[0].driver}, and no in-use check was given")
        try:
            self.check_in_use(entry.resource, on_host)
        except DeviceInUse as exc:
            return exc
        return None

    def _recover_group(self, group: str) -> list[str]:
        report = []
        for entry in self.journal.pending(group):
            what = f"{entry.op.value} of IOMMU group {entry.group} interrupted at {entry.step.value} of {entry.function}"
            found = {p.address: fn for p in entry.functions if (fn := self.sysfs.read_function(p.address)) is not None}
            present = [p for p in entry.functions if p.address in found]
            if entry.op is Op.RESTORE:
                self._restore_steps(entry, present, known=[self.journal.bound(p.address) is not None for p in present])
                report.append(f"{what}: finished the restore")
            elif all(found[p.address].driver == p.original_driver for p in present):
                # Nothing was taken off its driver yet: undo the override and the records.
                for p in present:
                    if self.sysfs.read_driver_override(p.address) == VFIO_DRIVER and p.original_driver != VFIO_DRIVER:
                        self._write(
                            p.address, self.sysfs.function_dir(p.address) / "driver_override", "\n", "clearing driver_override"
                        )
                    self.journal.forget_bound(p.address)
                report.append(f"{what}: rolled back (no function had left its driver)")
            elif (busy := self._in_use(entry, [found[p.address] for p in present])) is not None:
                # Finishing would take a function the host is using off its driver: put the
                # group back as it was instead, journaled as a restore so a crash here finishes it.
                self._restore_steps(evolve(entry, op=Op.RESTORE), present, known=[True] * len(present))
                report.append(f"{what}: rolled back rather than bind {busy.device}: {busy.reason}")
            else:
                self._bind_steps(entry, present)
                if present:
                    self._verify_node(present[0].address)
                report.append(f"{what}: finished the bind")
            self.journal.done(group)
            log.warning("recovered %s", report[-1])
        return report
