"""Made-up machines for :class:`~cdiplug_backends.nvidia.testing.nvml.FakeNvml`: :class:`FakeGpu` and the fixtures.

A :class:`Machine` is what a FakeNvml is built from: its GPUs, the PCIe topology level between two
GPU indices and the bus IDs of its NVSwitches. :func:`nvswitch8` (HGX-style, all-to-all over
NVSwitches), :func:`nvlink_pairs` (NVLink bridges in pairs) and :func:`pcie_box` (no NVLink) are
the built-in ones, used as ``FakeNvml.nvswitch8()`` and so on. This module only describes
hardware; answering pynvml calls about it is ``cdiplug_backends.nvidia.testing.nvml``'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from attrs import define, field, frozen

from .values import (
    NVML_DEVICE_MIG_DISABLE,
    NVML_TOPOLOGY_HOSTBRIDGE,
    NVML_TOPOLOGY_NODE,
    NVML_TOPOLOGY_SINGLE,
    NVML_TOPOLOGY_SYSTEM,
    nvmlEventTypeDoubleBitEccError,
    nvmlEventTypeSingleBitEccError,
    nvmlEventTypeXidCriticalError,
)

# The PCIe topology level (NVML_TOPOLOGY_*) between the GPUs of two indices.
TopologyFn = Callable[[int, int], int]


def _int_set(values: Iterable[int]) -> frozenset[int]:
    return frozenset(values)


def _str_set(values: Iterable[str]) -> frozenset[str]:
    return frozenset(values)


@frozen
class FakeMig:
    """A MIG device that already exists on a GPU with MIG mode on: its GPU and compute instance,
    its profile (``gi_slices``g.<memory>gb), and the minors of its ``/dev/nvidia-caps`` nodes."""

    uuid: str
    gi: int
    ci: int = 0
    gi_slices: int = 1
    ci_slices: int = 1
    memory_mb: int = 9856  # a 1g.10gb of an H100 80GB
    gi_cap_minor: int = 30
    ci_cap_minor: int = 31


@define
class FakeGpu:
    """One GPU of the fake machine.

    ``nvlinks`` lists, per NVLink of this GPU, the PCI bus ID at the other end (another GPU, or an
    NVSwitch); ``down_links`` are link indices reported inactive. ``mig_mode`` None means the GPU
    does not support MIG (NOT_SUPPORTED, as on pre-Ampere GPUs). ``migs`` are the MIG devices that
    exist on it (with MIG mode on); ``mig_slices`` is how many GPU-instance slices it has.
    """

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 1024**3
    pci_bus_id: str = "0000:00:00.0"
    minor: int = 0
    numa_node: int | None = None
    nvlinks: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    down_links: frozenset[int] = field(default=frozenset(), converter=_int_set)
    mig_mode: int | None = NVML_DEVICE_MIG_DISABLE
    supported_events: int = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccError
    architecture: int = 9  # NVML_DEVICE_ARCH_HOPPER
    compute_capability: tuple[int, int] = (9, 0)
    migs: tuple[FakeMig, ...] = field(default=(), converter=tuple[FakeMig, ...])
    mig_slices: int = 7


@frozen
class Machine:
    """A made-up machine: its GPUs, the PCIe level between two GPU indices, its NVSwitches' bus IDs."""

    gpus: tuple[FakeGpu, ...] = field(converter=tuple[FakeGpu, ...])
    topology: TopologyFn
    switches: frozenset[str] = field(default=frozenset(), converter=_str_set)


def nvswitch8(name: str = "NVIDIA H100 80GB HBM3") -> Machine:
    """8 GPUs, all-to-all over 4 NVSwitches (18 links each, as on an HGX H100 board).

    PCIe: pairs (0,1) (2,3) (4,5) (6,7) share a switch, 0-3 sit on NUMA node 0 and 4-7 on node
    1 behind one host bridge each. NVLink scores tie for every pair, so PCIe and NUMA decide.
    """
    switches = [f"0000:{0x10 + s:02x}:00.0" for s in range(4)]
    buses = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
    gpus = [
        FakeGpu(
            uuid=f"GPU-5a1c0000-0000-4000-8000-00000000000{i}",
            name=name,
            pci_bus_id=f"0000:{bus:02x}:00.0",
            minor=i,
            numa_node=0 if i < 4 else 1,
            # links spread over the switches: 5, 5, 4, 4 (18 in all)
            nvlinks=[switches[link % 4] for link in range(18)],
        )
        for i, bus in enumerate(buses)
    ]

    def level(a: int, b: int) -> int:
        if a // 2 == b // 2:
            return NVML_TOPOLOGY_SINGLE
        if a // 4 == b // 4:
            return NVML_TOPOLOGY_NODE
        return NVML_TOPOLOGY_SYSTEM

    return Machine(gpus, level, switches)


def nvlink_pairs(name: str = "NVIDIA A100 80GB PCIe") -> Machine:
    """2 sockets x 4 PCIe GPUs; NVLink bridges (4 links each) join pairs (0,1) (2,3) (4,5) (6,7).

    PCIe switches hold (0,2) (1,3) (4,6) (5,7), so the best PCIe neighbour is not the NVLink
    partner; a set of 4 must take both bridges of one socket.
    """
    buses = [0x17, 0x31, 0x4B, 0x65, 0x98, 0xB1, 0xCA, 0xE3]
    addr = [f"0000:{b:02x}:00.0" for b in buses]
    partner = {i: i ^ 1 for i in range(8)}
    gpus = [
        FakeGpu(
            uuid=f"GPU-a100a100-0000-4000-8000-00000000000{i}",
            name=name,
            pci_bus_id=addr[i],
            minor=i,
            numa_node=0 if i < 4 else 1,
            nvlinks=[addr[partner[i]]] * 4,
            mig_mode=NVML_DEVICE_MIG_DISABLE,
        )
        for i in range(8)
    ]

    def level(a: int, b: int) -> int:
        if a // 4 != b // 4:
            return NVML_TOPOLOGY_SYSTEM
        if a % 4 in (0, 2) and b % 4 in (0, 2) or a % 4 in (1, 3) and b % 4 in (1, 3):
            return NVML_TOPOLOGY_SINGLE
        return NVML_TOPOLOGY_HOSTBRIDGE

    return Machine(gpus, level)


def pcie_box(name: str = "NVIDIA A10") -> Machine:
    """4 PCIe GPUs, no NVLink: (0,1) under one switch on NUMA 0, (2,3) under one on NUMA 1."""
    buses = [0x3B, 0x3C, 0x86, 0x87]
    gpus = [
        FakeGpu(
            uuid=f"GPU-a10a10a1-0000-4000-8000-00000000000{i}",
            name=name,
            memory_total=24 * 1024**3,
            pci_bus_id=f"0000:{b:02x}:00.0",
            minor=i,
            numa_node=i // 2,
            mig_mode=None,
            architecture=7,  # Ampere
            compute_capability=(8, 6),
        )
        for i, b in enumerate(buses)
    ]

    def level(a: int, b: int) -> int:
        return NVML_TOPOLOGY_SINGLE if a // 2 == b // 2 else NVML_TOPOLOGY_SYSTEM

    return Machine(gpus, level)
