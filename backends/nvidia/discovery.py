"""Finding GPUs: what NVML and sysfs say about each one, which resource takes it, its snapshot.

Per GPU (:class:`Gpu`): NVML's facts (UUID = the device ID, index, minor, name, memory, PCI bus ID,
MIG mode) and the NUMA node from ``<sysfs_root>/bus/pci/devices/<addr>/numa_node`` (none when the
kernel says -1). A GPU goes to the first resource whose selectors take it (:func:`assign`).

MIG (:mod:`.mig`): a GPU with MIG mode on is never a device itself; its MIG devices that exist
(read here with their capability nodes) go to the resources whose ``mig_profiles`` take them
(:func:`assign_migs`: each MIG device to the first such resource, so one GPU may feed several,
one per profile as NVIDIA's ``mig.strategy: mixed`` names them); resources without
``mig_profiles`` get only GPUs with MIG off (:func:`assign`).

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

from cdiplug.sdk import (
    MAX_NUMA_NODE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    AttributeValue,
    ContainerEdits,
    Device,
    DeviceNode,
    DeviceSharing,
    DeviceSnapshot,
    Health,
    HealthCause,
    InputError,
    PoolSharing,
    RequestPolicy,
    ResourceConfig,
    Version,
    World,
    read_bounded,
)

from . import mig
from .mig import MigInfo
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
    # With MIG mode on: its MIG devices with their container edits, and its compute slices.
    migs: tuple[tuple[MigInfo, ContainerEdits], ...] = ()
    mig_slices: int | None = None

    @property
    def mig_on(self) -> bool:
        return bool(self.info.mig_enabled)

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
        migs: list[tuple[MigInfo, ContainerEdits]] = []
        slices = None
        if info.mig_enabled:
            try:
                found, slices = mig.read_migs(nvml, handle), mig.gpu_slices(nvml, handle)
            except NvmlError as exc:
                log.error("GPU %d has MIG mode on, but NVML cannot list its MIG devices: %s", index, exc)
                skipped.append((info.uuid, f"MIG mode is on and NVML cannot list its MIG devices: {exc}"))
                found = ()
            for m in found:
                try:
                    migs.append((m, mig.mig_edits(world, info, m)))
                except InputError as exc:
                    skipped.append((m.uuid, f"MIG device of GPU {index}: cannot read its capability nodes: {exc}"))
        gpus.append(
            Gpu(
                info=info,
                numa_node=numa_node(world.sysfs_root, bus_id),
                pcie_root=pcie_root(world.sysfs_root, bus_id),
                handle=handle,
                migs=tuple(migs),
                mig_slices=slices,
            )
        )
    return Inventory(gpus=tuple(gpus), skipped=tuple(skipped))


def assign(gpus: Sequence[Gpu], resources: Sequence[ResourceConfig[NvidiaOptions]]) -> dict[str, tuple[Gpu, ...]]:
    """Which GPUs each resource gets: a GPU with MIG off goes to the first resource (in config
    order) without ``mig_profiles`` that selects it; a GPU with MIG on to every resource with
    ``mig_profiles`` that gets one of its MIG devices (:func:`assign_migs`)."""
    taken: dict[str, list[Gpu]] = {r.name: [] for r in resources}
    migs = assign_migs(gpus, resources)
    for gpu in gpus:
        if gpu.mig_on:
            for name, found in migs.items():
                if any(g is gpu for g, _, _ in found):
                    taken[name].append(gpu)
            continue
        for r in resources:
            options: NvidiaOptions = r.options
            if not options.mig_profiles and options.selects(gpu.info):
                taken[r.name].append(gpu)
                break
    return {name: tuple(found) for name, found in taken.items()}


def assign_migs(
    gpus: Sequence[Gpu], resources: Sequence[ResourceConfig[NvidiaOptions]]
) -> dict[str, tuple[tuple[Gpu, MigInfo, ContainerEdits], ...]]:
    """Which MIG devices each resource with ``mig_profiles`` gets: each to the first whose
    selectors take its GPU and whose profiles name its own (or ``*``)."""
    taken: dict[str, list[tuple[Gpu, MigInfo, ContainerEdits]]] = {r.name: [] for r in resources if r.options.mig_profiles}
    for gpu in gpus:
        for m, edits in gpu.migs:
            for r in resources:
                options: NvidiaOptions = r.options
                if options.takes_mig(m.profile) and options.selects(gpu.info):
                    taken[r.name].append((gpu, m, edits))
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
    out[PCI_BUS_ID_ATTRIBUTE] = info.pci_bus_id  # NVML's, normalized to sysfs's form by nvml.py
    return out


def _semver(version: str) -> str:
    """A driver version as semver: ``550.54`` gets its ``.0``, and leading zeros go (an H200's
    driver reports ``580.159.04``, which semver, and so the API server, refuses as a version)."""
    parts = [str(int(p)) if p.isdigit() else p for p in version.split(".")]
    return ".".join((parts + ["0", "0"])[:3]) if len(parts) < 3 else ".".join(parts)


SHARED_MEMORY = RequestPolicy(default="1Gi", min="1Gi", step="1Gi")  # a shared GPU's memory, as claims take it


def shared_memory_env(gpu: Gpu) -> str:
    """The env variable telling a container its share of a shared GPU's memory."""
    return f"CDIPLUG_GPU_MEMORY_{gpu.info.index}"


def to_device(gpu: Gpu, health: Health, cause: HealthCause | None = None, shared: bool = False) -> Device:
    return Device(
        id=gpu.uuid,
        health=health,
        health_cause=cause if health is Health.UNHEALTHY else None,
        numa_nodes=() if gpu.numa_node is None else (gpu.numa_node,),
        edits=ContainerEdits(device_nodes=(DeviceNode(path=gpu.device_path, permissions="rw"),)),
        attributes={**gpu_attributes(gpu), **dra_attributes(gpu)},
        capacity={"memory": str(gpu.info.memory)},
        sharing=DeviceSharing(True, {"memory": SHARED_MEMORY}, {"memory": shared_memory_env(gpu)}) if shared else None,
    )


def build_snapshot(
    resource: str,
    gpus: Iterable[Gpu],
    health: Mapping[str, Health],
    common_edits: ContainerEdits,
    skipped: Iterable[tuple[str, str]] = (),
    causes: Mapping[str, HealthCause] | None = None,
    shared: bool = False,
) -> DeviceSnapshot:
    """The resource's snapshot; GPUs missing from ``health`` are Healthy, ``causes`` say why the others are not.
    ``shared``: every GPU may be allocated to several claims, each taking part of its memory (DRA)."""
    causes = causes or {}
    devices = [to_device(g, health.get(g.uuid, Health.HEALTHY), causes.get(g.uuid), shared) for g in gpus]
    return DeviceSnapshot(
        resource=resource,
        devices=devices,
        common_edits=common_edits if devices else ContainerEdits(),
        ids_env=IDS_ENV,
        skipped=tuple(skipped),
    )


def build_mig_snapshot(
    resource: str,
    migs: Iterable[tuple[Gpu, MigInfo, ContainerEdits]],
    health: Mapping[str, Health],
    common_edits: ContainerEdits,
    skipped: Iterable[tuple[str, str]] = (),
    causes: Mapping[str, HealthCause] | None = None,
) -> DeviceSnapshot:
    """A resource of MIG devices: each as healthy as its GPU; its GPUs' counter sets (DRA)."""
    causes = causes or {}
    devices, parents = [], {}
    for gpu, m, edits in migs:
        base = to_device(gpu, health.get(gpu.uuid, Health.HEALTHY), causes.get(gpu.uuid))
        devices.append(mig.to_mig_device(gpu.info, m, edits, base))
        parents[gpu.uuid] = gpu
    sets = [mig.counter_set(g.info, g.mig_slices, (m for m, _ in g.migs)) for g in parents.values()]
    return DeviceSnapshot(
        resource=resource,
        devices=devices,
        common_edits=common_edits if devices else ContainerEdits(),
        ids_env=IDS_ENV,
        skipped=tuple(skipped),
        sharing=PoolSharing(sets),
    )


def model_labels(snapshot: DeviceSnapshot) -> dict[str, str | int]:
    """What names the GPU model for node labels (``cdiplug.dev/nvidia.com.gpu.product``, as GPU
    feature discovery's ``nvidia.com/gpu.product``): the product, memory in MiB, compute capability
    and driver version as plain integers (node affinity's ``Gt``/``Lt``), each only when every
    device of the resource has the same."""
    per_device = []
    for device in snapshot.devices:
        attributes = dict(device.attributes)
        labels: dict[str, str | int] = {}
        if isinstance(product := attributes.get("productName"), str):
            labels["product"] = product
        if isinstance(arch := attributes.get("architecture"), str):
            labels["family"] = arch
        memory = dict(device.capacity).get("memory")
        if memory is not None and memory.isdigit():
            labels["memory"] = int(memory) // (1024 * 1024)
        for name, parts in (("compute", ("major", "minor")), ("driver", ("major", "minor", "rev"))):
            version = attributes.get("cudaComputeCapability" if name == "compute" else "driverVersion")
            if isinstance(version, Version):
                for part, value in zip(parts, str(version).split("."), strict=False):
                    if value.isdigit():
                        labels[f"{name}.{part}"] = int(value)
        per_device.append(labels)
    if not per_device:
        return {}
    first, *rest = per_device
    return {k: v for k, v in first.items() if all(other.get(k) == v for other in rest)}
