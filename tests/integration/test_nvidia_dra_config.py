"""NVIDIA sharing settings of a DRA claim (``NvidiaConfig``) through the real daemon, the DRA kubelet
stand-in and the API-server stand-in, the NVIDIA backend handed a ``FakeNvml``.

Covers: a claim of one GPU configured for MPS gets the limits in its CDI device's env beside the
GPU's own device node, NVIDIA_VISIBLE_DEVICES naming that GPU; a time-slicing claim gets its
declared interval and CUDA_DEVICE_MAX_CONNECTIONS; a claim of NVIDIA's own apiVersion is refused
naming the field, the claim and the request (cdiplug answers its own kind only).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from cdiplug.backend import BackendPlugin, load_plugins
from cdiplug.config import parse_config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_kubelet import ClaimRef
from cdiplug_backends.nvidia import make_plugin
from cdiplug_backends.nvidia.testing import FakeNvml

DRIVER = "gpu.cdiplug.example.com"
NODE = "node-a"


@pytest.fixture
def node_name() -> str:
    """The node the shared ``api`` fixture (tests/conftest.py) knows."""
    return NODE


def plugins(fake: FakeNvml) -> dict[str, BackendPlugin[Any]]:
    registry = load_plugins()
    return {**{name: registry[name] for name in registry}, "nvidia": make_plugin(nvml=fake)}


def gpu_config(**sharing: Any) -> dict[str, Any]:
    return {"apiVersion": "cdiplug.dev/v1alpha1", "kind": "NvidiaConfig", "sharing": sharing}


async def test_sharing_settings_reach_the_claims_cdi_device(world: World, short_tmp: Path, api: ApiServerStandIn) -> None:
    fake = FakeNvml.nvlink_pairs()
    fake.write_sysfs(world.sysfs_root)
    fake.write_dev(world.dev_root)
    dra_world = attrs.evolve(
        world,
        plugins_registry_dir=short_tmp / "reg",
        plugins_dir=short_tmp / "plugins",
        node_name=NODE,
        kubeconfig=api.kubeconfig(short_tmp / "kubeconfig"),
    )
    resource = {"name": "nvidia.com/gpu", "backend": "nvidia", "api": "dra", "dra_driver": DRIVER}
    config = parse_config({"resources": [resource]}, source="test_nvidia_dra_config")
    claims = {
        "mps": gpu_config(
            strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "8Gi"}
        ),
        "ts": gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Short", "maxConnections": 2}),
        "nvidia": {**gpu_config(strategy="MPS"), "apiVersion": "resource.nvidia.com/v1beta1"},
    }
    async with (
        DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet,
        running_daemon(config, dra_world, plugins=plugins(fake)),
    ):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        await asyncio.wait_for(api.wait_for(lambda: bool(api.slices(spec__driver=DRIVER))), 10)
        devices = sorted(
            (d for s in api.slices(spec__driver=DRIVER) for d in s["spec"]["devices"]),
            key=lambda d: d["attributes"]["index"]["string"],
        )
        refs = {}
        for i, (name, parameters) in enumerate(claims.items()):
            uid = f"{i + 1:08d}-0000-4000-8000-000000000000"
            result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": devices[i]["name"]}
            config_entry = {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}
            obj = {
                "metadata": {"name": f"claim-{name}", "namespace": "default", "uid": uid},
                "status": {"allocation": {"devices": {"results": [result], "config": [config_entry]}}},
            }
            api.put_claim(obj)
            refs[name] = ClaimRef("default", f"claim-{name}", uid)
        answer = await conn.prepare(list(refs.values()))

        def spec(name: str) -> dict[str, Any]:
            return json.loads((dra_world.cdi_dir / f"cdiplug-claim-{refs[name].uid}.json").read_text())

        assert answer[refs["mps"].uid].error == "" and answer[refs["ts"].uid].error == ""
        mps = spec("mps")
        (device,) = mps["devices"]
        env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
        assert (
            env["CDIPLUG_GPU_SHARING"],
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        ) == ("MPS", "30", "0=8192M")
        assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia0"]
        common = dict(e.split("=", 1) for e in mps["containerEdits"]["env"])
        assert common["NVIDIA_VISIBLE_DEVICES"] == fake.gpus[0].uuid
        ts = dict(e.split("=", 1) for e in spec("ts")["devices"][0]["containerEdits"]["env"])
        assert (ts["CDIPLUG_GPU_TIMESLICE_INTERVAL"], ts["CUDA_DEVICE_MAX_CONNECTIONS"]) == ("Short", "2")
        refused = answer[refs["nvidia"].uid].error
        assert "expected cdiplug.dev/v1alpha1, got 'resource.nvidia.com/v1beta1' @ $.parameters.apiVersion" in refused
        assert "(claim default/claim-nvidia, request gpu)" in refused
        assert await conn.unprepare(list(refs.values())) == {r.uid: "" for r in refs.values()}
