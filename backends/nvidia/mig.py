"""MIG devices that already exist on a GPU with MIG mode on: reading them, and what a container needs.

cdiplug never changes a GPU's MIG mode nor creates or destroys MIG devices: it publishes the
ones an administrator made (``nvidia-smi mig -cgi … -C``), as NVIDIA's device plugin does with
``mig.strategy: mixed``. Per MIG device (:class:`MigInfo`, from NVML: its UUID ``MIG-…``, GPU
and compute instance IDs, slices and memory): the profile name (``1g.10gb``: the GPU-instance
slices and the memory in GB, rounded up), and its container edits: the parent's
``/dev/nvidia<minor>`` plus the two capability nodes ``/dev/nvidia-caps/nvidia-cap<N>`` of its
GPU and compute instance, whose minors the driver writes in
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>[/ci<c>]/access`` (read bounded, under the
dev root). A MIG device whose capability files cannot be read is skipped, with the reason.

For DRA (KEP-4815) each parent GPU is a counter set ``gpu-<index>-mig`` with its compute slices
and memory, and each MIG device consumes its own: never more than the GPU has, so an existing
layout always fits. Blocking functions: call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from attrs import frozen

from cdiplug.sdk import (
    ContainerEdits,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceNode,
    DeviceSharing,
    InputError,
    World,
    read_bounded,
)

from .nvml import GpuInfo, Nvml, NvmlError

CAPS_DIR = "/proc/driver/nvidia/capabilities"
_MINOR = re.compile(rb"^DeviceFileMinor:\s*([0-9]{1,9})\s*$", re.MULTILINE)


@frozen
class MigInfo:
    """One MIG device as NVML describes it; ``memory`` in bytes."""

    uuid: str
    index: int  # its index under the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    gi: int
    ci: int
    gi_slices: int
    ci_slices: int
    memory_mb: int
    memory: int

    @property
    def profile(self) -> str:
        return f"{self.gi_slices}g.{(self.memory_mb + 1023) // 1024}gb"


def read_migs(nvml: Nvml, handle: object) -> tuple[MigInfo, ...]:
    """The MIG devices that exist on a GPU with MIG mode on, in index order. Blocking."""
    out = []
    for index in range(int(nvml.call("nvmlDeviceGetMaxMigDeviceCount", handle))):
        try:
            h = nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
        except NvmlError as exc:
            if nvml.is_code(exc, "NVML_ERROR_NOT_FOUND"):
                continue  # no MIG device at this index
            raise
        attributes = nvml.call("nvmlDeviceGetAttributes", h)
        out.append(
            MigInfo(
                uuid=nvml.uuid(h),
                index=index,
                gi=int(nvml.call("nvmlDeviceGetGpuInstanceId", h)),
                ci=int(nvml.call("nvmlDeviceGetComputeInstanceId", h)),
                gi_slices=int(attributes.gpuInstanceSliceCount),
                ci_slices=int(attributes.computeInstanceSliceCount),
                memory_mb=int(attributes.memorySizeMB),
                memory=nvml.memory(h),
            )
        )
    return tuple(out)


def gpu_slices(nvml: Nvml, handle: object) -> int | None:
    """How many compute slices the whole GPU has; None when NVML cannot say."""
    try:
        return int(nvml.call("nvmlDeviceGetAttributes", handle).computeInstanceSliceCount)
    except (NvmlError, AttributeError, TypeError, ValueError):
        return None


def cap_minor(world: World, gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The minor of a GPU or compute instance's ``/dev/nvidia-caps`` node; InputError when unreadable."""
    path = f"{CAPS_DIR}/gpu{gpu_minor}/mig/gi{gi}" + ("" if ci is None else f"/ci{ci}") + "/access"
    data = read_bounded(world.host_path(path), 4096, "MIG capability file")
    m = _MINOR.search(data or b"")
    if m is None:
        raise InputError("no DeviceFileMinor line", "$", path)
    return int(m.group(1))


def mig_edits(world: World, gpu: GpuInfo, mig: MigInfo) -> ContainerEdits:
    """The parent's device node and the MIG device's two capability nodes. InputError when unreadable."""
    caps = (cap_minor(world, gpu.minor, mig.gi), cap_minor(world, gpu.minor, mig.gi, mig.ci))
    nodes = [DeviceNode(path=f"/dev/nvidia{gpu.minor}", permissions="rw")]
    nodes += [DeviceNode(path=f"/dev/nvidia-caps/nvidia-cap{n}", permissions="r") for n in caps]
    return ContainerEdits(device_nodes=nodes)


def counter_set_name(gpu: GpuInfo) -> str:
    return f"gpu-{gpu.index}-mig"


def counter_set(gpu: GpuInfo, slices: int | None, migs: Iterable[MigInfo]) -> CounterSet:
    migs = tuple(migs)
    total = max(slices or 0, sum(m.ci_slices for m in migs))
    return CounterSet(counter_set_name(gpu), {"slices": str(total), "memory": str(max(gpu.memory, sum(m.memory for m in migs)))})


def consumption(gpu: GpuInfo, mig: MigInfo) -> CounterConsumption:
    return CounterConsumption(counter_set_name(gpu), {"slices": str(mig.ci_slices), "memory": str(mig.memory)})


def mig_attributes(gpu: GpuInfo, mig: MigInfo) -> dict[str, str | int]:
    return {
        "vendor": "NVIDIA",
        "model": gpu.name,
        "productName": gpu.name,
        "profile": mig.profile,
        "parentUUID": gpu.uuid,
        "parentIndex": gpu.index,
        "gpuInstance": mig.gi,
        "computeInstance": mig.ci,
        "uuid": mig.uuid,
    }


def to_mig_device(gpu: GpuInfo, mig: MigInfo, edits: ContainerEdits, base: Device) -> Device:
    """The MIG device as a Device: its parent's health and NUMA node (``base``), its own edits."""
    return Device(
        id=mig.uuid,
        health=base.health,
        health_cause=base.health_cause,
        numa_nodes=base.numa_nodes,
        edits=edits,
        attributes=mig_attributes(gpu, mig),
        capacity={"memory": str(mig.memory)},
        sharing=DeviceSharing(consumes_counters=[consumption(gpu, mig)]),
    )
