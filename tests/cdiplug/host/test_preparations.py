"""The host's Preparations (cdiplug.host.preparations): what a preparation returns, what is
remembered and forgotten, and release through the backend's Unpreparer under the group's lock.

In-test backends record their calls; no I/O. The allocator tests cover concurrency through the
device-plugin path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs
import pytest

from cdiplug.errors import PreparationError
from cdiplug.host import Preparations
from cdiplug.models.devices import ContainerEdits, Device, DeviceNode, DeviceSnapshot

R = "example.com/nic"


def dev(i: int, group: str | None = None, driver: str = "iavf") -> Device:
    return Device(f"d{i}", prepare_group=group, attributes={"driver": driver}, edits=ContainerEdits(env={"D": str(i)}))


class Binder:
    """Prepares by "binding": the device comes back with another driver and a new node."""

    def __init__(self) -> None:
        self.prepared: list[tuple[str, ...]] = []
        self.unprepared: list[tuple[str, ...]] = []
        self.holding: set[str] = set()
        self.overlap = False
        self.wrong = False

    async def prepare(self, resource: str, devices: Sequence[Device]) -> Sequence[Device]:
        self.prepared.append(tuple(d.id for d in devices))
        if self.wrong:
            return devices[:-1]
        return [
            attrs.evolve(
                d, attributes={"driver": "vfio-pci"}, edits=ContainerEdits(device_nodes=[DeviceNode(f"/dev/vfio/{d.id}")])
            )
            for d in devices
        ]

    def release_interval(self, resource: str) -> float | None:
        return 1.0

    async def releasable(self, resource: str) -> Sequence[str]:
        return []

    async def unprepare(self, resource: str, device_ids: Sequence[str]) -> None:
        group = device_ids[0]
        self.overlap |= bool(self.holding)
        self.holding.add(group)
        await asyncio.sleep(0.001)
        self.holding.discard(group)
        self.unprepared.append(tuple(device_ids))


async def test_the_devices_come_back_as_prepared_and_are_remembered() -> None:
    binder = Binder()
    preps = Preparations("pci", binder, binder)
    first = await preps.prepare(R, [dev(0), dev(1)])
    assert [d.attribute("driver") for d in first] == ["vfio-pci", "vfio-pci"]
    assert [d.edits.device_nodes[0].path for d in first] == ["/dev/vfio/d0", "/dev/vfio/d1"]
    # Asked again with the values as they were, or as the backend now reports them: no new call.
    assert await preps.prepare(R, [dev(0)]) == first[:1]
    assert await preps.prepare(R, [first[1]]) == first[1:]
    assert binder.prepared == [("d0",), ("d1",)]
    assert preps.prepared_ids(R) == {"d0", "d1"}


async def test_a_changed_or_vanished_device_is_forgotten() -> None:
    binder = Binder()
    preps = Preparations("pci", binder, binder)
    done = await preps.prepare(R, [dev(0), dev(1), dev(2)])
    # The backend reports d0 as prepared (kept), d1 back on its host driver (forgotten), d2 gone.
    preps.on_snapshot(DeviceSnapshot(R, [done[0], dev(1, driver="ixgbevf")]))
    assert preps.prepared_ids(R) == {"d0"}


async def test_a_backend_returning_other_devices_fails_the_preparation() -> None:
    binder = Binder()
    binder.wrong = True
    preps = Preparations("pci", binder, binder)
    with pytest.raises(PreparationError, match="returned other devices"):
        await preps.prepare(R, [dev(0, group="7"), dev(1, group="7")])
    assert preps.prepared_ids(R) == frozenset()


async def test_release_forgets_and_unprepares_one_group_at_a_time() -> None:
    binder = Binder()
    preps = Preparations("pci", binder, binder)
    await preps.prepare(R, [dev(0, "g1"), dev(1, "g1"), dev(2, "g2")])
    await asyncio.gather(preps.release(R, [dev(0, "g1"), dev(1, "g1")]), preps.release(R, [dev(2, "g2")]))
    assert sorted(binder.unprepared) == [("d0", "d1"), ("d2",)]
    assert preps.prepared_ids(R) == frozenset()
    await preps.prepare(R, [dev(0, "g1")])
    assert binder.prepared[-1] == ("d0",)  # prepared again after the release


async def test_without_abilities_prepare_and_release_change_nothing() -> None:
    preps = Preparations("fake", None, None)
    devices = (dev(0), dev(1))
    assert await preps.prepare(R, devices) == devices
    await preps.release(R, devices)
    assert not preps.needed
