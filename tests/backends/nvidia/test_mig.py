"""MIG devices that already exist, through the NVIDIA backend running for real on FakeNvml's MIG.

The machine: GPU 0 with MIG mode on and three MIG devices (two 1g.10gb, one 3g.40gb, each with
its own UUID and /dev/nvidia-caps nodes), GPU 1 with MIG off, GPU 2 without MIG support.
Covers: FakeNvml answers the MIG calls as NVML does (an empty index is NOT_FOUND, a GPU with MIG
off has no MIG handles, MIG handles answer UUID and memory); resources named per profile
(``mig_profiles``, NVIDIA's ``mig.strategy: mixed`` naming ``nvidia.com/mig-1g.10gb``) get
exactly their MIG devices, with the parent's device node and their two capability nodes, and the
whole-GPU resource never gets the GPU with MIG on (listed as skipped, why); ``*`` takes every
profile and carries the GPU's counter set, each MIG device consuming its slices and memory; an
XID on the parent makes its MIG devices Unhealthy in every resource they are in; a MIG device
whose capability file is missing is skipped, the others served; a bad profile is refused in the
config.
"""

from __future__ import annotations

import asyncio

import pytest

from cdiplug.errors import ConfigError
from cdiplug.models.devices import Health
from cdiplug.models.world import World
from cdiplug_backends.nvidia.nvml import Nvml, NvmlError
from cdiplug_backends.nvidia.testing import FakeGpu, FakeMig, FakeNvml
from cdiplug_backends.nvidia.testing.values import NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE

WHOLE, MIG1, MIG3, ALL = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig"
MIGS = (
    FakeMig("MIG-aaaa-0001", gi=7, ci=0, gi_cap_minor=66, ci_cap_minor=67),
    FakeMig("MIG-aaaa-0002", gi=8, ci=0, gi_cap_minor=75, ci_cap_minor=76),
    FakeMig("MIG-aaaa-0003", gi=2, ci=0, gi_slices=3, ci_slices=3, memory_mb=40192, gi_cap_minor=21, ci_cap_minor=22),
)


def mig_machine() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu("GPU-mig-on", pci_bus_id="0000:10:00.0", minor=0, mig_mode=NVML_DEVICE_MIG_ENABLE, migs=MIGS),
            FakeGpu("GPU-mig-off", pci_bus_id="0000:20:00.0", minor=1, mig_mode=NVML_DEVICE_MIG_DISABLE),
            FakeGpu("GPU-no-mig", name="NVIDIA A10", pci_bus_id="0000:30:00.0", minor=2, mig_mode=None),
        ]
    )


def laid_out(world: World, nv, fake: FakeNvml):
    w = nv.machine(world, fake)
    fake.write_mig_files(world.dev_root)
    return w


def test_fake_nvml_answers_mig_as_nvml_does() -> None:
    fake = mig_machine()
    nvml = Nvml(fake)
    nvml.init()
    on, off = nvml.handle(0), nvml.handle(1)
    assert nvml.call("nvmlDeviceGetMaxMigDeviceCount", on) == 7 and nvml.call("nvmlDeviceGetMaxMigDeviceCount", off) == 0
    first = nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", on, 0)
    assert nvml.uuid(first) == "MIG-aaaa-0001" and nvml.memory(first) == 9856 << 20
    assert nvml.call("nvmlDeviceGetGpuInstanceId", first) == 7
    with pytest.raises(NvmlError) as empty:
        nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", on, 3)
    assert nvml.is_code(empty.value, "NVML_ERROR_NOT_FOUND")
    with pytest.raises(NvmlError) as no_mig:
        nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", off, 0)
    assert nvml.is_code(no_mig.value, "NVML_ERROR_INVALID_ARGUMENT")


async def test_mig_devices_are_resources_of_their_own_and_the_gpu_never_whole(world: World, nv, sink) -> None:
    fake = mig_machine()
    w = laid_out(world, nv, fake)
    res = nv.resources(
        {"name": WHOLE, "options": {"reprobe_interval_s": 3600}},
        {"name": MIG1, "options": {"mig_profiles": ["1g.10gb"], "reprobe_interval_s": 3600}},
        {"name": MIG3, "options": {"mig_profiles": ["3g.40gb"], "reprobe_interval_s": 3600}},
    )
    async with nv.running(nv.backend(res, w), sink):
        latest = sink.latest
        assert latest[WHOLE].ids == ("GPU-mig-off", "GPU-no-mig")
        assert dict(latest[WHOLE].skipped)["GPU-mig-on"].startswith("MIG mode is on")
        assert latest[MIG1].ids == ("MIG-aaaa-0001", "MIG-aaaa-0002") and latest[MIG3].ids == ("MIG-aaaa-0003",)
        one = latest[MIG1].get("MIG-aaaa-0002")
        assert [n.path for n in one.edits.device_nodes] == [
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap75",
            "/dev/nvidia-caps/nvidia-cap76",
        ]
        assert one.attribute("profile") == "1g.10gb" and one.attribute("parentUUID") == "GPU-mig-on"
        assert latest[MIG1].ids_env == "NVIDIA_VISIBLE_DEVICES"
        assert {n.path for n in latest[MIG1].common_edits.device_nodes} >= {"/dev/nvidiactl"}

        assert await asyncio.to_thread(fake.wait_registered, 3)
        fake.inject_xid("GPU-mig-on", 79)
        await sink.wait_for(
            lambda s: all(not d.healthy for r in (MIG1, MIG3) for d in s[r].devices) and s[WHOLE].healthy_count() == 2
        )
        assert sink.latest[MIG3].get("MIG-aaaa-0003").health is Health.UNHEALTHY


async def test_every_profile_with_the_gpu_s_counter_set(world: World, nv, sink) -> None:
    fake = mig_machine()
    w = laid_out(world, nv, fake)
    (w.dev_root / "proc/driver/nvidia/capabilities/gpu0/mig/gi8/ci0/access").unlink()  # one unreadable
    res = nv.resources({"name": ALL, "options": {"mig_profiles": ["*"], "reprobe_interval_s": 3600}})
    async with nv.running(nv.backend(res, w), sink):
        snap = sink.latest[ALL]
    assert snap.ids == ("MIG-aaaa-0001", "MIG-aaaa-0003")
    assert "capability" in dict(snap.skipped)["MIG-aaaa-0002"]
    (counters,) = snap.sharing.counter_sets
    assert counters.name == "gpu-0-mig" and dict(counters.counters) == {"slices": "7", "memory": str(80 * 1024**3)}
    (used,) = snap.get("MIG-aaaa-0003").sharing.consumes_counters
    assert used.counter_set == "gpu-0-mig" and dict(used.counters) == {"slices": "3", "memory": str(40192 << 20)}


def test_a_bad_profile_is_refused(nv) -> None:
    with pytest.raises(ConfigError) as info:
        nv.resources({"name": MIG1, "options": {"mig_profiles": ["1g10gb"]}})
    assert info.value.path == "$.resources[0].options.mig_profiles[0]" and "1g.10gb" in info.value.message
