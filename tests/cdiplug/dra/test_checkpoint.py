"""The checkpoint of DRA claims (cdiplug.dra.checkpoint), version 2 with its two phases.

Covers: the version 1 file written by the code before the two phases (fixtures/dra-claims-v1.json,
made with ``checkpoint.save`` of main at 9f98eb9) is read, upgraded to version 2 on disk and loses
no claim, every one PrepareCompleted; a round trip of both states and the configuration entries;
lenient decoding of our own state (unknown keys ignored, one unusable claim dropped and logged,
the others kept and the file as it was kept aside); a file that is no checkpoint (not JSON, an
unknown version, a symlink, a FIFO, too deep) is moved aside as ``dra-claims.json.corrupt-<time>``
with the reason logged and the store starts empty; the file is 0600; a claim's boot ID is kept,
and read as unknown when absent or not ours; two stores on one file (the old and the new pod of a
rolling update) lose none of each other's claims, a change waits for the other's lock and gives up
after a bounded wait naming the file, and a store read again sees the other's changes; a claim's
owner (the instance that started it) is kept and read leniently; ``locked()`` reads the other's
changes and holds it off for the block; a state folder not made yet is made, 0700. Changes
asked for at once share writes and all land; a failed write fails every change in it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
from pathlib import Path

import attrs
import pytest

from cdiplug.dra import checkpoint, records
from cdiplug.dra.checkpoint import (
    CheckpointFile,
    ClaimState,
    ClaimStore,
    PreparedClaim,
    PreparedDevice,
    load,
    parse,
    render,
)
from cdiplug.dra.claims import ConfigEntry, ConfigSource
from cdiplug.toolkit.statefile import StateFileError

FIXTURE = Path(__file__).with_name("fixtures") / "dra-claims-v1.json"
UID = "0b0c7f6e-1111-2222-3333-444455556666"
V1_UIDS = {
    "aaaaaaaa-0000-0000-0000-000000000001",
    "bbbbbbbb-0000-0000-0000-000000000002",
    "cccccccc-0000-0000-0000-000000000003",
}

PREPARED = PreparedClaim(
    uid=UID,
    namespace="ns",
    name="c",
    driver="d.example.com",
    resource="example.com/d",
    devices=(PreparedDevice(("a",), "n1", "x", "X", ("k8s.d.example.com/claim=u-x",), "group-3"),),
    spec_file=f"cdiplug-claim-{UID}.json",
    state=ClaimState.STARTED,
    configs=(ConfigEntry(ConfigSource.CLASS, (), {"mode": "fast"}), ConfigEntry(ConfigSource.CLAIM, ("a",), {"n": 2})),
)


def test_a_version_1_checkpoint_is_upgraded_and_forgets_no_claim(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "dra-claims.json"
    shutil.copyfile(FIXTURE, path)
    v1 = json.loads(FIXTURE.read_text())
    assert v1["version"] == 1
    with caplog.at_level(logging.INFO):
        claims = load(path)
    assert set(claims) == V1_UIDS
    assert all(c.state is ClaimState.COMPLETED and c.configs == () for c in claims.values())
    a = claims["aaaaaaaa-0000-0000-0000-000000000001"]
    assert [(d.device, d.device_id, d.prepare_group, d.request_names) for d in a.devices] == [
        ("nic-0", "nic-0", "g0", ("nic",)),
        ("nic-1", "nic-1", None, ("nic", "second")),
    ]
    assert a.spec_file == "cdiplug-claim-aaaaaaaa-0000-0000-0000-000000000001.json" and a.driver == "nic.example.com"
    assert claims["cccccccc-0000-0000-0000-000000000003"].devices == ()
    # Written back as version 2, every field of version 1 kept; read again, the same claims.
    v2 = json.loads(path.read_text())
    assert v2["version"] == 2
    for uid, record in v1["claims"].items():
        assert {k: v for k, v in v2["claims"][uid].items() if k in record} == record
        assert v2["claims"][uid]["state"] == "PrepareCompleted"
    assert load(path) == claims
    assert "upgraded DRA checkpoint" in caplog.text and not [n for n in os.listdir(tmp_path) if ".corrupt-" in n]


def test_round_trip_of_both_states_and_configs() -> None:
    completed = PreparedClaim("u2", "ns", "d", "d.example.com", "example.com/d", (), "")
    assert parse(render({UID: PREPARED, "u2": completed})) == {UID: PREPARED, "u2": completed}


# A field an earlier cdiplug did not write, or a value not ours, reads as the field's default and
# keeps the claim: the boot ID unknown, no owner, device metadata that may be there (so an
# unprepare looks for them).
@pytest.mark.parametrize(
    ("field", "kept", "unusable"),
    [
        ("boot_id", "7d3c5e1a-0000-4000-8000-000000000001", ("absent", None, 7, "", "x" * 65)),
        ("owner", "aaaaaaaa-0000-4000-8000-000000000001", ("absent", None, 7, "x" * 65)),
        ("device_metadata", False, ("absent", None, "no")),
    ],
)
def test_a_claims_lenient_fields_are_kept_and_read_leniently(field: str, kept: object, unusable: tuple[object, ...]) -> None:
    claim = attrs.evolve(PREPARED, **{field: kept})
    assert parse(render({UID: claim})) == {UID: claim}
    for stored in unusable:
        data = json.loads(render({UID: claim}))
        if stored == "absent":
            del data["claims"][UID][field]
        else:
            data["claims"][UID][field] = stored
        assert parse(json.dumps(data).encode()) == {UID: PREPARED}
    assert (PREPARED.boot_id, PREPARED.owner, PREPARED.device_metadata) == (None, "", True)


async def test_locked_holds_off_the_other_daemon_and_reads_its_changes(tmp_path: Path) -> None:
    ours, theirs = ClaimStore(tmp_path), ClaimStore(tmp_path)
    await ours.load()
    await theirs.put(PREPARED)  # the other daemon recorded a claim: ours sees it inside the block
    async with ours.locked():
        assert ours.get(UID) == PREPARED
        with pytest.raises(StateFileError, match="stayed locked"):
            await asyncio.to_thread(take_lock, ours.path, 0.05)
    await asyncio.to_thread(take_lock, ours.path, 1)  # free again after the block


def take_lock(path: Path, wait: float) -> None:
    with checkpoint.locked(path, wait):
        pass


async def test_a_state_folder_not_made_yet_is_made_private(tmp_path: Path) -> None:
    # `cdiplug serve --state-dir NEW` (no hostPath DirectoryOrCreate to make it first)
    store = ClaimStore(tmp_path / "new" / "state")
    await store.load()
    await store.put(PREPARED)
    assert (tmp_path / "new" / "state").stat().st_mode & 0o777 == 0o700


async def test_store_survives_a_restart(tmp_path: Path) -> None:
    store = ClaimStore(tmp_path)
    await store.load()
    await store.put(PREPARED)
    again = ClaimStore(tmp_path)
    await again.load()
    assert again.get(UID) == PREPARED and again.started() == [PREPARED]
    await again.remove(UID)
    third = ClaimStore(tmp_path)
    await third.load()
    assert third.all() == []
    assert oct((tmp_path / "dra-claims.json").stat().st_mode & 0o777) == "0o600"


def test_our_state_is_decoded_leniently(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A newer field is ignored; one broken claim is dropped (named in the log), the others kept."""
    data = json.loads(render({UID: PREPARED}))
    data["claims"][UID]["added_later"] = {"x": 1}
    data["future"] = True
    data["claims"]["broken"] = {"state": "PrepareCompleted", "devices": "x"}
    path = tmp_path / "dra-claims.json"
    original = json.dumps(data).encode()
    path.write_bytes(original)
    with caplog.at_level(logging.ERROR):
        assert load(path) == {UID: PREPARED}
    assert "claims['broken'].devices must be a list" in caplog.text
    (aside,) = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert aside.read_bytes() == original  # kept for people to look at
    assert load(path) == {UID: PREPARED}  # written back without the broken claim


def fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"not json", "Expecting value"),
        (b'{"version": 9, "claims": {}}', "version 9 is not one this cdiplug reads"),
        (b'{"version": 2, "claims": []}', "claims must be a mapping"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"version": "\xff"}', "can't decode byte 0xff"),
    ],
)
def test_a_corrupt_checkpoint_is_moved_aside(
    tmp_path: Path, content: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "dra-claims.json"
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR):
        assert load(path) == {}
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("dra-claims.json.corrupt-")]
    assert not path.exists() and aside.read_bytes() == content
    assert reason in caplog.text and aside.name in caplog.text


def test_a_spec_file_name_in_the_checkpoint_is_a_name() -> None:
    bad = render({UID: PREPARED}).replace(f"cdiplug-claim-{UID}.json".encode(), b"../x.json")
    with pytest.raises(ValueError, match="file name"):
        parse(bad)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_checkpoint_that_is_no_regular_file_is_moved_aside(tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "dra-claims.json"
    target = tmp_path / "elsewhere.json"
    target.write_bytes(render({UID: PREPARED}))
    if kind == "symlink":
        path.symlink_to(target)  # planted: never followed
    else:
        fifo(path)  # never opened for a read that would hang
    with caplog.at_level(logging.ERROR):
        assert load(path) == {}
    (aside,) = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert (aside.is_symlink() if kind == "symlink" else not aside.is_file()) and target.exists()
    assert ("symbolic link" if kind == "symlink" else "FIFO") in caplog.text


def _claim(n: int, owner: str) -> PreparedClaim:
    uid = f"{owner}-{n:04d}"
    return attrs.evolve(PREPARED, uid=uid, spec_file=f"cdiplug-claim-{uid}.json")


def test_two_stores_on_one_file_lose_none_of_each_others_claims(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def writer(owner: str) -> None:
        async def run() -> None:
            store = ClaimStore(tmp_path)
            await store.load()
            go.wait()
            for n in range(40):
                await store.put(_claim(n, owner), durable=False)
            for n in range(0, 40, 2):
                await store.remove(f"{owner}-{n:04d}")

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(owner,)) for owner in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    claims = load(tmp_path / "dra-claims.json")
    assert set(claims) == {f"{o}-{n:04d}" for o in "ab" for n in range(1, 40, 2)}


async def test_a_change_waits_for_the_other_process_lock_and_the_wait_is_bounded(tmp_path: Path) -> None:
    store = ClaimStore(tmp_path)
    path = tmp_path / "dra-claims.json"
    with checkpoint.locked(path):
        put = asyncio.create_task(store.put(PREPARED))
        done, _ = await asyncio.wait([put], timeout=0.2)
        assert not done  # blocked on the other holder
        assert not path.exists()
    await put
    assert set(load(path)) == {UID}
    assert (tmp_path / "dra-claims.json.lock").stat().st_mode & 0o777 == 0o600
    with checkpoint.locked(path), pytest.raises(StateFileError, match="dra-claims.json stayed locked"):
        with checkpoint.locked(path, wait=0.05):
            pass


async def test_refresh_sees_the_other_stores_changes(tmp_path: Path) -> None:
    mine, theirs = ClaimStore(tmp_path), ClaimStore(tmp_path)
    await mine.load()
    await theirs.put(PREPARED)
    assert mine.get(UID) is None
    await mine.refresh()
    assert mine.get(UID) == PREPARED
    await mine.put(_claim(1, "m"))  # written with theirs kept
    await theirs.remove(UID)
    await mine.refresh()
    assert [c.uid for c in mine.all()] == ["m-0001"]


async def test_changes_asked_for_at_once_share_writes_and_all_land(tmp_path: Path) -> None:
    store = ClaimStore(tmp_path)
    await store.load()
    claims = [attrs.evolve(PREPARED, uid=f"u{i}") for i in range(50)]
    await asyncio.gather(*(store.put(c) for c in claims))
    assert store.writes < 50
    again = ClaimStore(tmp_path)
    await again.load()
    assert {c.uid for c in again.all()} == {c.uid for c in claims}
    await asyncio.gather(*(store.remove(c.uid) for c in claims[:25]))
    await again.refresh()
    assert {c.uid for c in again.all()} == {c.uid for c in claims[25:]}


async def test_a_failed_write_fails_every_change_in_it(tmp_path: Path) -> None:
    store = ClaimStore(tmp_path)
    await store.load()
    (tmp_path / "dra-claims.json.lock").unlink()
    (tmp_path / "dra-claims.json.lock").mkdir()  # the lock cannot be opened: no write can be made
    results = await asyncio.gather(*(store.put(attrs.evolve(PREPARED, uid=f"u{i}")) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, StateFileError) for r in results), results
    assert store.all() == []


def test_a_change_renders_and_reads_only_what_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With many claims held a change costs one claim's rendering, and a file this process wrote
    is not decoded again; a file the other daemon wrote is."""
    rendered: list[str] = []
    decoded: list[int] = []
    record, decode = records._record, checkpoint.decode
    monkeypatch.setattr(records, "_record", lambda c: rendered.append(c.uid) or record(c))
    monkeypatch.setattr(checkpoint, "decode", lambda text: decoded.append(1) or decode(text))
    ours, theirs = CheckpointFile(tmp_path / "dra-claims.json"), CheckpointFile(tmp_path / "dra-claims.json")
    claims = {c.uid: c for c in (_claim(n, "a") for n in range(50))}
    ours.save(claims)
    assert len(rendered) == 50 and (tmp_path / "dra-claims.json").read_bytes().count(b"\n") == 52  # a claim a line
    rendered.clear()

    def complete_one(claims: dict[str, PreparedClaim]) -> bool:
        claims["a-0007"] = attrs.evolve(claims["a-0007"], state=ClaimState.COMPLETED)
        return True

    changed = ours.locked_change(complete_one, True)
    assert rendered == ["a-0007"] and decoded == []
    assert render(changed) == (tmp_path / "dra-claims.json").read_bytes()  # the same file as rendered afresh
    theirs.locked_change(lambda c: c.pop("a-0001", None) is not None, True)
    assert decoded == [1] and "a-0001" not in ours.load() and len(decoded) == 2
