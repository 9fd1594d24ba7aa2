"""DRA in production through the real daemon, in-process, against the DRA kubelet and API-server stand-ins.

Covers: two pods of a rolling update (``--pod-uid``) serve one driver side by side and hand a
claim over through the shared checkpoint, and stopping one removes only its sockets (the slices
stay); a new pod leaves a claim the old one is still preparing to it and prepares it once the old
one is gone; the claim's device status (KEP-4817) is written after prepare and cleared after
unprepare, Ready false with the cause after a failed prepare, another driver's entry untouched;
device metadata (KEP-5304) is written, mounted through the claim's CDI spec and removed, not
written without ``device_metadata``, and a template claim's survives a wiped CDI folder. After a
reboot (the CDI folder wiped, another boot ID) a claim's spec is back before any prepare and the
claim still unprepares.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_objects import allocated_claim, claim_ref, settled_slices
from cdiplug.toolkit.filewatch import FolderWatch

FPGA = "example.com/fpga"
DRIVER = "fpga.example.com"
DONGLE = "example.com/dongle"
NODE = "node-a"
UID1 = "11111111-2222-3333-4444-555555555555"
UID2 = "66666666-7777-8888-9999-000000000000"

claim = partial(allocated_claim, driver=DRIVER, pool=NODE)
ref_of = claim_ref


async def slices_settle(api: ApiServerStandIn, predicate: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    return await settled_slices(api, DRIVER, predicate)


async def spec_appears(path: Path) -> None:
    """Until ``path`` exists (inotify on its folder, no polling)."""
    async with FolderWatch(path.parent) as watch:
        events = aiter(watch)
        while not path.exists():
            await anext(events)


def wipe(folder: Path) -> None:
    for path in folder.iterdir():  # a reboot empties the tmpfs; the mount point stays
        path.unlink()


def boot(world: World, boot_id: str) -> None:
    path = world.host_path("/proc/sys/kernel/random/boot_id")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")


def with_device_metadata(config: Config) -> Config:
    """``config`` with ``device_metadata: true`` on its first resource (the DRA one)."""
    first = config.resources[0]
    return attrs.evolve(
        config,
        resources=(attrs.evolve(first, settings=attrs.evolve(first.settings, device_metadata=True)), *config.resources[1:]),
    )


async def test_a_wiped_cdi_folder_gets_the_claim_specs_back_at_start(
    config: Config, dra_world: World, api: ApiServerStandIn
) -> None:
    boot(dra_world, "11111111-1111-4111-8111-111111111111")
    spec_file = dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json"
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await slices_settle(api, lambda s: len(s) == 1)
            obj = api.put_claim(claim(UID1, [("fpga", "fpga-0")]))
            first = (await conn.prepare([ref_of(obj)]))[UID1]
        written = spec_file.read_bytes()
        wipe(dra_world.cdi_dir)
        api.delete_object("resourceclaims", obj["metadata"]["name"], "default")  # only the checkpoint knows it
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await asyncio.wait_for(spec_appears(spec_file), 10)  # before any prepare call
            assert spec_file.read_bytes() == written
            assert (await conn.prepare([ref_of(obj)]))[UID1] == first
            assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}
            assert not spec_file.exists()


async def test_a_claim_from_an_earlier_boot_is_prepared_again_at_start(
    config: Config, dra_world: World, api: ApiServerStandIn
) -> None:
    old, new = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
    checkpoint = dra_world.state_dir / "dra-claims.json"
    spec_file = dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json"
    boot(dra_world, old)
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await slices_settle(api, lambda s: len(s) == 1)
            obj = api.put_claim(claim(UID1, [("fpga", "fpga-1")]))
            first = (await conn.prepare([ref_of(obj)]))[UID1]
        assert json.loads(checkpoint.read_text())["claims"][UID1]["boot_id"] == old
        wipe(dra_world.cdi_dir)
        boot(dra_world, new)  # the node rebooted
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await asyncio.wait_for(spec_appears(spec_file), 10)
            assert "FAKE_FPGA_DEVICES=fpga-1" in json.loads(spec_file.read_text())["containerEdits"]["env"]
            assert (await conn.prepare([ref_of(obj)]))[UID1] == first  # the kubelet's prepare after the reboot
            assert json.loads(checkpoint.read_text())["claims"][UID1]["boot_id"] == new  # kept, not invalidated
            assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}  # and released after the reboot
            assert UID1 not in json.loads(checkpoint.read_text())["claims"]


POD_A = "aaaaaaaa-0000-4000-8000-000000000001"
POD_B = "bbbbbbbb-0000-4000-8000-000000000002"


async def test_two_pods_serve_side_by_side_and_hand_claims_over(
    dra_world: World, api: ApiServerStandIn, health_file: Path
) -> None:
    """A rolling update with maxSurge 1: the old pod (A) and the new one (B) serve one driver at once.

    A claim prepared through A is unprepared through B (the shared checkpoint, read again at
    every call); stopping A removes A's sockets only, B keeps serving, the slices stay.
    """
    only_dra = parse_config(
        {
            "resources": [
                {"name": FPGA, "backend": "fake", "api": "dra", "options": {"count": 2, "health_file": str(health_file)}}
            ]
        },
        source="test_dra",
    )
    world_a, world_b = attrs.evolve(dra_world, pod_uid=POD_A), attrs.evolve(dra_world, pod_uid=POD_B)
    plugins = dra_world.plugins_dir / DRIVER
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(only_dra, world_b):
        b = await asyncio.wait_for(kubelet.wait_registered(DRIVER, pod_uid=POD_B), 10)
        assert b.info.endpoint == str(plugins / f"dra-{POD_B}.sock")
        async with running_daemon(only_dra, world_a):
            a = await asyncio.wait_for(kubelet.wait_registered(DRIVER, pod_uid=POD_A), 10)
            assert a.info.endpoint == str(plugins / f"dra-{POD_A}.sock")
            await slices_settle(api, lambda s: len(s) == 1)
            obj = api.put_claim(claim(UID1, [("fpga", "fpga-1")]))
            prepared = (await a.prepare([ref_of(obj)]))[UID1]
            assert prepared.error == "" and [d.device for d in prepared.devices] == ["fpga-1"]
            spec_file = dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json"
            assert spec_file.exists()
            # B answers a repeated prepare from the checkpoint A wrote, then unprepares it.
            assert (await b.prepare([ref_of(obj)]))[UID1] == prepared
            assert await b.unprepare([ref_of(obj)]) == {UID1: ""}
            assert not spec_file.exists()
            checkpoint = json.loads((dra_world.state_dir / "dra-claims.json").read_text())
            assert checkpoint["claims"] == {}
            # A, asked again (the kubelet retries on either), knows it is gone: already unprepared.
            assert await a.unprepare([ref_of(obj)]) == {UID1: ""}
            other = api.put_claim(claim(UID2, [("fpga", "fpga-0")]))
            assert (await a.prepare([ref_of(other)]))[UID2].error == ""
        # A stopped (SIGTERM's path): its sockets are gone, B's stay and serve.
        assert not kubelet.socket(DRIVER, POD_A).exists() and not (plugins / f"dra-{POD_A}.sock").exists()
        assert kubelet.socket(DRIVER, POD_B).exists() and (plugins / f"dra-{POD_B}.sock").exists()
        assert len(api.slices(spec__driver=DRIVER)) == 1  # a clean stop leaves the slices
        assert await b.unprepare([ref_of(other)]) == {UID2: ""}  # prepared by A, released by B
        assert not (dra_world.cdi_dir / f"cdiplug-claim-{UID2}.json").exists()


async def test_claim_device_status_written_after_prepare_and_cleared_after_unprepare(
    config: Config, dra_world: World, api: ApiServerStandIn
) -> None:
    # KEP-4817: our entries of status.devices (Ready, the device's data) after prepare, gone after
    # unprepare; another driver's entry is never touched.
    theirs = {"driver": "other.example.com", "pool": NODE, "device": "x", "conditions": [], "data": {"mine": True}}
    obj = claim(UID1, [("fpga", "fpga-1")])
    obj["status"]["devices"] = [theirs]
    obj = api.put_claim(obj)
    name = obj["metadata"]["name"]
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await slices_settle(api, lambda s: len(s) == 1)
        assert (await conn.prepare([ref_of(obj)]))[UID1].error == ""
        # written in the background: the kubelet's answer does not wait for the API server
        await asyncio.wait_for(api.wait_for(lambda: len(api.claim("default", name)["status"]["devices"]) == 2), 10)
        devices = api.claim("default", name)["status"]["devices"]
        assert devices[0] == theirs
        (ours,) = [d for d in devices if d["driver"] == DRIVER]
        assert (ours["pool"], ours["device"]) == (NODE, "fpga-1")
        (ready,) = ours["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
        assert ours["data"]["id"] == "fpga-1"
        assert ours["data"]["attributes"] == {"model": "fake fpga", "speed": 9, "fast": True}
        apply = [r for r in api.received if r.method == "PATCH" and r.path.endswith(f"/resourceclaims/{name}/status")]
        assert apply[-1].content_type == "application/apply-patch+yaml"
        assert apply[-1].query["fieldManager"] == f"cdiplug-status-{DRIVER}"
        assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}
        await asyncio.wait_for(api.wait_for(lambda: api.claim("default", name)["status"]["devices"] == [theirs]), 10)
        assert api.claim("default", name)["status"]["allocation"] == obj["status"]["allocation"]


async def test_a_failed_prepare_writes_ready_false_and_unprepare_clears_it(
    dra_world: World, api: ApiServerStandIn, short_tmp: Path
) -> None:
    blocker = short_tmp / "blocker"
    blocker.write_text("a file where the fake backend wants its folder: every preparation fails\n")
    failing = parse_config(
        {
            "resources": [
                {"name": FPGA, "backend": "fake", "api": "dra", "options": {"count": 1, "prepared_dir": str(blocker / "p")}}
            ]
        },
        source="test_dra",
    )
    obj = api.put_claim(claim(UID2, [("fpga", "fpga-0")]))
    name = obj["metadata"]["name"]
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(failing, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await slices_settle(api, lambda s: len(s) == 1)
        assert (await conn.prepare([ref_of(obj)]))[UID2].error != ""
        await asyncio.wait_for(api.wait_for(lambda: bool(api.claim("default", name)["status"].get("devices"))), 10)
        (entry,) = api.claim("default", name)["status"]["devices"]
        assert (entry["driver"], entry["device"]) == (DRIVER, "fpga-0")
        (ready,) = entry["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "PrepareFailed")
        assert "blocker" in ready["message"] and len(ready["message"]) <= 1024
        blocker.unlink()  # the fake's release fails alike while the file is there (the record kept for unprepare)
        assert await conn.unprepare([ref_of(obj)]) == {UID2: ""}
        await asyncio.wait_for(api.wait_for(lambda: "devices" not in api.claim("default", name)["status"]), 10)


async def test_device_metadata_is_written_mounted_and_removed(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    # device_metadata: true (KEP-5304): one metadata.json per request under the driver's plugin
    # folder, bind-mounted read-only by the claim's spec into the devices of that request.
    with_metadata = with_device_metadata(config)
    stray = dra_world.plugins_dir / DRIVER / "dra-device-metadata" / "default_gone" / "fpga"
    stray.mkdir(parents=True)
    (stray / "metadata.json").write_text("{}")
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(with_metadata, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        assert not stray.parent.exists()  # a claim the checkpoint does not know: swept at start
        await slices_settle(api, lambda s: len(s) == 1)
        obj = api.put_claim(claim(UID1, [("fpga", "fpga-1"), ("spare", "fpga-0")], name="vm-fpga"))
        assert (await conn.prepare([ref_of(obj)]))[UID1].error == ""

        folder = dra_world.plugins_dir / DRIVER / "dra-device-metadata" / "default_vm-fpga"
        host_file = folder / "fpga" / "metadata.json"
        assert host_file.stat().st_mode & 0o777 == 0o644
        meta = json.loads(host_file.read_text())
        assert (meta["apiVersion"], meta["kind"]) == ("metadata.resource.k8s.io/v1alpha1", "DeviceMetadata")
        assert meta["metadata"] == {"name": "vm-fpga", "namespace": "default", "uid": UID1, "generation": 1}
        (request,) = meta["requests"]
        assert request["name"] == "fpga"
        (device,) = request["devices"]
        assert (device["name"], device["driver"], device["pool"]) == ("fpga-1", DRIVER, NODE)
        published = {d["name"]: d for d in api.slices(spec__driver=DRIVER)[0]["spec"]["devices"]}
        assert device["attributes"] == published["fpga-1"]["attributes"]  # as the slice has them
        assert sorted(p.name for p in folder.iterdir()) == ["fpga", "spare"]

        cdi = json.loads((dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json").read_text())
        mounts = {d["name"]: d["containerEdits"].get("mounts", []) for d in cdi["devices"]}
        root = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-fpga"
        assert [(m["hostPath"], m["containerPath"], m["options"]) for m in mounts[f"{UID1}-fpga-1"]] == [
            (str(host_file), f"{root}/fpga/{DRIVER}-metadata.json", ["ro", "bind"])
        ]
        assert [m["containerPath"] for m in mounts[f"{UID1}-fpga-0"]] == [f"{root}/spare/{DRIVER}-metadata.json"]

        assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}
        assert not folder.exists()
        assert not (dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json").exists()


async def test_without_device_metadata_no_file_and_no_mount(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await slices_settle(api, lambda s: len(s) == 1)
        obj = api.put_claim(claim(UID1, [("fpga", "fpga-1")], name="plain"))
        assert (await conn.prepare([ref_of(obj)]))[UID1].error == ""
        cdi = json.loads((dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json").read_text())
        assert "mounts" not in cdi["devices"][0]["containerEdits"]
        assert not (dra_world.plugins_dir / DRIVER / "dra-device-metadata").exists()


async def test_device_metadata_follow_the_setting_each_claim_was_prepared_with(
    config: Config, dra_world: World, api: ApiServerStandIn
) -> None:
    # The setting may change between a claim's prepare and its unprepare (an upgrade, a new
    # config): a claim prepared with metadata has them removed at its unprepare with the setting
    # off, and one prepared without gets none when it is prepared again with the setting on.
    with_metadata = with_device_metadata(config)
    folders = dra_world.plugins_dir / DRIVER / "dra-device-metadata"
    spec_2 = dra_world.cdi_dir / f"cdiplug-claim-{UID2}.json"
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        async with running_daemon(with_metadata, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await slices_settle(api, lambda s: len(s) == 1)
            one = api.put_claim(claim(UID1, [("fpga", "fpga-1")], name="with"))
            assert (await conn.prepare([ref_of(one)]))[UID1].error == ""
        assert (folders / "default_with" / "fpga" / "metadata.json").exists()
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            assert await conn.unprepare([ref_of(one)]) == {UID1: ""}
            assert not (folders / "default_with").exists()
            two = api.put_claim(claim(UID2, [("fpga", "fpga-0")], name="without"))
            assert (await conn.prepare([ref_of(two)]))[UID2].error == ""
        record = json.loads((dra_world.state_dir / "dra-claims.json").read_text())["claims"][UID2]
        assert record["device_metadata"] is False
        written = spec_2.read_bytes()
        wipe(dra_world.cdi_dir)
        async with running_daemon(with_metadata, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await asyncio.wait_for(spec_appears(spec_2), 10)
            assert spec_2.read_bytes() == written  # no mounts added
            assert not (folders / "default_without").exists()
            assert await conn.unprepare([ref_of(two)]) == {UID2: ""}


async def test_a_template_claims_metadata_survives_a_wiped_cdi_folder(
    config: Config, dra_world: World, api: ApiServerStandIn
) -> None:
    # A claim made from a template is found in the container by its pod claim name (the
    # annotation); after a reboot wipes the CDI folder, the spec comes back mounting the same.
    with_metadata = with_device_metadata(config)
    spec_file = dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json"
    generated = claim(UID1, [("fpga", "fpga-0")], name="pod-a-accel-x7k2p")
    generated["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "accel"}
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        async with running_daemon(with_metadata, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await slices_settle(api, lambda s: len(s) == 1)
            obj = api.put_claim(generated)
            assert (await conn.prepare([ref_of(obj)]))[UID1].error == ""
        cdi = json.loads(spec_file.read_text())
        (mount,) = cdi["devices"][0]["containerEdits"]["mounts"]
        inside = f"/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/accel/fpga/{DRIVER}-metadata.json"
        assert mount["containerPath"] == inside
        host_file = Path(mount["hostPath"])
        assert json.loads(host_file.read_text())["podClaimName"] == "accel"
        written = spec_file.read_bytes()
        wipe(dra_world.cdi_dir)
        api.delete_object("resourceclaims", obj["metadata"]["name"], "default")  # only the checkpoint knows it
        async with running_daemon(with_metadata, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await asyncio.wait_for(spec_appears(spec_file), 10)
            assert spec_file.read_bytes() == written
            assert json.loads(host_file.read_text())["podClaimName"] == "accel"
            assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}
            assert not host_file.exists() and not spec_file.exists()


async def test_a_new_pod_leaves_a_claim_the_old_one_is_preparing_to_it(
    dra_world: World, api: ApiServerStandIn, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old pod (A) has the backend's preparation done, PrepareStarted recorded, when the new
    pod (B) starts: B's start-up rollback leaves the claim to A (A's instance lock is held), so
    nothing A prepared is released under it; once A is gone, B prepares the kubelet's retry."""
    marks = short_tmp / "prepared"
    marks.mkdir()
    only_dra = parse_config(
        {"resources": [{"name": FPGA, "backend": "fake", "api": "dra", "options": {"count": 2, "prepared_dir": str(marks)}}]},
        source="test_dra",
    )
    world_a, world_b = attrs.evolve(dra_world, pod_uid=POD_A), attrs.evolve(dra_world, pod_uid=POD_B)
    obj = api.put_claim(claim(UID1, [("fpga", "fpga-1")]))
    checkpoint = dra_world.state_dir / "dra-claims.json"
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        monkeypatch.setenv("CDIPLUG_DRA_PAUSE_AFTER", "prepared")
        async with running_daemon(only_dra, world_a):
            a = await asyncio.wait_for(kubelet.wait_registered(DRIVER, pod_uid=POD_A), 10)
            monkeypatch.delenv("CDIPLUG_DRA_PAUSE_AFTER")  # A has read it; B must not
            await slices_settle(api, lambda s: len(s) == 1)
            paused = asyncio.create_task(a.prepare([ref_of(obj)]))
            async with FolderWatch(marks) as watch:
                changes = aiter(watch)
                while not (marks / "fpga-1").exists():
                    await asyncio.wait_for(anext(changes), 10)
            async with running_daemon(only_dra, world_b):
                b = await asyncio.wait_for(kubelet.wait_registered(DRIVER, pod_uid=POD_B), 10)
                record = json.loads(checkpoint.read_text())["claims"][UID1]
                assert (record["state"], record["owner"]) == ("PrepareStarted", POD_A)  # not rolled back
                assert (marks / "fpga-1").exists()  # nor released
                paused.cancel()  # the kubelet gives up on A's answer; A goes (its lock with it)
        async with running_daemon(only_dra, world_b):
            b = await asyncio.wait_for(kubelet.wait_registered(DRIVER, pod_uid=POD_B), 10)
            # B, started after A is gone, rolled the claim back; the kubelet's retry prepares it.
            assert json.loads(checkpoint.read_text())["claims"] == {}
            answer = (await b.prepare([ref_of(obj)]))[UID1]
            assert answer.error == "" and [d.device for d in answer.devices] == ["fpga-1"]
            assert (marks / "fpga-1").exists()
            assert await b.unprepare([ref_of(obj)]) == {UID1: ""}
            assert not (marks / "fpga-1").exists()
