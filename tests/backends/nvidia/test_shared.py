"""Whole GPUs that several DRA claims share by memory (``shared: true``), through the NVIDIA backend on FakeNvml.

Covers: each GPU allows multiple allocations with its memory from NVML as capacity, a request
policy of whole GiB (1GiB when a claim asks none), and ``CDIPLUG_GPU_MEMORY_<index>`` for the
share a container got; without ``shared`` a GPU is given whole (no policy, no env); ``shared``
beside ``mig_profiles`` is refused in the config.
"""

from __future__ import annotations

import pytest

from cdiplug.errors import ConfigError
from cdiplug.models.sharing import RequestPolicy
from cdiplug.models.world import World
from cdiplug_backends.nvidia.testing import FakeNvml

GPU = "nvidia.com/gpu"


async def test_shared_gpus_carry_their_memory_and_a_request_policy(world: World, nv, sink) -> None:
    fake = FakeNvml.pcie_box()
    w = nv.machine(world, fake)
    res = nv.resources({"name": GPU, "api": "dra", "options": {"shared": True, "reprobe_interval_s": 3600}})
    async with nv.running(nv.backend(res, w), sink):
        snap = sink.latest[GPU]
    gpu = snap.get(fake.gpus[2].uuid)
    assert gpu.sharing.shared and dict(gpu.capacity) == {"memory": str(fake.gpus[2].memory_total)}
    assert dict(gpu.sharing.capacity_policies) == {"memory": RequestPolicy(default="1Gi", min="1Gi", step="1Gi")}
    assert dict(gpu.sharing.capacity_env) == {"memory": "CDIPLUG_GPU_MEMORY_2"}


async def test_a_gpu_not_shared_is_given_whole(world: World, nv, sink) -> None:
    fake = FakeNvml.pcie_box()
    w = nv.machine(world, fake)
    async with nv.running(nv.backend(nv.resources({"name": GPU, "options": {"reprobe_interval_s": 3600}}), w), sink):
        snap = sink.latest[GPU]
    assert all(d.sharing is None for d in snap.devices)


def test_shared_mig_devices_are_refused(nv) -> None:
    with pytest.raises(ConfigError) as info:
        nv.resources({"name": GPU, "options": {"shared": True, "mig_profiles": ["*"]}})
    assert info.value.path == "$.resources[0].options.shared"
