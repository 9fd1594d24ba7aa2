"""Claims with per-claim configuration and admin access, prepared through the backend host
(cdiplug.dra.prepare.ClaimPreparer with cdiplug.dra.claim_config).

A recording backend with a Preparer, an Unpreparer and the ClaimConfigurable ability (``bind``:
whether the host prepares the device; ``keep``: whether unprepare releases it; ``tag``: an env
variable) stands behind a real BackendHost; the API is a small stub at the client seam. Covers: a
configured claim's spec carries its configuration and its checkpoint the entries; a repeated
prepare with the same configuration answers the same, one whose claim now has another is an
error naming the claim; a broken configuration fails that claim alone, touching nothing, while
another claim prepares; ``bind: false`` prepares and releases nothing and drops the common edits;
``keep`` leaves the device prepared; an admin-access claim beside a normal user of the same
device prepares and releases nothing, says so in its env, and never holds back the normal
claim's release; after a reboot the configured spec is restored as it was; a checkpoint without
the new fields (an earlier cdiplug) loads as plain preparations.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from cdiplug.backend import CheckedOptions, ClaimConfigurable, Configured
from cdiplug.dra.checkpoint import ClaimStore, decode
from cdiplug.dra.prepare import ClaimPreparer, NodeContext
from cdiplug.errors import InvalidRequest
from cdiplug.host import BackendHost
from cdiplug.models.devices import ContainerEdits, Device, DeviceNode, DeviceSnapshot
from cdiplug.models.world import World
from cdiplug.testing.dra_claims import ClaimsAtSeam, RecordingBackend

RESOURCE = "example.com/nic"
DRIVER = "nic.example.com"
UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"


@attrs.frozen
class RecConfig(CheckedOptions):
    bind: bool = True
    keep: bool = False
    tag: str = ""

    def problems(self) -> Iterator[tuple[str, str]]:
        if len(self.tag) > 8:
            yield "tag", "at most 8 characters"


class Recording(RecordingBackend, ClaimConfigurable[RecConfig]):
    def snapshot(self) -> DeviceSnapshot:
        devices = [Device(f"nic-{i}", edits=ContainerEdits(env={"NIC": str(i)}), prepare_group=f"g{i}") for i in range(3)]
        common = ContainerEdits(device_nodes=[DeviceNode("/dev/nic-ctl")])
        return DeviceSnapshot(RESOURCE, devices, common_edits=common, ids_env="NIC_IDS")

    def claim_config_type(self, resource: str) -> type[RecConfig]:
        return RecConfig

    def claim_config_kind(self, resource: str) -> str:
        return "RecConfig"

    def configure(self, resource: str, device: Device, config: RecConfig) -> Configured:
        edits = ContainerEdits(env={"TAG": config.tag}) if config.tag else ContainerEdits()
        if not config.bind:  # as PCI vfio: false: no device node, no preparation, no common edits
            plain = ContainerEdits(env=device.edits.env).merge(edits)
            return Configured(attrs.evolve(device, edits=plain), prepare=False, common_edits=False)
        return Configured(attrs.evolve(device, edits=device.edits.merge(edits)), release=not config.keep)


PLUGIN = Recording.plugin()
RC = Recording.dra_resource(RESOURCE, DRIVER)


def params(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "cdiplug.dev/v1alpha1", "kind": "RecConfig", **fields}


class Claims(ClaimsAtSeam):
    def __init__(self) -> None:
        super().__init__(DRIVER, "n1")


async def setup(host: BackendHost, world: World, boot_id: str | None = None) -> tuple[ClaimPreparer, Claims, ClaimStore]:
    claims = Claims()
    store = ClaimStore(world.state_dir)
    await store.load()
    prep = ClaimPreparer(RC, NodeContext("n1", boot_id=boot_id), host, store, lambda: claims)  # type: ignore[arg-type, return-value]
    return prep, claims, store


def spec_of(world: World, uid: str) -> Any:
    return json.loads((world.cdi_dir / f"cdiplug-claim-{uid}.json").read_text())


def device_env(world: World, uid: str, i: int = 0) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec_of(world, uid)["devices"][i]["containerEdits"].get("env", []))


async def test_a_configured_claim_and_its_repeated_prepare(host: BackendHost, world: World) -> None:
    prep, claims, store = await setup(host, world)
    a = claims.add(UID_A, ["nic-0"], params(tag="blue"))
    done = await prep.prepare(a)
    assert device_env(world, UID_A) == {"NIC": "0", "TAG": "blue"}
    assert spec_of(world, UID_A)["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nic-0", "permissions": "rw"}]
    assert [c.parameters for c in done.configs] == [params(tag="blue")]  # checkpointed as prepared
    assert await prep.prepare(a) == done  # the same configuration: the same answer
    claims.add(UID_A, ["nic-0"], params(tag="red"))  # allocated again, the UID kept, another configuration
    with pytest.raises(InvalidRequest, match=rf"ResourceClaim ns/c-aaaa \({UID_A}\) was prepared with another configuration"):
        await prep.prepare(a)
    del claims.claims[("ns", "c-aaaa")]  # the claim cannot be read: the checkpoint answers, as ever
    assert await prep.prepare(a) == done
    assert Recording.last.prepared == [["nic-0"]]


async def test_a_broken_configuration_fails_its_claim_alone(host: BackendHost, world: World) -> None:
    prep, claims, store = await setup(host, world)
    bad = claims.add(UID_A, ["nic-0"], params(tga="blue"))
    with pytest.raises(InvalidRequest, match=r'unknown field "tga" @ \$.parameters \(claim ns/c-aaaa, request nic\)'):
        await prep.prepare(bad)
    too_long = claims.add(UID_A, ["nic-0"], params(tag="much too long"))
    with pytest.raises(InvalidRequest, match=r"at most 8 characters @ \$.parameters.tag \(claim ns/c-aaaa, request nic\)"):
        await prep.prepare(too_long)
    assert Recording.last.prepared == [] and store.all() == [] and not list(world.cdi_dir.iterdir())  # nothing touched
    await prep.prepare(claims.add(UID_B, ["nic-1"], params(tag="ok")))  # another claim: prepared
    assert Recording.last.prepared == [["nic-1"]]


async def test_bind_false_prepares_and_releases_nothing_and_keep_leaves_it_prepared(host: BackendHost, world: World) -> None:
    prep, claims, store = await setup(host, world)
    a = claims.add(UID_A, ["nic-0"], params(bind=False))
    await prep.prepare(a)
    spec = spec_of(world, UID_A)
    assert "deviceNodes" not in spec["devices"][0]["containerEdits"]  # not prepared: no device node
    assert "deviceNodes" not in spec["containerEdits"]  # nor the resource's common ones
    b = claims.add(UID_B, ["nic-1"], params(keep=True))
    await prep.prepare(b)
    assert spec_of(world, UID_B)["containerEdits"]["deviceNodes"] == [{"path": "/dev/nic-ctl", "permissions": "rw"}]
    await prep.unprepare(a)
    await prep.unprepare(b)
    assert Recording.last.prepared == [["nic-1"]] and Recording.last.released == []
    assert store.all() == [] and not list(world.cdi_dir.iterdir())


async def test_an_admin_access_claim_beside_a_normal_user(host: BackendHost, world: World) -> None:
    prep, claims, store = await setup(host, world)
    admin = claims.add(UID_A, ["nic-0"], admin=True)
    user = claims.add(UID_B, ["nic-0"])
    await prep.prepare(admin)  # first: it must not make the device look prepared or held
    assert Recording.last.prepared == []
    assert device_env(world, UID_A) == {"NIC": "0", "CDIPLUG_ADMIN_ACCESS": "true"}
    await prep.prepare(user)
    assert Recording.last.prepared == [["nic-0"]] and "CDIPLUG_ADMIN_ACCESS" not in device_env(world, UID_B)
    await prep.unprepare(user)  # the admin claim does not hold the device back
    assert Recording.last.released == [["nic-0"]]
    await prep.unprepare(admin)  # and releases nothing itself
    assert Recording.last.released == [["nic-0"]] and store.all() == []


async def test_after_a_reboot_a_configured_claim_is_restored_as_prepared(host: BackendHost, world: World) -> None:
    prep, claims, store = await setup(host, world, boot_id="boot-1")
    a = claims.add(UID_A, ["nic-0"], params(tag="blue"))
    b = claims.add(UID_B, ["nic-0"], admin=True)
    await prep.prepare(a)
    await prep.prepare(b)
    before = {uid: spec_of(world, uid) for uid in (UID_A, UID_B)}
    for uid in (UID_A, UID_B):
        assert await host.specs.drop_file(f"cdiplug-claim-{uid}.json")  # the old daemon keeps it no more
    host.preparations(RESOURCE)._prepared.clear()
    prep2, _, _ = await setup(host, world, boot_id="boot-2")
    snapshot = host.latest(RESOURCE)
    assert snapshot is not None and await prep2.restore(snapshot) == 2
    assert {uid: spec_of(world, uid) for uid in (UID_A, UID_B)} == before
    assert Recording.last.prepared == [["nic-0"], ["nic-0"]]  # the admin claim's device not prepared for it


def test_a_checkpoint_of_an_earlier_cdiplug_loads_as_plain_preparations() -> None:
    device = {"request_names": ["nic"], "pool": "n1", "device": "nic-0", "device_id": "nic-0", "cdi_ids": []}
    record = {"state": "PrepareCompleted", "namespace": "ns", "name": "c", "driver": DRIVER, "resource": RESOURCE}
    text = json.dumps(
        {
            "version": 2,
            "claims": {"u1": {**record, "devices": [device]}, "u2": {**record, "devices": [{**device, "prepared": "yes"}]}},
        }
    )
    claims = decode(text.encode()).claims
    for uid in ("u1", "u2"):  # absent, or not a boolean (lenient): the defaults
        d = claims[uid].devices[0]
        assert (d.prepared, d.release, d.admin_access) == (True, True, False)
