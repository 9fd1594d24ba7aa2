"""The NVIDIA backend's options through the real config parser: defaults, sizes, selectors, errors.

Errors must name the field path (``$.resources[0].options.selectors[0].memory_max``); selectors
match NVML facts (model glob case-insensitive, memory range inclusive, UUID and index lists).
"""

from __future__ import annotations

from typing import Any

import pytest

from cdiplug.config import parse_config
from cdiplug.errors import ConfigError
from cdiplug_backends.nvidia.nvml import GpuInfo
from cdiplug_backends.nvidia.options import DEFAULT_IGNORED_XIDS, GpuSelector, MemorySize, NvidiaOptions, ReplicaStrategy


def options(raw: dict[str, Any]) -> NvidiaOptions:
    config = parse_config({"resources": [{"name": "nvidia.com/gpu", "backend": "nvidia", "options": raw}]}, "test.yaml")
    return config.resources[0].options


def test_defaults() -> None:
    opts = options({})
    assert opts.selectors == ()
    assert opts.ignored_xids == DEFAULT_IGNORED_XIDS == (13, 31, 43, 45, 68, 109)
    assert opts.fail_on_init_error is False and opts.driver_root is None
    assert opts.replica_strategy is ReplicaStrategy.SPREAD
    assert opts.clean_probes == 3 and opts.reprobe_interval_s == 30.0


@pytest.mark.parametrize(
    ("text", "size"),
    [("80GiB", 80 * 2**30), ("24G", 24 * 10**9), ("512Mi", 512 * 2**20), (1024, 1024), ("1.5GiB", 3 * 2**29), ("7", 7)],
)
def test_memory_sizes(text: Any, size: int) -> None:
    assert MemorySize.parse(text) == size


@pytest.mark.parametrize(
    ("raw", "message", "where"),
    [
        ({"selectors": [{"memory_min": "80 parsecs"}]}, "expected a size such as 80GiB", "selectors[0].memory_min"),
        ({"selectors": [{"memory_min": "80GiB", "memory_max": "40GiB"}]}, "below memory_min", "selectors[0].memory_max"),
        ({"selectors": [{"indices": [-1]}]}, "a GPU index is 0 or more", "selectors[0].indices[0]"),
        ({"selectors": [{"uuids": []}]}, "an empty list selects no GPU", "selectors[0].uuids"),
        ({"selectors": [{"model": "*", "colour": "green"}]}, "colour", "selectors"),
        ({"ignored_xids": [13, "31"]}, "expected an integer", "ignored_xids"),
        ({"clean_probes": 0}, "must be at least 1", "clean_probes"),
        ({"reprobe_interval_s": 0}, "must be more than 0", "reprobe_interval_s"),
        ({"replica_strategy": "scatter"}, "expected one of 'spread', 'pack'", "replica_strategy"),
        ({"driver_root": "run/nvidia"}, "absolute path", "driver_root"),
        ({"driver_files": ["../etc/shadow"]}, "without '..'", "driver_files[0]"),
        ({"fail_on_init_error": "yes"}, "true or false", "fail_on_init_error"),
    ],
)
def test_errors_name_the_field(raw: dict[str, Any], message: str, where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        options(raw)
    assert message in str(caught.value)
    assert f"$.resources[0].options.{where}" in str(caught.value)
    assert "(in test.yaml)" in str(caught.value)


H100 = GpuInfo(index=0, uuid="GPU-1", name="NVIDIA H100 80GB HBM3", minor=0, memory=80 * 2**30, pci_bus_id="0000:18:00.0")
A10 = GpuInfo(index=1, uuid="GPU-2", name="NVIDIA A10", minor=1, memory=24 * 2**30, pci_bus_id="0000:3b:00.0")


def test_selector_fields_and_together() -> None:
    assert GpuSelector(model="*h100*").matches(H100)
    assert not GpuSelector(model="*h100*").matches(A10)
    both = GpuSelector(model="NVIDIA *", memory_min=MemorySize.parse("40GiB"))
    assert both.matches(H100) and not both.matches(A10)
    assert GpuSelector(memory_max=MemorySize.parse("24GiB")).matches(A10)  # inclusive
    assert GpuSelector(uuids=("GPU-2",)).matches(A10) and not GpuSelector(uuids=("GPU-2",)).matches(H100)
    assert GpuSelector(indices=(0,)).matches(H100) and not GpuSelector(indices=(0,)).matches(A10)
    assert GpuSelector().matches(A10)


def test_any_selector_of_a_resource_may_match() -> None:
    opts = options({"selectors": [{"uuids": ["GPU-1"]}, {"model": "*A10"}]})
    assert opts.selects(H100) and opts.selects(A10)
    assert options({}).selects(A10)
    assert not options({"selectors": [{"model": "*L4*"}]}).selects(A10)
