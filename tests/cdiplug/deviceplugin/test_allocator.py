"""The allocator (cdiplug.deviceplugin.allocator): validation, preparation, CDI, answers, preferred, pre-start.

Runs with the host's real Preparations and SpecKeeper over the real CDI SpecWriter in a temporary
folder, the real Metrics on a private registry, and small in-test backends that record what they
are asked (preparers gated by asyncio events to force concurrency). No gRPC here: the server
tests cover the edge.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from cdiplug.backend import Abilities, abilities_of
from cdiplug.cdi.writer import SpecWriter
from cdiplug.deviceplugin.allocator import Allocator
from cdiplug.deviceplugin.settings import DevicePluginSettings
from cdiplug.errors import CdiError, InvalidRequest, PreparationError
from cdiplug.host import Preparations, SpecKeeper
from cdiplug.models.devices import (
    AllocatePart,
    ContainerEdits,
    Device,
    DeviceNode,
    DeviceSnapshot,
    Health,
    Mount,
    PreferredRequest,
)
from cdiplug.models.resource import ResourceConfig
from cdiplug.telemetry.metrics import Metrics
from cdiplug.telemetry.recorder import NULL_RECORDER

RESOURCE = "example.com/fpga"
ALL_PARTS = frozenset(AllocatePart)


def resource(allocate=ALL_PARTS, replicas=1, cdi_kind="") -> ResourceConfig:
    settings = DevicePluginSettings(allocate=allocate, replicas=replicas)
    return ResourceConfig(name=RESOURCE, backend="test", options=None, cdi_kind=cdi_kind, settings=settings)


def device(i: int, **kw) -> Device:
    kw.setdefault("edits", ContainerEdits(env={f"DEV_{i}": f"d{i}"}, device_nodes=[DeviceNode(f"/dev/fake{i}")]))
    return Device(f"d{i}", **kw)


def snapshot(devices: Sequence[Device] | None = None, **kw) -> DeviceSnapshot:
    devices = [device(i) for i in range(4)] if devices is None else devices
    return DeviceSnapshot(RESOURCE, devices, **kw)


class RecordingPreparer:
    """Prepares by recording; ``gate`` holds every call until set; ``fail`` maps device ID -> error."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()
        self.in_flight: set[str | None] = set()
        self.overlap = False
        self.fail: dict[str, BaseException] = {}
        self.finished: list[tuple[str, ...]] = []

    async def prepare(self, resource: str, devices: Sequence[Device]) -> Sequence[Device]:
        group = devices[0].prepare_group or devices[0].id
        assert all((d.prepare_group or d.id) == group for d in devices)
        self.overlap |= group in self.in_flight
        self.in_flight.add(group)
        self.calls.append((resource, tuple(d.id for d in devices)))
        self.started.set()
        try:
            await self.gate.wait()
            await asyncio.sleep(0)
            for d in devices:
                if d.id in self.fail:
                    raise self.fail[d.id]
            self.finished.append(tuple(d.id for d in devices))
            return devices
        finally:
            self.in_flight.discard(group)

    def prepared_ids(self) -> list[str]:
        return sorted(i for _, ids in self.calls for i in ids)


def allocator(backend=None, **kw) -> Allocator:
    """An allocator as the front end builds it; ``update`` also shows the snapshot to the
    preparations, as the host does for every snapshot."""
    abilities = abilities_of(backend) if backend is not None else Abilities()
    cdi = kw.pop("cdi", None)
    recorder = kw.pop("metrics", None) or NULL_RECORDER
    rc = resource(**kw)
    preparations = Preparations("test", abilities.preparer, abilities.unpreparer, recorder)
    spec = SpecKeeper(cdi, rc.cdi_kind) if cdi is not None else None
    a = Allocator(rc, abilities, preparations, spec, recorder)
    update = a.update

    def update_as_the_host_does(snap: DeviceSnapshot) -> None:
        preparations.on_snapshot(snap)
        update(snap)

    a.update = update_as_the_host_does  # type: ignore[method-assign]
    return a


# -- validation --------------------------------------------------------------------------------


async def test_validation_names_the_request_and_the_ids():
    a = allocator()
    a.update(snapshot())
    with pytest.raises(InvalidRequest, match=r"container request 1 asks for no devices"):
        await a.allocate([["d0"], []])
    with pytest.raises(InvalidRequest, match=r"Allocate names no container requests"):
        await a.allocate([])
    with pytest.raises(InvalidRequest, match=r"container request 0: unknown device IDs 'x', 'y'$"):
        await a.allocate([["d0", "x", "y", "x"]])
    with pytest.raises(InvalidRequest, match=r"container request 2: device IDs listed more than once: 'd1', 'd2'$"):
        await a.allocate([["d0"], ["d1"], ["d1", "d2", "d1", "d2", "d2"]])
    with pytest.raises(InvalidRequest, match=RESOURCE):
        await a.allocate([["nope"]])


async def test_nothing_is_known_before_the_first_snapshot():
    a = allocator()
    assert a.advertised.devices == ()
    with pytest.raises(InvalidRequest, match="unknown device IDs 'd0'"):
        await a.allocate([["d0"]])


async def test_snapshot_of_another_resource_is_refused():
    with pytest.raises(ValueError, match="example.com/other"):
        allocator().update(DeviceSnapshot("example.com/other"))


async def test_unhealthy_device_is_allocated_with_a_warning(caplog):
    a = allocator(allocate=frozenset({AllocatePart.ENVVAR}))
    a.update(snapshot([device(0, health=Health.UNHEALTHY), device(1)]))
    with caplog.at_level(logging.WARNING, logger="cdiplug.deviceplugin.allocator"):
        [answer] = await a.allocate([["d0", "d1"]])
    assert answer.device_ids == ("d0", "d1")
    [record] = caplog.records
    assert "d0" in record.getMessage() and "Unhealthy" in record.getMessage()
    assert (record.resource, record.device) == (RESOURCE, "d0")


async def test_a_repeated_request_is_checked_again_where_it_matters(caplog):
    # The answer for a request of healthy devices, once checked, is one lookup the next time; an
    # unhealthy device is warned about every time, and other requests are checked as ever.
    a = allocator(allocate=frozenset({AllocatePart.ENVVAR}))
    a.update(snapshot([device(0, health=Health.UNHEALTHY), device(1), device(2)]))
    with caplog.at_level(logging.WARNING, logger="cdiplug.deviceplugin.allocator"):
        for _ in range(3):
            await a.allocate([["d1"]])
            await a.allocate([["d0"]])
    assert [r.device for r in caplog.records] == ["d0", "d0", "d0"]
    for bad in (["d1", "d1"], ["d9"], []):
        with pytest.raises(InvalidRequest):
            await a.allocate([bad])
    with pytest.raises(InvalidRequest):  # the same device in two containers of one pod
        await a.allocate([["d1"], ["d1"]])


# -- the answer --------------------------------------------------------------------------------


def rich_snapshot() -> DeviceSnapshot:
    shared = Mount("/opt/lib", "/usr/lib/fake", read_only=True)
    return snapshot(
        [
            Device(
                "d0",
                edits=ContainerEdits(
                    env={"ONE": "0", "SHARED": "from-d0"},
                    device_nodes=[DeviceNode("/dev/fake0"), DeviceNode("/dev/common")],
                    mounts=[shared, Mount("/var/d0", "/data/d0")],
                ),
            ),
            Device(
                "d1",
                edits=ContainerEdits(
                    env={"TWO": "1", "SHARED": "from-d1"},
                    device_nodes=[DeviceNode("/dev/fake1", host_path="/dev/real1")],
                    mounts=[shared],
                ),
            ),
            Device("bad/id", edits=ContainerEdits(env={"B": "1"})),
        ],
        common_edits=ContainerEdits(
            env={"COMMON": "yes"}, device_nodes=[DeviceNode("/dev/common")], mounts=[Mount("/etc/x", "/etc/x")]
        ),
        ids_env="FAKE_FPGA_DEVICES",
    )


async def test_answer_carries_every_part_in_request_order(world):
    a = allocator(cdi=SpecWriter(world.cdi_dir), cdi_kind="example.com/fpga")
    a.update(rich_snapshot())
    [first, second] = await a.allocate([["d1", "d0"], ["bad/id"]])
    assert first.device_ids == ("d1", "d0")
    assert dict(first.env) == {"COMMON": "yes", "TWO": "1", "SHARED": "from-d0", "ONE": "0", "FAKE_FPGA_DEVICES": "d1,d0"}
    assert [n.path for n in first.device_specs] == ["/dev/common", "/dev/fake1", "/dev/fake0"]
    assert first.device_specs[1].host_path == "/dev/real1"
    assert [m.container_path for m in first.mounts] == ["/etc/x", "/usr/lib/fake", "/data/d0"]
    assert first.cdi_devices == ("example.com/fpga=d1", "example.com/fpga=d0")
    [(key, value)] = first.annotations
    assert key.startswith("cdi.k8s.io/cdiplug_") and len(key.split("/", 1)[1]) <= 63
    assert value == "example.com/fpga=d1,example.com/fpga=d0"
    # A device ID that is no valid CDI name is mapped as the spec names it.
    [name] = second.cdi_devices
    assert name.startswith("example.com/fpga=bad_id-")
    spec = json.loads(SpecWriter(world.cdi_dir).path_for("example.com/fpga").read_text())
    assert name.partition("=")[2] in {d["name"] for d in spec["devices"]}
    assert dict(second.annotations).keys() != dict(first.annotations).keys()


async def test_parts_left_out_are_empty():
    a = allocator(allocate=frozenset({AllocatePart.DEVICE_SPECS}))
    a.update(rich_snapshot())
    [answer] = await a.allocate([["d0"]])
    assert answer.env == answer.mounts == answer.cdi_devices == answer.annotations == ()
    assert [n.path for n in answer.device_specs] == ["/dev/common", "/dev/fake0"]
    a = allocator(allocate=frozenset({AllocatePart.ENVVAR, AllocatePart.MOUNTS}))
    a.update(rich_snapshot())
    [answer] = await a.allocate([["d0"]])
    assert answer.device_specs == answer.cdi_devices == ()
    assert dict(answer.env)["FAKE_FPGA_DEVICES"] == "d0" and len(answer.mounts) == 3


async def test_repeated_allocate_answers_the_same(world):
    backend = RecordingPreparer()
    a = allocator(backend, cdi=SpecWriter(world.cdi_dir))
    a.update(rich_snapshot())
    first = await a.allocate([["d0", "d1"], ["bad/id"]])
    assert await a.allocate([["d0", "d1"], ["bad/id"]]) == first
    assert backend.prepared_ids() == ["bad/id", "d0", "d1"]


# -- replicas -----------------------------------------------------------------------------------


async def test_replicas_map_to_their_device(world):
    backend = RecordingPreparer()
    a = allocator(backend, replicas=2, cdi=SpecWriter(world.cdi_dir))
    a.update(snapshot([device(0), device(1)], ids_env="IDS"))
    assert a.advertised.ids == ("d0::0", "d0::1", "d1::0", "d1::1")
    assert a.snapshot.ids == ("d0", "d1")
    [answer] = await a.allocate([["d1::1", "d0::0", "d1::0"]])
    assert answer.device_ids == ("d1::1", "d0::0", "d1::0")
    assert dict(answer.env)["IDS"] == "d1,d0"
    assert answer.cdi_devices == ("example.com/fpga=d1", "example.com/fpga=d0")
    assert [n.path for n in answer.device_specs] == ["/dev/fake1", "/dev/fake0"]
    assert backend.prepared_ids() == ["d0", "d1"]
    with pytest.raises(InvalidRequest, match="'d0::2', 'd0'"):
        await a.allocate([["d0::2", "d0"]])
    # The spec on disk names the real devices, not the replicas.
    spec = json.loads(SpecWriter(world.cdi_dir).path_for(RESOURCE).read_text())
    assert sorted(d["name"] for d in spec["devices"]) == ["d0", "d1"]


# -- preparation --------------------------------------------------------------------------------


async def test_preparation_is_serialized_and_done_once_under_64_concurrent_calls():
    backend = RecordingPreparer()
    backend.gate.clear()
    devices = [device(i, prepare_group="g01" if i < 2 else "g23" if i < 4 else None) for i in range(8)]
    a = allocator(backend)
    a.update(snapshot(devices))
    rng = random.Random(1)
    requests = [[[f"d{i}" for i in sorted(rng.sample(range(8), rng.randint(1, 4)))]] for _ in range(64)]
    calls = [asyncio.create_task(a.allocate(r)) for r in requests]
    await asyncio.wait_for(backend.started.wait(), 5)
    for _ in range(5):  # a few loop turns: every call reaches its shield, its task the lock
        await asyncio.sleep(0)
    backend.gate.set()
    answers = await asyncio.wait_for(asyncio.gather(*calls), 10)
    assert [ans[0].device_ids for ans in answers] == [tuple(r[0]) for r in requests]
    assert not backend.overlap
    assert backend.prepared_ids() == [f"d{i}" for i in range(8)]  # each device exactly once
    for _, ids in backend.calls:  # groups stay together
        assert len({devices[int(i[1:])].prepare_group or i for i in ids}) == 1
    # All prepared: no more calls, and nothing awaits a thread or a lock.
    before = len(backend.calls)
    await asyncio.gather(*(a.allocate(r) for r in requests))
    assert len(backend.calls) == before


async def test_changed_or_returning_devices_are_prepared_again():
    backend = RecordingPreparer()
    a = allocator(backend)
    a.update(snapshot([device(0), device(1)]))
    await a.allocate([["d0", "d1"]])
    a.update(snapshot([device(0), device(1)]))  # equal values, new objects: still prepared
    await a.allocate([["d0", "d1"]])
    assert backend.prepared_ids() == ["d0", "d1"]
    a.update(snapshot([device(0, attributes={"driver": "vfio-pci"}), device(1)]))
    await a.allocate([["d0", "d1"]])
    assert backend.calls[-1] == (RESOURCE, ("d0",))
    a.update(snapshot([device(0, attributes={"driver": "vfio-pci"})]))  # d1 went away
    a.update(snapshot([device(0, attributes={"driver": "vfio-pci"}), device(1)]))  # and came back
    await a.allocate([["d1"], ["d0"]])
    assert backend.calls[-1] == (RESOURCE, ("d1",))
    assert len(backend.calls) == 4


async def test_preparation_failure_propagates_counts_and_is_retried():
    metrics = Metrics(CollectorRegistry())
    backend = RecordingPreparer()
    backend.fail["d1"] = PreparationError("d1", "driver refused")
    a = allocator(backend, metrics=metrics)
    a.update(snapshot())
    with pytest.raises(PreparationError, match="cannot prepare device d1: driver refused"):
        await a.allocate([["d0", "d1", "d2"]])
    value = metrics.registry.get_sample_value
    assert value("cdiplug_preparation_failures_total", {"resource": RESOURCE}) == 1
    assert value("cdiplug_allocations_total", {"resource": RESOURCE, "result": "error"}) == 1
    # d0 (its own group, sorted first) was prepared and stays so; d2 was never reached.
    assert backend.finished == [("d0",)]
    del backend.fail["d1"]
    await a.allocate([["d0", "d1", "d2"]])
    assert backend.calls[-2:] == [(RESOURCE, ("d1",)), (RESOURCE, ("d2",))]
    assert value("cdiplug_allocations_total", {"resource": RESOURCE, "result": "ok"}) == 1


async def test_unexpected_preparer_errors_become_preparation_errors():
    backend = RecordingPreparer()
    backend.fail["d0"] = OSError(16, "Device or resource busy")
    a = allocator(backend)
    a.update(snapshot())
    with pytest.raises(PreparationError, match="cannot prepare device d0: OSError: .*busy") as info:
        await a.allocate([["d0"]])
    assert isinstance(info.value.__cause__, OSError)


async def test_a_cancelled_allocate_lets_its_preparation_finish():
    backend = RecordingPreparer()
    backend.gate.clear()
    a = allocator(backend)
    a.update(snapshot())
    call = asyncio.create_task(a.allocate([["d0"]]))
    await asyncio.wait_for(backend.started.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    second = asyncio.create_task(a.allocate([["d0"]]))  # waits for the running preparation
    await asyncio.sleep(0)
    assert not second.done()
    backend.gate.set()
    await asyncio.wait_for(second, 5)
    assert backend.calls == [(RESOURCE, ("d0",))] and backend.finished == [("d0",)]


async def test_group_locks_are_forgotten_once_nobody_holds_them():
    backend = RecordingPreparer()
    backend.gate.clear()
    a = allocator(backend)
    a.update(snapshot([device(i, prepare_group=f"g{i}") for i in range(4)]))
    call = asyncio.create_task(a.allocate([["d0", "d1", "d2", "d3"]]))
    await asyncio.wait_for(backend.started.wait(), 5)
    assert len(a.preparations._locks) == 1  # one group at a time
    backend.gate.set()
    await call
    assert len(a.preparations._locks) == 0


# -- CDI ------------------------------------------------------------------------------------------


class CountingWriter(SpecWriter):
    def __init__(self, cdi_dir: Path, error: CdiError | None = None) -> None:
        super().__init__(cdi_dir)
        self.writes = 0
        self.error = error

    def write(self, kind: str, snapshot: DeviceSnapshot) -> bool:
        self.writes += 1
        if self.error is not None:
            raise self.error
        return super().write(kind, snapshot)


async def test_cdi_spec_is_written_when_needed_only(world):
    writer = CountingWriter(world.cdi_dir)
    a = allocator(cdi=writer, allocate=frozenset({AllocatePart.CDI_CRI}))
    a.update(snapshot())
    path = writer.path_for(RESOURCE)
    await a.allocate([["d0"]])
    assert writer.writes == 1 and path.exists()
    await asyncio.gather(*(a.allocate([["d1"]]) for _ in range(10)))
    assert writer.writes == 1
    path.unlink()  # someone cleaned the folder: written again
    await a.allocate([["d0"]])
    assert writer.writes == 2 and path.exists()
    a.update(snapshot([device(0), device(9)]))
    await a.allocate([["d9"]])
    assert writer.writes == 3
    assert sorted(d["name"] for d in json.loads(path.read_text())["devices"]) == ["d0", "d9"]


async def test_cdi_annotations_alone_also_write_the_spec(world):
    writer = CountingWriter(world.cdi_dir)
    a = allocator(cdi=writer, allocate=frozenset({AllocatePart.CDI_ANNOTATIONS}))
    a.update(snapshot())
    [answer] = await a.allocate([["d0"]])
    assert writer.writes == 1 and answer.cdi_devices == () and len(answer.annotations) == 1


async def test_no_cdi_parts_no_spec(world):
    writer = CountingWriter(world.cdi_dir)
    a = allocator(cdi=writer, allocate=frozenset({AllocatePart.ENVVAR, AllocatePart.DEVICE_SPECS}))
    a.update(snapshot())
    await a.allocate([["d0"]])
    assert writer.writes == 0 and not writer.path_for(RESOURCE).exists()


async def test_cdi_error_propagates(world):
    metrics = Metrics(CollectorRegistry())
    writer = CountingWriter(world.cdi_dir, error=CdiError("disk full"))
    a = allocator(cdi=writer, metrics=metrics)
    a.update(snapshot())
    with pytest.raises(CdiError, match="disk full"):
        await a.allocate([["d0"]])
    assert metrics.registry.get_sample_value("cdiplug_allocations_total", {"resource": RESOURCE, "result": "error"}) == 1


# -- preferred and pre-start ---------------------------------------------------------------------


class OwnChoice:
    def __init__(self, answer):
        self.answer = answer
        self.seen: list[tuple[str, DeviceSnapshot, PreferredRequest]] = []

    def preferred_allocation(self, resource, snapshot, request):
        self.seen.append((resource, snapshot, request))
        return self.answer


async def test_backend_choice_wins_unless_it_declines():
    request = PreferredRequest(["d0", "d1", "d2"], [], 1)
    backend = OwnChoice(["d2"])
    a = allocator(backend, replicas=1)
    a.update(snapshot())
    assert a.preferred([request]) == [("d2",)]
    assert backend.seen == [(RESOURCE, a.advertised, request)]
    backend.answer = None
    assert a.preferred([request, PreferredRequest(["d3", "d2"], ["d3"], 2)]) == [("d0",), ("d3", "d2")]


class Pairs:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def affinity(self, resource: str, a: Device, b: Device) -> float:
        assert resource == RESOURCE and isinstance(a, Device)
        self.calls.append((a.id, b.id))
        return 1.0 if {a.id, b.id} == {"d1", "d3"} else 0.0


async def test_core_policy_uses_affinity_numa_and_replica_spread():
    backend = Pairs()
    a = allocator(backend, replicas=3)
    a.update(snapshot([device(i, numa_nodes=(0,)) for i in range(4)]))
    assert a.preferred([PreferredRequest(a.advertised.ids, [], 2)]) == [("d1::0", "d3::0")]
    assert {c for c in backend.calls} <= {(x, y) for x in ("d0", "d1", "d2", "d3") for y in ("d0", "d1", "d2", "d3") if x < y}
    plain = allocator(replicas=3)
    plain.update(snapshot([device(i) for i in range(2)]))
    assert plain.preferred([PreferredRequest(plain.advertised.ids, [], 2)]) == [("d0::0", "d1::0")]


async def test_a_repeated_allocate_answers_the_same_object_until_the_snapshot_changes():
    a = Allocator(resource(), Abilities())
    first = snapshot()
    a.update(first)
    [one] = await a.allocate([["d1", "d2"]])
    [again] = await a.allocate([["d1", "d2"]])
    assert again is one
    [other_order] = await a.allocate([["d2", "d1"]])
    assert other_order != one and other_order.device_ids == ("d2", "d1")
    changed = first.with_devices([*first.devices[:2], device(2, edits=ContainerEdits(env={"NEW": "1"})), first.devices[3]])
    a.update(changed)
    [after] = await a.allocate([["d1", "d2"]])
    assert after != one and ("NEW", "1") in after.env


async def test_the_answer_cache_is_bounded():
    # Memory stays flat under any load: past MAX_CACHED_ANSWERS distinct requests the cache starts
    # afresh, and every answer is still right.
    from cdiplug.deviceplugin.allocator import MAX_CACHED_ANSWERS

    devices = [device(i) for i in range(40)]
    a = Allocator(resource(), Abilities())
    a.update(snapshot(devices))
    requests = [[f"d{i}", f"d{j}"] for i in range(40) for j in range(40) if i != j][: MAX_CACHED_ANSWERS + 50]
    for ids in requests:
        [answer] = await a.allocate([ids])
        assert answer.device_ids == tuple(ids)
        assert len(a._answers) <= MAX_CACHED_ANSWERS
    assert len(a._answers) == 50
