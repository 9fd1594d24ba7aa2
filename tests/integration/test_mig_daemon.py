"""MIG devices through the real daemon under the device-plugin API, real gRPC, the kubelet stand-in.

The daemon runs in the test's event loop, the NVIDIA plugin handed a ``FakeNvml`` whose GPU 0 has
MIG mode on with two 1g.10gb and one 3g.40gb MIG devices (own UUIDs, own /dev/nvidia-caps nodes)
and whose GPU 1 has MIG off. Resources are named per profile, as NVIDIA's ``mig.strategy:
mixed`` does. Covers: each profile is a resource of its own with exactly its MIG devices, the
whole-GPU resource lists only the GPU with MIG off (never the one with MIG on); a pod asking for
a 1g.10gb gets one MIG device: its UUID in NVIDIA_VISIBLE_DEVICES, its CDI name, the parent's
/dev/nvidia0 and its two capability nodes, nothing of the other MIG devices; the per-resource
CDI spec holds the MIG devices by UUID.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from cdiplug.backend import BackendPlugin, load_plugins
from cdiplug.config import parse_config
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, running_daemon
from cdiplug_backends.nvidia import make_plugin
from cdiplug_backends.nvidia.testing import FakeGpu, FakeMig, FakeNvml
from cdiplug_backends.nvidia.testing.values import NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE

GPU, MIG1, MIG3 = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"


def fake_machine() -> FakeNvml:
    migs = (
        FakeMig("MIG-1111-a", gi=7, gi_cap_minor=66, ci_cap_minor=67),
        FakeMig("MIG-1111-b", gi=8, gi_cap_minor=75, ci_cap_minor=76),
        FakeMig("MIG-3333-a", gi=2, gi_slices=3, ci_slices=3, memory_mb=40192, gi_cap_minor=21, ci_cap_minor=22),
    )
    return FakeNvml(
        [
            FakeGpu("GPU-mig-on", pci_bus_id="0000:10:00.0", minor=0, mig_mode=NVML_DEVICE_MIG_ENABLE, migs=migs),
            FakeGpu("GPU-mig-off", pci_bus_id="0000:20:00.0", minor=1, mig_mode=NVML_DEVICE_MIG_DISABLE),
        ]
    )


@contextlib.asynccontextmanager
async def node(world: World, fake: FakeNvml) -> AsyncIterator[KubeletStandIn]:
    config = parse_config(
        {
            "resources": [
                {"name": GPU, "backend": "nvidia", "options": {"reprobe_interval_s": 3600}},
                {"name": MIG1, "backend": "nvidia", "options": {"mig_profiles": ["1g.10gb"], "reprobe_interval_s": 3600}},
                {"name": MIG3, "backend": "nvidia", "options": {"mig_profiles": ["3g.40gb"], "reprobe_interval_s": 3600}},
            ]
        },
        source="test_mig_daemon",
    )
    plugins: dict[str, BackendPlugin[Any]] = {**load_plugins(), "nvidia": make_plugin(nvml=fake)}
    async with KubeletStandIn(world.kubelet_dir) as kubelet, running_daemon(config, world, plugins=plugins):
        for resource in (GPU, MIG1, MIG3):
            await kubelet.wait_registered(resource, timeout=10)
        yield kubelet


async def test_mig_devices_are_resources_of_their_own(world: World) -> None:
    fake = fake_machine()
    fake.write_sysfs(world.sysfs_root)
    fake.write_dev(world.dev_root)
    fake.write_mig_files(world.dev_root)
    async with node(world, fake) as kubelet:
        await kubelet.wait_until(lambda: kubelet.capacity(MIG1) == 2, timeout=5, what="two 1g.10gb listed")
        assert {d.id for d in kubelet.devices(GPU)} == {"GPU-mig-off"}  # never the GPU with MIG on
        assert {d.id for d in kubelet.devices(MIG1)} == {"MIG-1111-a", "MIG-1111-b"}
        assert {d.id for d in kubelet.devices(MIG3)} == {"MIG-3333-a"}
        pod = await kubelet.admit_pod("small", {MIG1: 1})
        assert pod.admitted, pod
        (mig,) = pod.device_ids()
        caps = {"MIG-1111-a": ("66", "67"), "MIG-1111-b": ("75", "76")}[mig]
        assert pod.env["NVIDIA_VISIBLE_DEVICES"] == mig
        assert pod.cdi_devices == (f"cdiplug.{MIG1}={mig}",)
        paths = {d.path for d in pod.device_specs}
        assert {"/dev/nvidia0", *(f"/dev/nvidia-caps/nvidia-cap{n}" for n in caps), "/dev/nvidiactl"} <= paths
        assert "/dev/nvidia1" not in paths and "/dev/nvidia-caps/nvidia-cap21" not in paths
    spec = json.loads((world.cdi_dir / "cdiplug-cdiplug.nvidia.com-mig-1g.10gb.json").read_text())
    assert sorted(d["name"] for d in spec["devices"]) == ["MIG-1111-a", "MIG-1111-b"]
