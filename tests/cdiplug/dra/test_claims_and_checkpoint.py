"""Claims read (cdiplug.dra.claims), per-claim CDI specs (claimspec) and the checkpoint of prepared claims.

Claims: only results of our driver in our pool, in order; a replaced, unallocated or malformed
claim is an InvalidRequest. Specs: kind ``k8s.<driver>/claim``, devices ``<uid>-<name>``, the
claim's ID env, 0644, stale ones removed but kept ones left; a bad UID never becomes a path.
Checkpoint: a round trip; changes are atomic; a corrupt file is moved aside with the reason.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cdiplug.dra import claimspec
from cdiplug.dra.checkpoint import ClaimStore, PreparedClaim, PreparedDevice, load, parse, render
from cdiplug.dra.claims import AllocatedDevice, ClaimRef, allocated
from cdiplug.errors import CdiError, InvalidRequest
from cdiplug.model import ContainerEdits, Device, DeviceSnapshot

UID = "0b0c7f6e-1111-2222-3333-444455556666"
REF = ClaimRef("ns", "c", UID)


def claim(results: list[dict[str, str]], uid: str = UID) -> dict[str, object]:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}


def test_allocated_picks_our_driver_and_pool() -> None:
    results = [
        {"request": "a", "driver": "d.example.com", "pool": "n1", "device": "x"},
        {"request": "b", "driver": "other.example.com", "pool": "n1", "device": "y"},
        {"request": "c", "driver": "d.example.com", "pool": "n2", "device": "z"},
        {"request": "big/fast", "driver": "d.example.com", "pool": "n1", "device": "w"},
    ]
    assert allocated(claim(results), REF, "d.example.com", "n1") == (
        AllocatedDevice("a", "n1", "x"),
        AllocatedDevice("big/fast", "n1", "w"),
    )


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim([], uid="other"), "replaced"),
        ({"metadata": {"uid": UID}, "status": {}}, "not allocated"),
        (claim([{"driver": "d.example.com", "pool": "n1"}]), "lacks"),
    ],
)
def test_claims_we_cannot_prepare(obj: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        allocated(obj, REF, "d.example.com", "n1")


def test_claim_spec(tmp_path: Path) -> None:
    snap = DeviceSnapshot(
        "example.com/fpga",
        [Device("fpga-0", edits=ContainerEdits(env={"A": "0"})), Device("fpga-1", edits=ContainerEdits(env={"A": "1"}))],
        ids_env="FAKE_FPGA_DEVICES",
    )
    content = claimspec.render("fpga.example.com", UID, snap, [("fpga-1", snap.devices[1])])
    path = claimspec.write(tmp_path, UID, content)
    assert path.name == f"cdiplug-claim-{UID}.json" and path.stat().st_mode & 0o777 == 0o644
    spec = json.loads(path.read_text())
    assert spec["kind"] == "k8s.fpga.example.com/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-fpga-1"]
    assert spec["containerEdits"]["env"] == ["FAKE_FPGA_DEVICES=fpga-1"]
    assert claimspec.cdi_name("fpga.example.com", UID, "fpga-1") == f"k8s.fpga.example.com/claim={UID}-fpga-1"
    other = tmp_path / "cdiplug-claim-deadbeef.json"
    other.write_text("{}")
    per_resource = tmp_path / "cdiplug-example.com-fpga.json"
    per_resource.write_text("{}")
    assert claimspec.remove_stale(tmp_path, [UID]) == [other]
    assert path.exists() and per_resource.exists()
    assert claimspec.remove(tmp_path, UID) and not claimspec.remove(tmp_path, UID)


def test_a_uid_never_becomes_a_path(tmp_path: Path) -> None:
    with pytest.raises(CdiError):
        claimspec.file_name("../../etc/passwd")


def test_the_per_resource_writer_leaves_claim_specs_alone(tmp_path: Path) -> None:
    from cdiplug.cdi.writer import SpecWriter

    (tmp_path / f"cdiplug-claim-{UID}.json").write_text("{}")
    (tmp_path / "cdiplug-example.com-old.json").write_text("{}")
    removed = SpecWriter(tmp_path).remove_stale([])
    assert [p.name for p in removed] == ["cdiplug-example.com-old.json"]


PREPARED = PreparedClaim(
    uid=UID,
    namespace="ns",
    name="c",
    driver="d.example.com",
    resource="example.com/d",
    devices=(PreparedDevice(("a",), "n1", "x", "X", ("k8s.d.example.com/claim=u-x",), "group-3"),),
    spec_file=f"cdiplug-claim-{UID}.json",
)


def test_checkpoint_round_trip() -> None:
    assert parse(render({UID: PREPARED})) == {UID: PREPARED}


async def test_store_survives_a_restart(tmp_path: Path) -> None:
    store = ClaimStore(tmp_path)
    await store.load()
    await store.put(PREPARED)
    again = ClaimStore(tmp_path)
    await again.load()
    assert again.get(UID) == PREPARED
    await again.remove(UID)
    third = ClaimStore(tmp_path)
    await third.load()
    assert third.all() == []
    assert oct((tmp_path / "dra-claims.json").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    "content",
    [b"not json", b'{"version": 9, "claims": {}}', b'{"version": 1, "claims": {"u": {"devices": "x"}}}'],
)
def test_a_corrupt_checkpoint_is_moved_aside(tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "dra-claims.json"
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR):
        assert load(path) == {}
    assert not path.exists() and (tmp_path / "dra-claims.json.corrupt").read_bytes() == content
    assert "corrupt" in caplog.text


def test_a_spec_file_name_in_the_checkpoint_is_a_name() -> None:
    bad = render({UID: PREPARED}).replace(f"cdiplug-claim-{UID}.json".encode(), b"../x.json")
    with pytest.raises(ValueError, match="file name"):
        parse(bad)


def test_a_checkpoint_that_is_no_regular_file_is_moved_aside(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_bytes(render({UID: PREPARED}))
    (tmp_path / "dra-claims.json").symlink_to(target)  # planted: never followed
    assert load(tmp_path / "dra-claims.json") == {}
    assert (tmp_path / "dra-claims.json.corrupt").is_symlink() and target.exists()
