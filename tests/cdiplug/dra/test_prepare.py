"""Claims prepared and unprepared through the backend host (cdiplug.dra.prepare.ClaimPreparer).

A recording backend with a Preparer (which changes the device, as a VFIO bind adds its device
node) and an Unpreparer stands behind a real BackendHost; the API is a small stub at the client
seam. Covers: the spec holds the device as prepared; preparation runs once for a repeated
prepare; the checkpoint answers after a "restart" (a new preparer on the same state folder);
unprepare releases through the Unpreparer, but not a device another claim still holds; a claim
on a device the node lacks is an error that prepares nothing; a prepare the kubelet sends before
the backend's first snapshot waits for it (and is an error only when none comes in time).
Two phases: PrepareStarted (naming the devices) is on disk before the backend is called;
a preparation that fails is rolled back (released, no spec, no record); a claim left started
(cancelled after the backend prepared, as a crash would leave it) is released by unprepare,
prepared afresh by a repeated prepare, and rolled back at start by roll_back_started, unless
the other instance of a rolling update that started it still runs (its instance lock);
prepare and unprepare are recorded per driver (count, latency, result). Restore at start: a
wiped CDI folder gets the claim's spec back as prepared; a claim from an earlier boot ID is
prepared again through the host, its spec rewritten and its boot ID updated, before a prepare is
answered, and still released by unprepare; a missing spec is never answered before the devices
are known.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

from cdiplug.dra.checkpoint import ClaimState, ClaimStore, PreparedClaim, PreparedDevice
from cdiplug.dra.claims import ClaimRef
from cdiplug.dra.instances import InstanceLock
from cdiplug.dra.prepare import ClaimPreparer, NodeContext
from cdiplug.dra.rollback import roll_back_started
from cdiplug.errors import DeviceUnavailable, KubernetesError, PreparationError
from cdiplug.host import BackendHost
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot
from cdiplug.models.world import World
from cdiplug.testing.dra_claims import ClaimsAtSeam, RecordingBackend
from cdiplug.toolkit.supervisor import Supervisor

RESOURCE = "example.com/nic"
DRIVER = "nic.example.com"


class Recording(RecordingBackend):
    def snapshot(self) -> DeviceSnapshot:
        devices = [Device(f"nic-{i}", edits=ContainerEdits(env={"NIC": str(i)}), prepare_group=f"g{i}") for i in range(3)]
        return DeviceSnapshot(RESOURCE, devices, ids_env="NIC_IDS")


PLUGIN = Recording.plugin()
RC = Recording.dra_resource(RESOURCE, DRIVER)


class Claims(ClaimsAtSeam):
    def __init__(self) -> None:
        super().__init__(DRIVER, "n1")


class Observed:
    """A recorder of prepare/unprepare observations (the Recorder protocol's DRA part)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, bool]] = []
        self.prepared_now: list[int] = []  # cdiplug_dra_claims_prepared, as set after each call

    def prepare_observed(self, resource: str, driver: str, seconds: float, ok: bool) -> None:
        assert seconds >= 0
        self.calls.append(("prepare", resource, driver, ok))

    def unprepare_observed(self, resource: str, driver: str, seconds: float, ok: bool) -> None:
        self.calls.append(("unprepare", resource, driver, ok))

    def claims_prepared(self, resource: str, driver: str, count: int) -> None:
        assert (resource, driver) == (RESOURCE, DRIVER)
        self.prepared_now.append(count)


def preparer(host: BackendHost, world: World, claims: Claims, store: ClaimStore, recorder: Any = None) -> ClaimPreparer:
    extra = {"recorder": recorder} if recorder is not None else {}
    return ClaimPreparer(RC, NodeContext("n1"), host, store, lambda: claims, **extra)  # type: ignore[arg-type, return-value]


UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"
POD_A = "aaaaaaaa-1111-4000-8000-000000000001"
POD_B = "bbbbbbbb-1111-4000-8000-000000000002"


async def test_prepare_release_and_restart(host: BackendHost, world: World, store: ClaimStore) -> None:
    claims = Claims()
    prep = preparer(host, world, claims, store)
    backend: Recording = Recording.last
    a = claims.add(UID_A, ["nic-0", "nic-1"])
    b = claims.add(UID_B, ["nic-1"])  # a device two claims hold (admin access, say)
    done = await prep.prepare(a)
    assert [d.cdi_ids for d in done.devices] == [(f"k8s.{DRIVER}/claim={UID_A}-nic-0",), (f"k8s.{DRIVER}/claim={UID_A}-nic-1",)]
    spec = json.loads((world.cdi_dir / f"cdiplug-claim-{UID_A}.json").read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nic-0", "permissions": "rw"}]  # as prepared
    assert spec["containerEdits"]["env"] == ["NIC_IDS=nic-0,nic-1"]
    assert await prep.prepare(a) == done
    assert backend.prepared == [["nic-0"], ["nic-1"]]  # one group at a time, each once
    await prep.prepare(b)

    # A restarted daemon: a new store and preparer on the same folder; no API read, no preparation.
    store2 = ClaimStore(world.state_dir)
    await store2.load()
    prep2 = preparer(host, world, claims, store2)
    reads = claims.reads
    assert await prep2.prepare(a) == done and claims.reads == reads
    await prep2.unprepare(a)
    assert backend.released == [["nic-0"]]  # nic-1 is still held by claim B
    assert not (world.cdi_dir / f"cdiplug-claim-{UID_A}.json").exists()
    await prep2.unprepare(b)
    assert backend.released == [["nic-0"], ["nic-1"]]
    await prep2.unprepare(a)  # already gone: nothing more
    assert store2.all() == []


async def test_claims_that_cannot_be_prepared(host: BackendHost, world: World) -> None:
    claims = Claims()
    store = ClaimStore(world.state_dir)
    prep = preparer(host, world, claims, store)
    with pytest.raises(DeviceUnavailable, match="nic-9"):
        await prep.prepare(claims.add(UID_A, ["nic-0", "nic-9"]))
    with pytest.raises(KubernetesError):
        await prep.prepare(ClaimRef("ns", "missing", UID_B))
    assert Recording.last.prepared == [] and store.all() == []
    assert not list(world.cdi_dir.iterdir())


def on_disk(world: World) -> dict[str, Any]:
    return json.loads((world.state_dir / "dra-claims.json").read_text())["claims"]


async def test_prepare_started_is_on_disk_before_the_backend_is_called(
    host: BackendHost, world: World, store: ClaimStore
) -> None:
    claims = Claims()
    observed = Observed()
    prep = preparer(host, world, claims, store, observed)
    backend: Recording = Recording.last
    seen: list[dict[str, Any]] = []

    async def look(devices: Sequence[Device]) -> None:
        seen.append(on_disk(world)[UID_A])

    backend.hook = look
    await prep.prepare(claims.add(UID_A, ["nic-0", "nic-2"]))
    assert [s["state"] for s in seen] == ["PrepareStarted", "PrepareStarted"]  # before each group
    assert [d["device_id"] for d in seen[0]["devices"]] == ["nic-0", "nic-2"]  # every device it will touch
    assert on_disk(world)[UID_A]["state"] == "PrepareCompleted"
    ref_b = claims.add(UID_B, ["nic-1"])
    await prep.prepare(ref_b)
    await prep.prepare(ref_b)  # again: idempotent
    await prep.unprepare(ClaimRef("ns", "c-aaaa", UID_A))
    assert observed.calls[0] == ("prepare", RESOURCE, DRIVER, True)
    assert observed.calls[-1] == ("unprepare", RESOURCE, DRIVER, True)
    # Claims prepared now: A, A and B, still both (a repeated prepare is no new claim), B alone.
    assert observed.prepared_now == [1, 2, 2, 1]


async def test_a_failed_preparation_is_rolled_back(host: BackendHost, world: World, store: ClaimStore) -> None:
    claims = Claims()
    observed = Observed()
    prep = preparer(host, world, claims, store, observed)
    backend: Recording = Recording.last

    async def fail_second(devices: Sequence[Device]) -> None:
        if devices[0].id == "nic-1":
            raise PreparationError("nic-1", "vfio-pci refused it")

    backend.hook = fail_second
    with pytest.raises(PreparationError, match="refused"):
        await prep.prepare(claims.add(UID_A, ["nic-0", "nic-1"]))
    assert backend.prepared == [["nic-0"], ["nic-1"]] and backend.released == [
        ["nic-0"],
        ["nic-1"],
    ]  # all it may have touched, group by group
    assert store.all() == [] and on_disk(world) == {} and not list(world.cdi_dir.iterdir())
    assert observed.calls == [("prepare", RESOURCE, DRIVER, False)]
    assert observed.prepared_now == [0]  # a failed claim is not counted


async def left_started(host: BackendHost, world: World, claims: Claims, store: ClaimStore) -> ClaimRef:
    """A claim the backend prepared whose call ended before PrepareCompleted, as a crash stops it
    (nothing after runs; a cancelled call would be rolled back)."""
    prep = preparer(host, world, claims, store)
    backend: Recording = Recording.last

    class Crash(BaseException):
        pass

    async def crash(devices: Sequence[Device]) -> None:
        raise Crash  # the backend has prepared; the checkpoint says started

    backend.hook = crash
    ref = claims.add(UID_A, ["nic-0"])
    with pytest.raises(Crash):
        await prep.prepare(ref)
    backend.hook = None
    assert [c.state for c in store.all()] == [ClaimState.STARTED]
    return ref


async def test_unprepare_releases_a_claim_left_started(host: BackendHost, world: World, store: ClaimStore) -> None:
    claims = Claims()
    ref = await left_started(host, world, claims, store)
    restarted = ClaimStore(world.state_dir)
    await restarted.load()
    await preparer(host, world, claims, restarted).unprepare(ref)
    assert Recording.last.released == [["nic-0"]] and restarted.all() == [] and on_disk(world) == {}


async def test_a_repeated_prepare_of_a_started_claim_prepares_it_afresh(
    host: BackendHost, world: World, store: ClaimStore
) -> None:
    claims = Claims()
    ref = await left_started(host, world, claims, store)
    done = await preparer(host, world, claims, store).prepare(ref)
    assert done.completed and (world.cdi_dir / f"cdiplug-claim-{UID_A}.json").exists()
    assert on_disk(world)[UID_A]["state"] == "PrepareCompleted"


async def test_at_start_a_claim_left_started_is_rolled_back(host: BackendHost, world: World, store: ClaimStore) -> None:
    claims = Claims()
    await left_started(host, world, claims, store)
    done_b = await preparer(host, world, claims, store).prepare(claims.add(UID_B, ["nic-1"]))
    (world.cdi_dir / f"cdiplug-claim-{UID_A}.json").write_text("{}")  # as if the spec had been written
    restarted = ClaimStore(world.state_dir)
    await restarted.load()
    assert await roll_back_started(restarted, host) == 1
    assert Recording.last.released == [["nic-0"]]
    assert restarted.all() == [done_b] and set(on_disk(world)) == {UID_B}  # the completed claim stays
    assert not (world.cdi_dir / f"cdiplug-claim-{UID_A}.json").exists()
    assert (world.cdi_dir / f"cdiplug-claim-{UID_B}.json").exists()
    assert await roll_back_started(restarted, host) == 0


async def test_at_start_a_claim_the_other_running_instance_is_preparing_is_left_to_it(host: BackendHost, world: World) -> None:
    # A rolling update: the old pod (A) has recorded PrepareStarted and is still at it when the
    # new pod (B) starts; B leaves the claim to A while A's instance lock is held, and rolls it
    # back once A is gone.
    claims = Claims()
    store = ClaimStore(world.state_dir)
    await store.load()
    a = InstanceLock(world.state_dir, POD_A)
    a.acquire()
    prep = ClaimPreparer(RC, NodeContext("n1", instance=POD_A), host, store, lambda: claims)  # type: ignore[arg-type, return-value]
    gate, held = asyncio.Event(), asyncio.Event()

    async def hold(devices: Sequence[Device]) -> None:
        gate.set()
        await held.wait()

    Recording.last.hook = hold
    task = asyncio.create_task(prep.prepare(claims.add(UID_A, ["nic-0"])))
    await gate.wait()
    b = InstanceLock(world.state_dir, POD_B)
    b.acquire()
    started = ClaimStore(world.state_dir)
    await started.load()
    assert [c.owner for c in started.started()] == [POD_A]
    assert await roll_back_started(started, host, b.alive) == 0
    assert Recording.last.released == []
    held.set()
    done = await task  # A finishes what it began
    assert done.completed and done.owner == POD_A
    # Had A died instead (its lock gone with the process), B would have rolled it back.
    await store.put(attrs.evolve(done, state=ClaimState.STARTED))
    a.release()
    await started.load()
    assert await roll_back_started(started, host, b.alive) == 1
    assert Recording.last.released == [["nic-0"]]
    b.release()


def spec_of(world: World, uid: str) -> Any:
    return json.loads((world.cdi_dir / f"cdiplug-claim-{uid}.json").read_text())


async def test_a_wiped_cdi_folder_is_restored_without_preparing_again(host: BackendHost, world: World, store: ClaimStore) -> None:
    claims = Claims()
    prep = ClaimPreparer(RC, NodeContext("n1", boot_id="boot-1"), host, store, lambda: claims)  # type: ignore[arg-type, return-value]
    a = claims.add(UID_A, ["nic-0"])
    await prep.prepare(a)
    before = spec_of(world, UID_A)
    assert store.get(UID_A) is not None and store.get(UID_A).boot_id == "boot-1"  # type: ignore[union-attr]
    # A restart on the same boot, the folder wiped: the old daemon no longer keeps the file.
    assert await host.specs.drop_file(f"cdiplug-claim-{UID_A}.json")

    store2 = ClaimStore(world.state_dir)
    await store2.load()
    prep2 = ClaimPreparer(RC, NodeContext("n1", boot_id="boot-1"), host, store2, lambda: claims)  # type: ignore[arg-type, return-value]
    assert prep2.restore_pending
    snapshot = host.latest(RESOURCE)
    assert snapshot is not None
    assert await prep2.restore(snapshot) == 1
    assert spec_of(world, UID_A) == before  # back, as prepared (the device node the backend added)
    assert not prep2.restore_pending
    assert await prep2.restore(snapshot) == 0  # once


async def test_a_claim_from_an_earlier_boot_is_prepared_again(host: BackendHost, world: World, store: ClaimStore) -> None:
    claims = Claims()
    prep = ClaimPreparer(RC, NodeContext("n1", boot_id="boot-1"), host, store, lambda: claims)  # type: ignore[arg-type, return-value]
    backend: Recording = Recording.last
    a, b = claims.add(UID_A, ["nic-0"]), claims.add(UID_B, ["nic-1"])
    first = await prep.prepare(a)
    await prep.prepare(b)
    assert await host.specs.drop_file(f"cdiplug-claim-{UID_A}.json")  # the tmpfs is gone; B's spec happens to be there

    # After the reboot: a new host would have no memory of preparations; forget ours to be that host.
    host.preparations(RESOURCE)._prepared.clear()
    store2 = ClaimStore(world.state_dir)
    await store2.load()
    prep2 = ClaimPreparer(RC, NodeContext("n1", boot_id="boot-2"), host, store2, lambda: claims)  # type: ignore[arg-type, return-value]
    reads = claims.reads
    assert await prep2.prepare(a) == attrs.evolve(first, boot_id="boot-2")  # the first prepare waits for the restore
    assert claims.reads == reads  # answered from the checkpoint
    assert sorted(backend.prepared[-2:]) == [["nic-0"], ["nic-1"]]  # both prepared again through the host
    assert spec_of(world, UID_A)["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nic-0", "permissions": "rw"}]
    assert {c.uid: c.boot_id for c in store2.all()} == {UID_A: "boot-2", UID_B: "boot-2"}
    await prep2.unprepare(a)  # the record survived the reboot: unprepare still releases
    assert backend.released == [["nic-0"]]


async def test_a_prepare_before_the_first_snapshot_waits_for_it(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor = Supervisor()
    host = BackendHost(world, supervisor, plugins={"rec": PLUGIN})
    host.create([RC])  # not started yet: no snapshot
    store = ClaimStore(world.state_dir)
    await store.load()
    claims = Claims()
    prep = preparer(host, world, claims, store)

    class Driver:  # what the DRA driver does with each snapshot
        def offer(self, snapshot: DeviceSnapshot) -> None:
            prep.devices_known()

    host.attach(RESOURCE, Driver())
    monkeypatch.setattr("cdiplug.dra.prepare.DEVICES_WAIT", 0.05)
    with pytest.raises(DeviceUnavailable, match="no devices known yet"):
        await prep.prepare(claims.add(UID_B, ["nic-2"]))  # no snapshot in time: an error, nothing prepared
    monkeypatch.setattr("cdiplug.dra.prepare.DEVICES_WAIT", 10.0)
    waiting = asyncio.create_task(prep.prepare(claims.add(UID_A, ["nic-0"])))
    await asyncio.sleep(0)
    assert not waiting.done()
    host.start()  # the backend reports: the waiting prepare goes on
    done = await asyncio.wait_for(waiting, 5)
    assert [d.device for d in done.devices] == ["nic-0"] and Recording.last.prepared == [["nic-0"]]
    await host.stop()
    await supervisor.close()


async def test_a_missing_spec_is_never_answered_before_the_devices_are_known(world: World) -> None:
    supervisor = Supervisor()
    host = BackendHost(world, supervisor, plugins={"rec": PLUGIN})
    host.create([RC])  # not started: no snapshot yet
    store = ClaimStore(world.state_dir)
    await store.load()
    record = PreparedClaim(
        UID_A,
        "ns",
        "c",
        DRIVER,
        RESOURCE,
        (PreparedDevice(("nic",), "n1", "nic-0", "nic-0", ("x",)),),
        f"cdiplug-claim-{UID_A}.json",
    )
    await store.put(record)
    prep = ClaimPreparer(RC, NodeContext("n1"), host, store, lambda: Claims())  # type: ignore[arg-type, return-value]
    with pytest.raises(DeviceUnavailable, match="missing"):
        await prep._ensure_spec(record)
    await supervisor.close()


async def test_a_silent_api_server_never_holds_up_the_answer_and_status_writes_keep_their_order(
    host: BackendHost, world: World
) -> None:
    # KEP-4817 status goes to the API server in the background: the kubelet's answer (the CDI IDs)
    # never waits for it, and the clear of an unprepare never overtakes the write before it.
    class Silent(Claims):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[tuple[str, bool]] = []
            self.answer = asyncio.Event()

        async def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any], field_manager: str) -> None:
            await self.answer.wait()  # the server takes its time
            self.writes.append((name, bool(body["status"].get("devices"))))

    claims = Silent()
    store = ClaimStore(world.state_dir)
    await store.load()
    prep = preparer(host, world, claims, store)
    a = claims.add(UID_A, ["nic-0"])
    done = await asyncio.wait_for(prep.prepare(a), 2)
    assert done.devices and claims.writes == []  # answered while the status write still waits
    await asyncio.wait_for(prep.unprepare(a), 2)
    claims.answer.set()
    await asyncio.wait_for(prep.status_settled(), 5)
    assert [written for _, written in claims.writes] == [True, False]  # written, then cleared, in that order
