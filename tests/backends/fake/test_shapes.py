"""The fake backend's shared devices and partitions (cdiplug_backends.fake.shapes), through the real config loader.

Covers: ``shared`` with ``capacity`` gives devices that allow multiple allocations, with their
request policy and the env variable of the consumed amount; ``capacity: {memory: 80Gi}`` alone
is a plain capacity; partitions ``[1, 2, 4]`` give the whole device, halves and quarters, each
consuming exactly its slices of the device's counter set (so the whole overlaps every part and
two halves none), as healthy as their whole device; under the device-plugin API only whole
devices; every bad option is refused when the configuration loads, naming the option.
"""

from __future__ import annotations

import pytest

from cdiplug.config import parse_config
from cdiplug.errors import ConfigError
from cdiplug.models.devices import Health
from cdiplug.models.sharing import RequestPolicy
from cdiplug_backends.fake import FakeBackend
from cdiplug_backends.fake.claim_config import FakeClaimConfig, Mode
from cdiplug_backends.fake.shapes import quantity


def resource(options: dict, api: str = "dra"):
    extra = {"api": "dra", "dra_driver": "gpu.example.com"} if api == "dra" else {}
    data = {"resources": [{"name": "example.com/gpu", "backend": "fake", "options": options, **extra}]}
    (r,) = parse_config(data, "test.yaml").resources
    return r


def test_a_shared_device_with_a_request_policy(world):
    r = resource(
        {"count": 2, "shared": True, "capacity": {"memory": {"value": "80Gi", "default": "1Gi", "min": "1Gi", "step": "1Gi"}}}
    )
    snap = FakeBackend([r], world).snapshot(r, {})
    d = snap.get("gpu-1")
    assert d.sharing.shared and dict(d.capacity) == {"memory": "80Gi"}
    assert dict(d.sharing.capacity_policies) == {"memory": RequestPolicy(default="1Gi", min="1Gi", step="1Gi")}
    assert dict(d.sharing.capacity_env) == {"memory": "FAKE_GPU_MEMORY_1"}
    plain = resource({"capacity": {"memory": "80Gi"}})
    d = FakeBackend([plain], world).snapshot(plain, {}).get("gpu-0")
    assert d.sharing is None and dict(d.capacity) == {"memory": "80Gi"}


def test_partitions_consume_exactly_their_slices(world):
    r = resource({"count": 2, "partitions": [1, 2, 4]})
    backend = FakeBackend([r], world)
    snap = backend.snapshot(r, {})
    sets = snap.sharing.counter_sets
    assert len(snap.devices) == 2 * 7 and [c.name for c in sets] == ["gpu-0-slices", "gpu-1-slices"]
    assert dict(sets[0].counters) == {f"slice-{k}": "1" for k in range(4)}

    def slices(ident: str) -> set[str]:
        (used,) = snap.get(ident).sharing.consumes_counters
        return {name for name, _ in used.counters}

    assert slices("gpu-0") == {f"slice-{k}" for k in range(4)}
    assert slices("gpu-0-1of2") == {"slice-0", "slice-1"} and slices("gpu-0-2of2") == {"slice-2", "slice-3"}
    assert [slices(f"gpu-0-{k}of4") for k in range(1, 5)] == [{f"slice-{k}"} for k in range(4)]
    assert snap.get("gpu-1-2of4").sharing.consumes_counters[0].counter_set == "gpu-1-slices"
    half = snap.get("gpu-0-2of2")
    assert (half.attribute("whole"), half.attribute("parts")) == ("gpu-0", 2)
    assert dict(half.edits.env) == {"FAKE_GPU_DEVICE_0_2OF2": "gpu-0-2of2"}
    sick = backend.snapshot(r, {"gpu-1": Health.UNHEALTHY})
    assert sorted(d.id for d in sick.devices if not d.healthy) == sorted(
        ["gpu-1", *(f"gpu-1-{k}of{n}" for n in (2, 4) for k in range(1, n + 1))]
    )


def test_under_the_device_plugin_api_only_whole_devices(world):
    r = resource({"count": 2, "partitions": [1, 2]}, api="device-plugin")
    snap = FakeBackend([r], world).snapshot(r, {})
    assert snap.ids == ("gpu-0", "gpu-1") and snap.sharing is None
    assert all(d.sharing is None for d in snap.devices)


@pytest.mark.parametrize(
    ("options", "message", "path"),
    [
        ({"capacity": {"memory": "lots"}}, "must be a quantity such as 80Gi or 4, got 'lots'", "capacity.memory.value"),
        (
            {"capacity": {"memory": {"value": "80Gi", "default": "1Gi"}}},
            "a request policy needs shared: true",
            "capacity.memory.default",
        ),
        (
            {"shared": True, "capacity": {"memory": {"value": "8Gi", "min": "1Gi"}}},
            "valid_values and min need a default",
            "capacity.memory.default",
        ),
        (
            {"shared": True, "capacity": {"memory": {"value": "8Gi", "default": "9Gi", "min": "1Gi"}}},
            "must be between min and max",
            "capacity.memory.default",
        ),
        (
            {"shared": True, "capacity": {"memory": {"value": "8Gi", "default": "1536Mi", "min": "1Gi", "step": "1Gi"}}},
            "whole number of steps",
            "capacity.memory.default",
        ),
        (
            {"shared": True, "capacity": {"cores": {"value": "8", "default": "3", "valid_values": ["2", "4"]}}},
            "must be one of valid_values",
            "capacity.cores.default",
        ),
        (
            {"shared": True, "capacity": {"cores": {"value": "8", "default": "2", "valid_values": ["4", "2"]}}},
            "must be ascending",
            "capacity.cores.valid_values",
        ),
        (
            {"shared": True, "capacity": {"cores": {"value": "8", "default": "2", "valid_values": ["2", "16"]}}},
            "less than the policy's amounts",
            "capacity.cores.value",
        ),
        ({"capacity": {"Memory": "1Gi"}}, "capacity names are lower-case", "capacity.Memory"),
        ({"capacity": {"memory": {"value": "1Gi", "maximum": "2Gi"}}}, "unknown key 'maximum'", "capacity['memory']"),
        ({"partitions": [1, 3, 4]}, "each profile must divide the finest (4)", "partitions"),
        ({"partitions": [1, 64]}, "distinct part counts between 1 and 32", "partitions"),
        ({"partitions": [2, 2]}, "distinct part counts", "partitions"),
        ({"partitions": [1, 2], "shared": True}, "either shared or cut into partitions", "partitions"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, message, path):
    with pytest.raises(ConfigError) as info:
        resource(options)
    assert message in info.value.message and info.value.path == f"$.resources[0].options.{path}"


def test_quantities():
    assert quantity("80Gi") == 80 * 2**30 and quantity("1.5k") == 1500 and quantity("500m") == quantity("0.5")
    assert quantity("-1") is None and quantity("1Gb") is None and quantity("") is None


def test_a_configured_partition_shows_its_mode_beside_its_own_variable(world):
    r = resource({"count": 2, "partitions": [1, 2]})
    backend = FakeBackend([r], world)
    snap = backend.snapshot(r, {})
    config = FakeClaimConfig(mode=Mode.SHARED)
    for ident in ("gpu-0-1of2", "gpu-1-1of2", "gpu-1"):
        env = dict(backend.configure(r.name, snap.get(ident), config).device.edits.env)
        (own,) = [k for k in env if k.startswith("FAKE_GPU_DEVICE_") and not k.endswith("_MODE")]
        assert env[f"{own}_MODE"] == "shared", (ident, env)  # two GPUs' halves never share one variable
