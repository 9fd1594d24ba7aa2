"""The NVIDIA backend's ``options``: which GPUs a resource takes, health, driver files, sharing.

```yaml
- name: nvidia.com/h100
  backend: nvidia
  options:
    selectors: [{model: "*H100*", memory_min: 70GiB}]  # any selector may match; fields AND
    fail_on_init_error: false       # true: no NVML / no GPU for this resource -> exit status 2
    driver_root: /run/nvidia/driver # mount the driver's files from here (default: none)
    ignored_xids: [13, 31, 43, 45, 68, 109]
    reprobe_interval_s: 30          # how often unhealthy GPUs are asked again
    clean_probes: 3                 # consecutive clean probes before Healthy again
    replica_strategy: spread        # with replicas > 1: spread over GPUs, or pack onto few
    mig_profiles: []                # ["1g.10gb"] or ["*"]: the MIG devices that exist on GPUs with MIG on
    shared: false                   # DRA: several claims per GPU, each taking part of its memory
```

A selector's ``model`` is a glob over the NVML name (case-insensitive); ``memory_min`` and
``memory_max`` are sizes (``80GiB``, ``24G``, or bytes as an integer), both inclusive; ``uuids``
and ``indices`` list GPUs. This module only describes and checks; nothing here does I/O.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attrs import field, frozen

from cdiplug.sdk import CheckedOptions, converter, register_enum

from .nvml import GpuInfo

# Application errors (NVIDIA's list): a program's fault, not the GPU's. The reference NVIDIA
# device plugin ignores the same ones.
DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)

DEFAULT_DRIVER_FILES: tuple[str, ...] = (
    "usr/bin/nvidia-smi",
    "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
    "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "usr/lib64/libnvidia-ml.so.1",
    "usr/lib64/libcuda.so.1",
)


class ReplicaStrategy(str, enum.Enum):
    """How preferred allocation places replicas (``replicas: N``) of shared GPUs."""

    SPREAD = "spread"  # as many different GPUs as possible
    PACK = "pack"  # as few different GPUs as possible


register_enum(ReplicaStrategy)

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3, "ti": 1024**4, "tib": 1024**4,
}  # fmt: skip
_MIG_PROFILE = re.compile(r"[1-8]g\.[0-9]{1,4}gb")
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


class MemorySize(int):
    """A size in bytes, written as an integer or as ``80GiB`` / ``24G`` / ``512Mi``."""

    @classmethod
    def parse(cls, value: Any) -> MemorySize:
        if isinstance(value, bool):
            raise ValueError("expected a size such as 80GiB, got a boolean")
        if isinstance(value, int):
            if value < 0:
                raise ValueError(f"a size is 0 or more, got {value}")
            return cls(value)
        if not isinstance(value, str):
            raise ValueError(f"expected a size such as 80GiB, got {type(value).__name__} {value!r}")
        m = _SIZE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"expected a size such as 80GiB, 24G or 512Mi, got {value!r}")
        return cls(int(float(m.group(1)) * _UNITS[unit]))

    def __str__(self) -> str:
        return human_size(int(self))


def human_size(n: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n}B"


converter.register_structure_hook(MemorySize, lambda v, _t: MemorySize.parse(v))


@frozen
class GpuSelector:
    """Every field that is set must match; an empty selector matches every GPU."""

    model: str | None = None  # glob over the NVML product name, case-insensitive ("*H100*")
    memory_min: MemorySize | None = None  # least memory, inclusive (80GiB, 24G, or bytes)
    memory_max: MemorySize | None = None  # most memory, inclusive
    uuids: tuple[str, ...] | None = None  # these GPUs, by UUID
    indices: tuple[int, ...] | None = None  # these GPUs, by NVML index

    def matches(self, gpu: GpuInfo) -> bool:
        if self.model is not None and not fnmatch.fnmatchcase(gpu.name.lower(), self.model.lower()):
            return False
        if self.memory_min is not None and gpu.memory < self.memory_min:
            return False
        if self.memory_max is not None and gpu.memory > self.memory_max:
            return False
        if self.uuids is not None and gpu.uuid not in self.uuids:
            return False
        return not (self.indices is not None and gpu.index not in self.indices)

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.model is not None and not self.model.strip():
            yield "model", "a model glob must not be empty"
        if self.memory_min is not None and self.memory_max is not None and self.memory_min > self.memory_max:
            yield "memory_max", f"memory_max {self.memory_max} is below memory_min {self.memory_min}"
        for i, uuid in enumerate(self.uuids or ()):
            if not uuid.strip():
                yield f"uuids[{i}]", "a GPU UUID must not be empty"
        for i, index in enumerate(self.indices or ()):
            if index < 0:
                yield f"indices[{i}]", f"a GPU index is 0 or more, got {index}"
        if self.uuids == () or self.indices == ():
            yield ("uuids" if self.uuids == () else "indices"), "an empty list selects no GPU; leave it out instead"


@frozen
class NvidiaOptions(CheckedOptions):
    selectors: tuple[GpuSelector, ...] = ()
    fail_on_init_error: bool = False
    driver_root: Path | None = None
    # files under driver_root mounted into containers (those that exist)
    driver_files: tuple[str, ...] = DEFAULT_DRIVER_FILES
    # XID errors that leave the GPU Healthy (a program's fault, not the GPU's)
    ignored_xids: tuple[int, ...] = field(default=DEFAULT_IGNORED_XIDS)
    reprobe_interval_s: float = 30.0
    clean_probes: int = 3
    replica_strategy: ReplicaStrategy = ReplicaStrategy.SPREAD
    # MIG devices that exist on the selected GPUs with MIG mode on, by profile ("1g.10gb"; "*":
    # every one); empty: whole GPUs with MIG off only. cdiplug never changes MIG (.mig).
    mig_profiles: tuple[str, ...] = ()
    # DRA: each whole GPU may be allocated to several claims at once, each taking part of its
    # memory (KEP-5075: 1GiB when a claim asks none, in whole GiB); only the scheduler's
    # accounting: nothing on the GPU enforces it (the container learns its share in env).
    shared: bool = False

    def takes_mig(self, profile: str) -> bool:
        return "*" in self.mig_profiles or profile in self.mig_profiles

    def selects(self, gpu: GpuInfo) -> bool:
        """No selectors: every GPU; else any selector that matches."""
        return not self.selectors or any(s.matches(gpu) for s in self.selectors)

    def problems(self) -> Iterator[tuple[str, str]]:
        for i, selector in enumerate(self.selectors):
            for name, problem in selector.problems():
                yield f"selectors[{i}].{name}", problem
        for i, xid in enumerate(self.ignored_xids):
            if xid < 0:
                yield f"ignored_xids[{i}]", f"an XID is 0 or more, got {xid}"
        if not self.reprobe_interval_s > 0:
            yield "reprobe_interval_s", f"must be more than 0, got {self.reprobe_interval_s}"
        for i, profile in enumerate(self.mig_profiles):
            if profile != "*" and not _MIG_PROFILE.fullmatch(profile):
                yield f"mig_profiles[{i}]", f"a MIG profile is <slices>g.<memory>gb (1g.10gb) or *, got {profile!r}"
        if self.shared and self.mig_profiles:
            yield "shared", "MIG devices are not shared by memory; share whole GPUs (mig_profiles empty)"
        if self.clean_probes < 1:
            yield "clean_probes", f"must be at least 1, got {self.clean_probes}"
        if self.driver_root is not None and not self.driver_root.is_absolute():
            yield "driver_root", f"must be an absolute path, got {str(self.driver_root)!r}"
        for i, name in enumerate(self.driver_files):
            parts = Path(name).parts
            if not name or Path(name).is_absolute() or ".." in parts:
                yield f"driver_files[{i}]", f"must be a path inside driver_root without '..', got {name!r}"
