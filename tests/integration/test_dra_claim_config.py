"""Per-claim configuration and admin access through the real daemon (in-process), the DRA kubelet
stand-in and the API-server stand-in.

Real gRPC over unix sockets (registration, DRAPlugin v1), real HTTP to the API stand-in
(lightkube). The fake backend with ``prepared_dir`` (its preparation a marker file per device).
Covers: a claim configured by its DeviceClass and itself (``FakeConfig``) gets the merged env in
its CDI device; in one NodePrepareResources call a claim with a broken configuration gets the
per-claim error naming the field, the claim and the request while the other claim prepares; a
claim of another driver's configuration is ignored; an admin-access claim beside a normal user of
the same device is not prepared (no marker), says so in its env, and neither its unprepare nor
its presence changes the normal claim's release; a restarted daemon answers the configured claim
from its checkpoint.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_kubelet import ClaimRef

FPGA = "example.com/fpga"
DRIVER = "fpga.example.com"
NODE = "node-a"
UID1 = "11111111-2222-3333-4444-555555555555"
UID2 = "66666666-7777-8888-9999-000000000000"
UID3 = "33333333-2222-3333-4444-555555555555"


@pytest.fixture
def marks(short_tmp: Path) -> Path:
    return short_tmp / "prepared"


@pytest.fixture
def config(marks: Path) -> Config:
    resource = {"name": FPGA, "backend": "fake", "api": "dra", "options": {"count": 2, "prepared_dir": str(marks)}}
    return parse_config({"resources": [resource]}, source="test_dra_claim_config")


def fake_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "cdiplug.dev/v1alpha1", "kind": "FakeConfig", **fields}


def claim(uid: str, device: str, configs: list[dict[str, Any]] | None = None, admin: bool = False) -> dict[str, Any]:
    result = {"request": "fpga", "driver": DRIVER, "pool": NODE, "device": device}
    if admin:
        result["adminAccess"] = True
    return {
        "metadata": {"name": f"claim-{uid[:8]}", "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": [result], "config": configs or []}}},
    }


def ref_of(obj: dict[str, Any]) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def device_env(world: World, uid: str) -> dict[str, str]:
    spec = json.loads((world.cdi_dir / f"cdiplug-claim-{uid}.json").read_text())
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


async def test_configured_and_broken_claims_in_one_call(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    configs = [
        {
            "source": "FromClass",
            "opaque": {"driver": DRIVER, "parameters": fake_config(mode="shared", env={"A": "class", "B": "class"})},
        },
        {
            "source": "FromClaim",
            "requests": ["fpga"],
            "opaque": {"driver": DRIVER, "parameters": fake_config(env={"B": "claim"})},
        },
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"anything": True}}},
    ]
    broken = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": fake_config(shairng=True)}}]
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet:
        async with running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await asyncio.wait_for(api.wait_for(lambda: bool(api.slices(spec__driver=DRIVER))), 10)
            good, bad = api.put_claim(claim(UID1, "fpga-0", configs)), api.put_claim(claim(UID2, "fpga-1", broken))
            answer = await conn.prepare([ref_of(good), ref_of(bad)])
            assert answer[UID1].error == ""
            assert answer[UID2].error.endswith(
                'unknown field "shairng" @ $.parameters (claim default/claim-66666666, request fpga)'
            )
            assert not (dra_world.cdi_dir / f"cdiplug-claim-{UID2}.json").exists()
            assert device_env(dra_world, UID1) == {
                "FAKE_FPGA_DEVICE_0": "fpga-0",
                "A": "class",
                "B": "claim",
                "FAKE_FPGA_DEVICE_0_MODE": "shared",
            }
            first = answer[UID1]
        async with running_daemon(config, dra_world):  # restarted: the checkpoint answers, the same configuration
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            assert (await conn.prepare([ref_of(good)]))[UID1] == first
            assert await conn.unprepare([ref_of(good), ref_of(bad)]) == {UID1: "", UID2: ""}


async def test_an_admin_access_claim_beside_a_normal_user(
    config: Config, dra_world: World, api: ApiServerStandIn, marks: Path
) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await asyncio.wait_for(api.wait_for(lambda: bool(api.slices(spec__driver=DRIVER))), 10)
        admin = api.put_claim(claim(UID3, "fpga-0", admin=True))
        user = api.put_claim(claim(UID1, "fpga-0"))
        assert (await conn.prepare([ref_of(admin)]))[UID3].error == ""
        assert not (marks / "fpga-0").exists()  # no exclusive preparation for monitoring
        assert device_env(dra_world, UID3)["CDIPLUG_ADMIN_ACCESS"] == "true"
        assert (await conn.prepare([ref_of(user)]))[UID1].error == ""
        assert (marks / "fpga-0").exists() and "CDIPLUG_ADMIN_ACCESS" not in device_env(dra_world, UID1)
        assert await conn.unprepare([ref_of(admin)]) == {UID3: ""}
        assert (marks / "fpga-0").exists()  # the admin claim released nothing
        assert (await conn.prepare([ref_of(admin)]))[UID3].error == ""  # back, beside the user
        assert await conn.unprepare([ref_of(user)]) == {UID1: ""}
        assert not (marks / "fpga-0").exists()  # the user's release is not held back by the admin claim
        assert await conn.unprepare([ref_of(admin)]) == {UID3: ""}
