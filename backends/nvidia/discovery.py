"""Finding GPUs: what NVML and sysfs say about each one, which resource takes it, its snapshot.

Per GPU (:class:`Gpu`): NVML's facts (UUID = the device ID, index, minor, name, memory, PCI bus ID,
MIG mode) and the NUMA node from ``<sysfs_root>/bus/pci/devices/<addr>/numa_node`` (none when the
kernel says -1). A GPU goes to the first resource whose selectors take it (:func:`assign`).

Container edits: each GPU gets ``/dev/nvidia<minor>``; the resource's common edits are the control
nodes that exist under ``--dev-root`` (``/dev/nvidiactl``, ``/dev/nvidia-uvm``,
``/dev/nvidia-uvm-tools``, ``/dev/nvidia-modeset``) plus the optional driver mounts; the IDs env
var is ``NVIDIA_VISIBLE_DEVICES``. Blocking functions here are called through
``asyncio.to_thread`` by the backend.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from attrs import field, frozen

from cdiplug.errors import InputError
from cdiplug.files import read_bounded
from cdiplug.model import MAX_NUMA_NODE, AttributeValue, ContainerEdits, Device, DeviceNode, DeviceSnapshot, Health, Version
from cdiplug.resource import ResourceConfig
from cdiplug.world import World

from .nvml import GpuInfo, Nvml, NvmlError
from .options import NvidiaOptions, human_size

log = logging.getLogger(__name__)

IDS_ENV = "NVIDIA_VISIBLE_DEVICES"
CONTROL_NODES: tuple[str, ...] = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


@frozen
class Gpu:
    """One GPU as found: NVML's facts, its NUMA node, and the NVML handle (not compared)."""

    info: GpuInfo
    numa_node: int | None = None
    pcie_root: str | None = None  # the PCIe root complex (``pci0000:00``), for DRA
    handle: object = field(default=None, eq=False, repr=False)

    @property
    def uuid(self) -> str:
        return self.info.uuid

    @property
    def device_path(self) -> str:
        return f"/dev/nvidia{self.info.minor}"


@frozen
class Inventory:
    """Every GPU NVML listed, and those it could not describe (``(what, why)``)."""

    gpus: tuple[Gpu, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()


def numa_node(sysfs_root: Path, bus_id: str) -> int | None:
    """The NUMA node of a PCI device from sysfs; None when unknown (-1, missing, unreadable)."""
    if "/" in bus_id or bus_id in ("", ".", ".."):
        return None  # never build a path that could leave the sysfs folder
    path = Path(sysfs_root) / "bus/pci/devices" / bus_id / "numa_node"
    try:
        text = (read_bounded(path, 64, "numa_node") or b"").decode("ascii").strip()
        node = int(text)
    except (InputError, ValueError):  # not a regular file, too long, not ASCII, not a number
        return None
    if node > MAX_NUMA_NODE:
        log.warning("GPU %s: NUMA node %d is out of range 0..%d; NUMA node unknown", bus_id, node, MAX_NUMA_NODE)
        return None
    return node if node >= 0 else None


_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
# The attribute Kubernetes standardised for "devices on the same PCIe root" (KEP-5491).
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"


def pcie_root(sysfs_root: Path, bus_id: str) -> str | None:
    """The PCIe root complex of a PCI device from its real sysfs path; None when unknown."""
    if "/" in bus_id or bus_id in ("", ".", ".."):
        return None
    real = os.path.realpath(Path(sysfs_root) / "bus/pci/devices" / bus_id)
    return next((part for part in real.split(os.sep) if _PCIE_ROOT.fullmatch(part)), None)


def discover(nvml: Nvml, world: World) -> Inventory:
    """Every GPU NVML knows, in index order. NVML must be initialized. Blocking.

    A GPU NVML cannot describe is listed in ``skipped``; failing to count GPUs raises NvmlError.
    """
    gpus: list[Gpu] = []
    skipped: list[tuple[str, str]] = []
    for index in range(nvml.device_count()):
        try:
            handle, info = nvml.gpu_info(index)
        except NvmlError as exc:
            log.error("skipping GPU %d: NVML cannot describe it: %s", index, exc)
            skipped.append((f"GPU {index}", f"NVML cannot describe it: {exc}"))
            continue
        bus_id = info.pci_bus_id
        gpus.append(
            Gpu(
                info=info,
                numa_node=numa_node(world.sysfs_root, bus_id),
                pcie_root=pcie_root(world.sysfs_root, bus_id),
                handle=handle,
            )
        )
    return Inventory(gpus=tuple(gpus), skipped=tuple(skipped))


def assign(gpus: Sequence[Gpu], resources: Sequence[ResourceConfig[NvidiaOptions]]) -> dict[str, tuple[Gpu, ...]]:
    """Which GPUs each resource gets: the first resource (in config order) that selects a GPU wins."""
    taken: dict[str, list[Gpu]] = {r.name: [] for r in resources}
    for gpu in gpus:
        for r in resources:
            options: NvidiaOptions = r.options
            if options.selects(gpu.info):
                taken[r.name].append(gpu)
                break
    return {name: tuple(found) for name, found in taken.items()}


def node_present(world: World, path: str) -> bool:
    return world.host_path(path).exists()


def control_nodes(world: World) -> tuple[DeviceNode, ...]:
    """The NVIDIA control device nodes that exist under the dev root (blocking)."""
    return tuple(DeviceNode(path=p, permissions="rw") for p in CONTROL_NODES if node_present(world, p))


def gpu_attributes(gpu: Gpu) -> dict[str, str]:
    info = gpu.info
    mig = "unsupported" if info.mig_enabled is None else ("enabled" if info.mig_enabled else "disabled")
    return {
        "vendor": "NVIDIA",
        "model": info.name,
        "index": str(info.index),
        "minor": str(info.minor),
        "memory": human_size(info.memory),
        "pci_address": info.pci_bus_id,
        "mig_mode": mig,
    }


def dra_attributes(gpu: Gpu) -> dict[str, AttributeValue]:
    """Typed attributes for DRA claims to select on (CEL), beside the strings above."""
    info = gpu.info
    out: dict[str, AttributeValue] = {"productName": info.name, "uuid": info.uuid, "gpuIndex": info.index}
    if info.architecture is not None:
        out["architecture"] = info.architecture
    if info.compute_capability is not None:
        out["cudaComputeCapability"] = Version(f"{info.compute_capability[0]}.{info.compute_capability[1]}.0")
    if info.driver_version is not None:
        out["driverVersion"] = Version(_semver(info.driver_version))
    if gpu.numa_node is not None:
        out["numaNode"] = gpu.numa_node
    if gpu.pcie_root is not None:
        out[PCIE_ROOT_ATTRIBUTE] = gpu.pcie_root
    return out


def _semver(version: str) -> str:
    """A driver version as semver: ``550.54`` gets its ``.0``, and leading zeros go (an H200's
    driver reports ``580.159.04``, which semver, and so the API server, refuses as a version)."""
    parts = [str(int(p)) if p.isdigit() else p for p in version.split(".")]
    return ".".join((parts + ["0", "0"])[:3]) if len(parts) < 3 else ".".join(parts)


def to_device(gpu: Gpu, health: Health) -> Device:
    return Device(
        id=gpu.uuid,
        health=health,
        numa_nodes=() if gpu.numa_node is None else (gpu.numa_node,),
        edits=ContainerEdits(device_nodes=(DeviceNode(path=gpu.device_path, permissions="rw"),)),
        attributes={**gpu_attributes(gpu), **dra_attributes(gpu)},
        capacity={"memory": str(gpu.info.memory)},
    )


def build_snapshot(
    resource: str,
    gpus: Iterable[Gpu],
    health: Mapping[str, Health],
    common_edits: ContainerEdits,
    skipped: Iterable[tuple[str, str]] = (),
) -> DeviceSnapshot:
    """The resource's snapshot; GPUs missing from ``health`` are Healthy."""
    devices = [to_device(g, health.get(g.uuid, Health.HEALTHY)) for g in gpus]
    return DeviceSnapshot(
        resource=resource,
        devices=devices,
        common_edits=common_edits if devices else ContainerEdits(),
        ids_env=IDS_ENV,
        skipped=tuple(skipped),
    )
