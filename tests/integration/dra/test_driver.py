"""DRA through the real daemon, in-process, against the DRA kubelet stand-in and the API-server stand-in.

Real gRPC over unix sockets (registration, DRAPlugin v1 and v1beta1, health), real HTTP to the
API stand-in (lightkube, kubeconfig with a token). Covers: registration (type, endpoint,
versions) marks the resource ready; slices with the right devices, typed attributes, pool and
generation; a claim prepares with a per-claim CDI spec holding the device's env and the claim's
ID env, answered with its CDI IDs; a repeated prepare answers the same; unprepare removes the
spec; a restarted daemon answers a repeated prepare from its checkpoint and unprepares what the
earlier one prepared; health is streamed as v1beta1 (with a
message) and v1alpha1; an unhealthy device is tainted (or withdrawn where the server drops
taints); slices deleted behind the driver's back come back; one process serves a resource as DRA
and another as a device plugin; a reload moves a resource from one API to the other and back
(sockets, slices and readiness follow; no DRA front end exists before the first DRA resource).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn, KubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_kubelet import ClaimRef
from cdiplug.testing.dra_objects import allocated_claim, claim_ref, settled_slices

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


async def test_registers_publishes_and_prepares(config: Config, dra_world: World, api: ApiServerStandIn, short_tmp: Path) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        assert conn.info.type == "DRAPlugin"
        assert conn.info.endpoint == str(dra_world.plugins_dir / DRIVER / "dra.sock")
        assert conn.info.versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
        assert kubelet.statuses == [(DRIVER, True)]

        slices = await slices_settle(api, lambda s: len(s) == 1)
        spec = slices[0]["spec"]
        assert spec["nodeName"] == NODE
        assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        devices = {d["name"]: d for d in spec["devices"]}
        assert set(devices) == {"fpga-0", "fpga-1"}
        assert devices["fpga-1"]["attributes"] == {
            "id": {"string": "fpga-1"},
            "model": {"string": "fake fpga"},
            "speed": {"int": 9},
            "fast": {"bool": True},
        }
        assert slices[0]["metadata"]["ownerReferences"][0]["kind"] == "Node"

        obj = api.put_claim(claim(UID1, [("fpga", "fpga-1")]))
        answer = await conn.prepare([ref_of(obj)])
        result = answer[UID1]
        assert result.error == ""
        assert [(d.request_names, d.pool, d.device) for d in result.devices] == [(("fpga",), NODE, "fpga-1")]
        cdi_id = f"k8s.{DRIVER}/claim={UID1}-fpga-1"
        assert result.devices[0].cdi_ids == (cdi_id,)

        spec_file = dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json"
        cdi = json.loads(spec_file.read_text())
        assert spec_file.stat().st_mode & 0o777 == 0o644
        assert cdi["kind"] == f"k8s.{DRIVER}/claim"
        assert [d["name"] for d in cdi["devices"]] == [f"{UID1}-fpga-1"]
        assert "FAKE_FPGA_DEVICE_1=fpga-1" in cdi["devices"][0]["containerEdits"]["env"]
        assert "FAKE_FPGA_DEVICES=fpga-1" in cdi["containerEdits"]["env"]

        again = await conn.prepare([ref_of(obj)])
        assert again[UID1] == result

        assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}
        assert not spec_file.exists()
        assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}  # already unprepared: fine


async def test_v1beta1_and_per_claim_errors(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir, prefer="v1beta1.DRAPlugin") as kubelet:
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            assert conn.service == "v1beta1.DRAPlugin"
            await slices_settle(api, lambda s: len(s) == 1)
            good = api.put_claim(claim(UID1, [("a", "fpga-0"), ("b", "fpga-1")]))
            unknown = api.put_claim(claim(UID2, [("a", "fpga-7")]))
            missing = ClaimRef("default", "nope", "99999999-9999-9999-9999-999999999999")
            answer = await conn.prepare([ref_of(good), ref_of(unknown), missing])
            assert [d.device for d in answer[UID1].devices] == ["fpga-0", "fpga-1"]
            assert "fpga-7" in answer[UID2].error
            assert "nope" in answer[missing.uid].error
            replaced = ClaimRef("default", good["metadata"]["name"], UID2)
            assert "replaced" in (await conn.prepare([replaced]))[UID2].error


async def test_restart_keeps_prepared_claims(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await slices_settle(api, lambda s: len(s) == 1)
            obj = api.put_claim(claim(UID1, [("fpga", "fpga-0")]))
            first = (await conn.prepare([ref_of(obj)]))[UID1]
        spec_file = dra_world.cdi_dir / f"cdiplug-claim-{UID1}.json"
        assert spec_file.exists()  # running pods keep their spec across a restart
        assert not (dra_world.plugins_registry_dir / f"{DRIVER}-reg.sock").exists()
        stray = dra_world.cdi_dir / "cdiplug-claim-00000000-0000-0000-0000-000000000000.json"
        stray.write_text("{}")
        api.delete_object("resourceclaims", obj["metadata"]["name"], "default")  # answered from the checkpoint
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            assert not stray.exists()  # not in the checkpoint: removed at start
            assert (await conn.prepare([ref_of(obj)]))[UID1] == first
            assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}
            assert not spec_file.exists()
        slices = api.slices(spec__driver=DRIVER)
        assert len(slices) == 1 and slices[0]["spec"]["pool"]["generation"] >= 1


async def test_unhealthy_device_is_tainted(config: Config, dra_world: World, api: ApiServerStandIn, health_file: Path) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await slices_settle(api, lambda s: len(s) == 1)
        health = conn.health()
        assert await anext(health) == {"fpga-0": "HEALTHY", "fpga-1": "HEALTHY"}
        health_file.write_text("fpga-1: Unhealthy\n")

        def tainted(slices: list[dict[str, Any]]) -> bool:
            return any(d.get("taints") for s in slices for d in s["spec"]["devices"])

        slices = await slices_settle(api, tainted)
        devices = {d["name"]: d for d in slices[0]["spec"]["devices"]}
        assert devices["fpga-1"]["taints"] == [{"key": "cdiplug.dev/unhealthy", "value": "true", "effect": "NoSchedule"}]
        assert "taints" not in devices["fpga-0"]
        assert slices[0]["spec"]["pool"]["generation"] == 2
        assert await anext(health) == {"fpga-0": "HEALTHY", "fpga-1": "UNHEALTHY"}
        await health.aclose()


async def test_health_is_served_as_v1beta1_and_v1alpha1(
    config: Config, dra_world: World, api: ApiServerStandIn, health_file: Path
) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        beta, alpha = conn.health_reports("v1beta1"), conn.health_reports("v1alpha1")
        for stream in (beta, alpha):
            first = await asyncio.wait_for(anext(stream), 10)
            assert {(r.pool, r.device, r.health) for r in first} == {(NODE, "fpga-0", "HEALTHY"), (NODE, "fpga-1", "HEALTHY")}
            assert all(0 < r.timeout_seconds <= 30 for r in first)  # resent well inside the kubelet's window
        health_file.write_text("fpga-1: Unhealthy\n")
        for stream, version in ((beta, "v1beta1"), (alpha, "v1alpha1")):
            changed = {r.device: r for r in await asyncio.wait_for(anext(stream), 10)}
            assert changed["fpga-1"].health == "UNHEALTHY" and changed["fpga-0"].health == "HEALTHY", version
            if version == "v1beta1":
                assert "fpga-1" in changed["fpga-1"].message and "unhealthy" in changed["fpga-1"].message
            await stream.aclose()


async def test_dra_metrics_through_the_daemons_metrics_endpoint(
    config: Config, dra_world: World, api: ApiServerStandIn, health_file: Path
) -> None:
    """/metrics of a running daemon: claims prepared now, slice publishes, health messages, per driver."""
    import socket
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as s:  # a free port for the metrics server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        return {
            (m.name, tuple(sorted(m.labels.items()))): m.value for f in text_string_to_metric_families(text) for m in f.samples
        }

    d = ("driver", DRIVER)
    async with (
        DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet,
        running_daemon(config, dra_world, metrics_address=f"127.0.0.1:{port}"),
    ):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await slices_settle(api, lambda s: len(s) == 1)
        health = conn.health()
        await anext(health)
        obj = api.put_claim(claim(UID1, [("fpga", "fpga-1")]))
        assert (await conn.prepare([ref_of(obj)]))[UID1].error == ""
        got = await asyncio.to_thread(scrape)
        assert got[("cdiplug_dra_claims_prepared", (d,))] == 1
        assert got[("cdiplug_dra_slice_publishes_total", (d, ("result", "ok")))] == 1
        assert got[("cdiplug_dra_health_messages_total", (d,))] >= 1
        health_file.write_text("fpga-1: Unhealthy\n")  # a new pool generation and a health message
        await slices_settle(api, lambda s: any(dev.get("taints") for x in s for dev in x["spec"]["devices"]))
        await anext(health)
        await health.aclose()
        assert await conn.unprepare([ref_of(obj)]) == {UID1: ""}
        got = await asyncio.to_thread(scrape)
        assert got[("cdiplug_dra_claims_prepared", (d,))] == 0
        assert got[("cdiplug_dra_slice_publishes_total", (d, ("result", "ok")))] == 2
        assert got[("cdiplug_dra_slice_publishes_total", (d, ("result", "error")))] == 0
        assert got[("cdiplug_dra_health_messages_total", (d,))] >= 2


async def test_unhealthy_device_is_withdrawn_where_taints_are_dropped(
    config: Config, dra_world: World, api: ApiServerStandIn, health_file: Path
) -> None:
    api.drop_taints = True
    health_file.write_text("fpga-1: Unhealthy\n")
    async with running_daemon(config, dra_world):
        slices = await slices_settle(api, lambda s: len(s) == 1 and [d["name"] for d in s[0]["spec"]["devices"]] == ["fpga-0"])
        assert not any(d.get("taints") for d in slices[0]["spec"]["devices"])


async def test_slices_changed_behind_our_back_come_back(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    stale = {
        "metadata": {"name": "leftover"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 7, "resourceSliceCount": 2},
            "devices": [],
        },
    }
    foreign = {
        "metadata": {"name": "someone-else"},
        "spec": {"driver": DRIVER, "nodeName": "node-b", "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1}},
    }
    for obj in (stale, foreign):
        api.put_slice(obj)
    async with running_daemon(config, dra_world):
        slices = await slices_settle(api, lambda s: {x["metadata"]["name"] for x in s} == {f"{NODE}-{DRIVER}-0", "someone-else"})
        ours = next(s for s in slices if s["spec"]["nodeName"] == NODE)
        assert ours["spec"]["pool"]["generation"] == 8  # continues after the stale pool's generation
        api.delete_object("resourceslices", ours["metadata"]["name"])
        again = await slices_settle(api, lambda s: any(x["spec"]["nodeName"] == NODE for x in s))
        assert next(s for s in again if s["spec"]["nodeName"] == NODE)["spec"]["pool"]["generation"] == 9
        api.modify_slice(f"{NODE}-{DRIVER}-0", lambda o: o["spec"].update(devices=[]))
        fixed = await slices_settle(
            api, lambda s: any(x["spec"]["nodeName"] == NODE and len(x["spec"]["devices"]) == 2 for x in s)
        )
        assert len(fixed) == 2
    assert api.slices(metadata__name="someone-else")[0]["spec"]["nodeName"] == "node-b"  # never touched


async def test_one_process_serves_dra_and_device_plugin(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    async with (
        KubeletStandIn(dra_world.kubelet_dir) as dp_kubelet,
        DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet,
        running_daemon(config, dra_world),
    ):
        await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await dp_kubelet.wait_registered(DONGLE, timeout=10)
        assert dp_kubelet.resources == (DONGLE,)  # the DRA resource is never a device plugin too
        assert not (dra_world.kubelet_dir / "example.com-fpga.sock").exists()
        assert not any(s["spec"]["driver"] == "dongle.example.com" for s in api.slices())


async def test_reload_moves_a_resource_between_the_apis(dra_world: World, api: ApiServerStandIn) -> None:
    from cdiplug.node import Node
    from cdiplug.telemetry.metrics import Metrics
    from cdiplug.toolkit.supervisor import Supervisor

    def config(fpga_api: str) -> Config:
        fpga = {"name": FPGA, "backend": "fake", "api": fpga_api, "options": {"count": 2}}
        return parse_config({"resources": [fpga, {"name": DONGLE, "backend": "fake"}]}, source="reload")

    metrics = Metrics()
    supervisor = Supervisor()
    node = Node(config("device-plugin"), dra_world, supervisor, recorder=metrics)
    async with KubeletStandIn(dra_world.kubelet_dir) as dp_kubelet, DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        try:
            await node.start()
            await dp_kubelet.wait_registered(FPGA, timeout=10)
            assert set(node.front_ends) == {"device-plugin"}  # no DRA resource: the DRA front end (and lightkube) never made
            await node.reload(config("dra"))
            await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            assert not (dra_world.kubelet_dir / "example.com-fpga.sock").exists()
            await slices_settle(api, lambda s: len(s) == 1 and len(s[0]["spec"]["devices"]) == 2)
            assert metrics.ready()  # /readyz: the DRA driver registered, the dongle too
            await node.reload(config("device-plugin"))
            await slices_settle(api, lambda s: s == [])  # withdrawn: the resource left DRA
            assert not (dra_world.plugins_registry_dir / f"{DRIVER}-reg.sock").exists()
            await dp_kubelet.wait_registered(FPGA, timeout=10)
        finally:
            await supervisor.close()
            await node.stop()


async def test_a_request_that_does_not_parse_is_invalid_argument(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    import grpc

    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        bad = b"\x0a\x02\xff\xfe"  # Claim.namespace: not UTF-8
        raw = b"\x0a" + bytes([len(bad)]) + bad  # NodePrepareResourcesRequest.claims[0]
        async with grpc.aio.insecure_channel(f"unix://{conn.info.endpoint}") as channel:
            call = channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(raw, timeout=10)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "claims[0].namespace" in (info.value.details() or "")
        # The server goes on: a good claim still prepares.
        obj = api.put_claim(claim(UID1, [("fpga", "fpga-0")]))
        assert (await conn.prepare([ref_of(obj)]))[UID1].error == ""
