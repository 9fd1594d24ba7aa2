"""The NVIDIA backend's per-claim configuration (cdiplug_backends.nvidia.claim_config, ``kind: NvidiaConfig``).

The real NvidiaBackend on a fake NVML machine (FakeNvml); parameters go through the DRA front
end's real decoding (cdiplug.dra.claim_config). Covers: time-slicing and MPS settings become the
container's env and nothing else (the GPU's device nodes stay, nothing is prepared: configure
has no NVML handle to change a GPU with); NVIDIA's camelCase field names; entries for the same
request merge (a class's strategy, a claim's limits); bad values and unknown fields name the
field, the claim and the request; no sharing: the device as it is.
"""

from __future__ import annotations

from typing import Any

import pytest

from cdiplug.dra import claim_config
from cdiplug.dra.claims import AllocatedClaim, AllocatedDevice, ClaimRef, ConfigEntry, ConfigSource
from cdiplug.errors import InvalidRequest
from cdiplug.models.devices import Device
from cdiplug.models.world import World
from cdiplug_backends.nvidia.testing import FakeNvml

GPU = "GPU-5a1c0000-0000-4000-8000-000000000005"
REF = ClaimRef("default", "gpu-claim", "u1")


def claim(*parameters: dict[str, Any]) -> AllocatedClaim:
    entries = tuple(
        ConfigEntry(source, (), {"apiVersion": "cdiplug.dev/v1alpha1", "kind": "NvidiaConfig", **p})
        for source, p in zip([ConfigSource.CLASS, ConfigSource.CLAIM], parameters)
    )
    return AllocatedClaim(REF, (AllocatedDevice("gpu", "n1", "gpu-5"),), entries)


async def test_sharing_is_applied_through_env_only(world: World, nv, sink) -> None:
    fake = FakeNvml.nvswitch8()
    w = nv.machine(world, fake)
    backend = nv.backend(nv.resources({"name": "nvidia.com/gpu"}), w)
    async with nv.running(backend, sink):
        device = sink.latest["nvidia.com/gpu"].get(GPU)
    assert device is not None

    def env(*parameters: dict[str, Any]) -> dict[str, str]:
        shaped = claim_config.configure(claim(*parameters), {"gpu-5": device}, "nvidia.com/gpu", backend)["gpu-5"]
        assert shaped.device.edits.device_nodes == device.edits.device_nodes and shaped.prepare
        return {k: v for k, v in shaped.device.edits.env if (k, v) not in device.edits.env}

    ts = {"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long", "maxConnections": 4}}}
    assert env(ts) == {
        "CDIPLUG_GPU_SHARING": "TimeSlicing",
        "CDIPLUG_GPU_TIMESLICE_INTERVAL": "Long",
        "CUDA_DEVICE_MAX_CONNECTIONS": "4",
    }
    mps = {
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {"defaultActiveThreadPercentage": 25, "defaultPinnedDeviceMemoryLimit": "10Gi"},
        }
    }
    assert env(mps) == {
        "CDIPLUG_GPU_SHARING": "MPS",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
    }
    # The class says MPS, the claim sets a limit: merged field by field.
    merged = env({"sharing": {"strategy": "MPS"}}, {"sharing": {"mpsConfig": {"defaultActiveThreadPercentage": 50}}})
    assert merged == {"CDIPLUG_GPU_SHARING": "MPS", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    assert env({}) == {}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}},
            "must be between 1 and 100, got 0 @ $.parameters.sharing.mpsConfig.defaultActiveThreadPercentage",
        ),
        (
            {"sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}},
            "is for strategy MPS, not TimeSlicing @ $.parameters.sharing.mpsConfig",
        ),
        ({"sharing": {"strategy": "Spatial"}}, "expected one of 'TimeSlicing', 'MPS', got 'Spatial'"),
        ({"sharing": {"shairng": 1}}, 'unknown field "shairng" @ $.parameters.sharing'),
        (
            {"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}},
            "expected a size such as 80GiB",
        ),
    ],
)
def test_bad_sharing_names_the_field_the_claim_and_the_request(
    world: World, nv, parameters: dict[str, Any], message: str
) -> None:
    backend = nv.backend(nv.resources({"name": "nvidia.com/gpu"}), world)
    with pytest.raises(InvalidRequest) as caught:
        claim_config.configure(claim({}, parameters), {"gpu-5": Device(GPU)}, "nvidia.com/gpu", backend)
    assert message in str(caught.value) and "(claim default/gpu-claim, request gpu)" in str(caught.value)
