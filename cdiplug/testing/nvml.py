"""FakeNvml: a stand-in for the ``pynvml`` module, with topology, NVLink and scriptable XID events.

It answers the pynvml calls the NVIDIA backend makes, under the same names and with the same
shapes (UUIDs and names as ``str``, PCI bus IDs as ``bytes`` in NVML's ``00000000:3B:00.0``
spelling, memory and event data as objects with the same attribute names), and raises its own
:class:`NVMLError` carrying the real NVML error codes. Pass one in as ``World(nvml=FakeNvml(...))``.

Scripting: :meth:`FakeNvml.inject_xid` (a GPU by UUID, or ``None`` for an event naming no GPU),
:meth:`FakeNvml.fail_probe` / :meth:`FakeNvml.heal` (every call on that GPU fails with a code, as
a GPU that fell off the bus does), :meth:`FakeNvml.fail_init` (no driver library, no driver),
:meth:`FakeNvml.fail_wait` (the next event wait fails). :meth:`FakeNvml.write_sysfs` and
:meth:`FakeNvml.write_dev` lay out the ``numa_node`` files and ``/dev/nvidia*`` nodes that go
with the machine. Fixtures: :meth:`FakeNvml.nvswitch8`, :meth:`FakeNvml.nvlink_pairs`,
:meth:`FakeNvml.pcie_box`.

This module never imports pynvml; the constants carry the real values (a test compares them).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import define, field, frozen

# --- constants, with pynvml's names and values ----------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_NVLINK_MAX_LINKS = 18  # the real library says 36 in newer releases; callers must read it from the module

NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF

nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
nvmlEventTypeNone = 0x0000000000000000

_ERROR_NAMES = {v: k for k, v in globals().items() if k.startswith("NVML_ERROR_")}
_CONSTANTS = {k: v for k, v in globals().items() if k.startswith(("NVML_", "nvmlEventType"))}

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event on a whole GPU


class NVMLError(Exception):
    """What every failing call raises; ``value`` is the NVML return code, as in pynvml."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(value)

    def __str__(self) -> str:
        return _ERROR_NAMES.get(self.value, f"NVML error {self.value}")


# --- the value shapes pynvml returns -----------------------------------------------------------


@frozen
class PciInfo:
    busId: bytes  # noqa: N815 - pynvml's spelling
    busIdLegacy: bytes  # noqa: N815
    domain: int
    bus: int
    device: int
    pciDeviceId: int = 0x233010DE  # noqa: N815


@frozen
class MemoryInfo:
    total: int
    free: int
    used: int


@frozen
class EventData:
    device: Any
    eventType: int  # noqa: N815
    eventData: int  # noqa: N815
    gpuInstanceId: int = NO_INSTANCE  # noqa: N815
    computeInstanceId: int = NO_INSTANCE  # noqa: N815


@frozen(eq=False)
class Handle:
    """An opaque device handle; one per GPU, compared by identity like a C pointer."""

    index: int

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t {self.index}>"


def nvml_bus_id(bus_id: str) -> bytes:
    """``0000:3b:00.0`` -> ``b"00000000:3B:00.0"`` (NVML's spelling: 8-digit domain, upper case)."""
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}".encode()


def _pci_info(bus_id: str) -> PciInfo:
    domain, bus, rest = bus_id.split(":")
    dev = rest.split(".")[0]
    return PciInfo(
        busId=nvml_bus_id(bus_id),
        busIdLegacy=nvml_bus_id(bus_id)[4:],
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(dev, 16),
    )


@define
class FakeGpu:
    """One GPU of the fake machine.

    ``nvlinks`` lists, per NVLink of this GPU, the PCI bus ID at the other end (another GPU, or an
    NVSwitch); ``down_links`` are link indices reported inactive. ``mig_mode`` None means the GPU
    does not support MIG (NOT_SUPPORTED, as on pre-Ampere GPUs).
    """

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 1024**3
    pci_bus_id: str = "0000:00:00.0"
    minor: int = 0
    numa_node: int | None = None
    nvlinks: tuple[str, ...] = field(default=(), converter=tuple)
    down_links: frozenset[int] = field(default=frozenset(), converter=frozenset)
    mig_mode: int | None = NVML_DEVICE_MIG_DISABLE
    supported_events: int = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccError


class _EventSet:
    def __init__(self, owner: FakeNvml) -> None:
        self.owner = owner
        self.masks: dict[int, int] = {}  # GPU index -> registered event types
        self.queue: collections.deque[EventData | int] = collections.deque()  # int: an error code to raise
        self.freed = False

    def __repr__(self) -> str:
        return f"<fake nvmlEventSet_t {id(self):#x}>"


TopologyFn = Callable[[int, int], int]


class FakeNvml:
    """A pynvml-like object for a made-up machine. Thread-safe: the health thread waits on it."""

    NVMLError = NVMLError

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (),
        topology: Mapping[tuple[int, int], int] | TopologyFn | None = None,
        *,
        init_error: int | None = None,
        driver_version: str = "550.54.15",
        switches: Iterable[str] = (),
    ) -> None:
        for name, value in _CONSTANTS.items():
            setattr(self, name, value)
        self.gpus = list(gpus)
        self.switches = frozenset(switches)  # bus IDs of NVSwitches that links may end on
        self._topology = topology
        self._init_error = init_error
        self.driver_version = driver_version
        self._handles = [Handle(i) for i in range(len(self.gpus))]
        self._failing: dict[str, int] = {}
        self._lock = threading.Condition()
        self._event_sets: list[_EventSet] = []
        self.inits = 0  # nvmlInit calls not yet matched by nvmlShutdown
        self._waiting = 0  # threads inside nvmlEventSetWait
        self.calls: collections.Counter[str] = collections.Counter()

    # --- scripting --------------------------------------------------------------------------

    def fail_init(self, code: int | None = NVML_ERROR_LIBRARY_NOT_FOUND) -> None:
        """Make nvmlInit fail with ``code`` (None: succeed again)."""
        self._init_error = code

    def fail_probe(self, uuid: str, code: int = NVML_ERROR_GPU_IS_LOST) -> None:
        """Every call on this GPU (and finding it by UUID) fails with ``code`` until :meth:`heal`."""
        self._gpu_by_uuid(uuid)
        with self._lock:
            self._failing[uuid] = code

    def heal(self, uuid: str) -> None:
        with self._lock:
            self._failing.pop(uuid, None)

    def inject_xid(self, uuid: str | None, xid: int, event_type: int = nvmlEventTypeXidCriticalError) -> int:
        """Deliver an event to every event set that registered for it; returns how many got it.

        ``uuid=None`` is an event naming no GPU (its device handle is NULL) and reaches every set.
        """
        handle = None if uuid is None else self._handles[self.gpus.index(self._gpu_by_uuid(uuid))]
        delivered = 0
        with self._lock:
            for es in self._event_sets:
                if es.freed:
                    continue
                if handle is not None and not es.masks.get(handle.index, 0) & event_type:
                    continue
                es.queue.append(EventData(device=handle, eventType=event_type, eventData=xid))
                delivered += 1
            self._lock.notify_all()
        return delivered

    def fail_wait(self, code: int = NVML_ERROR_UNKNOWN) -> None:
        """The next nvmlEventSetWait on every live event set raises ``code``."""
        with self._lock:
            for es in self._event_sets:
                if not es.freed:
                    es.queue.append(code)
            self._lock.notify_all()

    def wait_registered(self, count: int | None = None, timeout: float = 5.0) -> bool:
        """Block until ``count`` GPUs (default: all) are registered for events in a live set."""
        want = len(self.gpus) if count is None else count
        with self._lock:
            return self._lock.wait_for(lambda: self.registered_count() >= want, timeout)

    def wait_listening(self, timeout: float = 5.0) -> bool:
        """Block until some thread is waiting in nvmlEventSetWait (the health thread is up)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._waiting > 0, timeout)

    def registered_count(self) -> int:
        return len({i for es in self._event_sets if not es.freed for i in es.masks})

    @property
    def open_event_sets(self) -> int:
        with self._lock:
            return sum(not es.freed for es in self._event_sets)

    def write_sysfs(self, sysfs_root: Path) -> None:
        """``<sysfs_root>/bus/pci/devices/<addr>/numa_node`` for every GPU (-1 where it has none)."""
        for gpu in self.gpus:
            folder = Path(sysfs_root) / "bus/pci/devices" / gpu.pci_bus_id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "numa_node").write_text(f"{-1 if gpu.numa_node is None else gpu.numa_node}\n")

    def write_dev(self, dev_root: Path, control: Iterable[str] = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")) -> None:
        """Empty files standing for ``/dev/nvidia<minor>`` of every GPU and the control nodes."""
        dev = Path(dev_root) / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        for gpu in self.gpus:
            (dev / f"nvidia{gpu.minor}").touch()
        for name in control:
            (dev / name).touch()

    # --- fixtures ---------------------------------------------------------------------------

    @classmethod
    def nvswitch8(cls, name: str = "NVIDIA H100 80GB HBM3") -> FakeNvml:
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

        return cls(gpus, level, switches=switches)

    @classmethod
    def nvlink_pairs(cls, name: str = "NVIDIA A100 80GB PCIe") -> FakeNvml:
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

        return cls(gpus, level)

    @classmethod
    def pcie_box(cls, name: str = "NVIDIA A10") -> FakeNvml:
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
            )
            for i, b in enumerate(buses)
        ]

        def level(a: int, b: int) -> int:
            return NVML_TOPOLOGY_SINGLE if a // 2 == b // 2 else NVML_TOPOLOGY_SYSTEM

        return cls(gpus, level)

    # --- internals --------------------------------------------------------------------------

    def _gpu_by_uuid(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise KeyError(f"the fake machine has no GPU {uuid}")

    def _enter(self, name: str) -> None:
        self.calls[name] += 1
        if self.inits <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, name: str, handle: Any) -> FakeGpu:
        self._enter(name)
        if not isinstance(handle, Handle) or handle.index >= len(self.gpus) or self._handles[handle.index] is not handle:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        code = self._failing.get(gpu.uuid)
        if code is not None:
            raise NVMLError(code)
        return gpu

    def _level(self, a: int, b: int) -> int:
        topo = self._topology
        if callable(topo):
            return topo(a, b)
        if topo is not None:
            if (a, b) in topo:
                return topo[(a, b)]
            if (b, a) in topo:
                return topo[(b, a)]
        na, nb = self.gpus[a].numa_node, self.gpus[b].numa_node
        return NVML_TOPOLOGY_NODE if na is not None and na == nb else NVML_TOPOLOGY_SYSTEM

    # --- the pynvml API ---------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.calls["nvmlInit"] += 1
        if self._init_error is not None:
            raise NVMLError(self._init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._enter("nvmlShutdown")
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == text:
                code = self._failing.get(gpu.uuid)
                if code is not None:
                    raise NVMLError(code)
                return self._handles[i]
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetIndex(self, handle: Any) -> int:  # noqa: N802
        self._gpu("nvmlDeviceGetIndex", handle)
        return int(handle.index)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> MemoryInfo:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        used = 512 * 1024**2
        return MemoryInfo(total=gpu.memory_total, free=gpu.memory_total - used, used=used)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> PciInfo:  # noqa: N802
        return _pci_info(self._gpu("nvmlDeviceGetPciInfo", handle).pci_bus_id)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:  # noqa: N802
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device1)
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device2)
        if device1 is device2:
            return NVML_TOPOLOGY_INTERNAL
        return self._level(device1.index, device2.index)

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetNvLinkState", device)
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED if 0 <= link < NVML_NVLINK_MAX_LINKS else NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_DISABLED if link in gpu.down_links else NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> PciInfo:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", device)
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _pci_info(gpu.nvlinks[link])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        remote = gpu.nvlinks[link]
        if remote in self.switches:
            return NVML_NVLINK_DEVICE_TYPE_SWITCH
        if any(g.pci_bus_id == remote for g in self.gpus):
            return NVML_NVLINK_DEVICE_TYPE_GPU
        return NVML_NVLINK_DEVICE_TYPE_UNKNOWN

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_events

    def nvmlEventSetCreate(self) -> _EventSet:  # noqa: N802
        self._enter("nvmlEventSetCreate")
        es = _EventSet(self)
        with self._lock:
            self._event_sets.append(es)
            self._lock.notify_all()
        return es

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:  # noqa: N802,N803
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & ~gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            eventSet.masks[handle.index] = eventSet.masks.get(handle.index, 0) | eventTypes
            self._lock.notify_all()

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> EventData:  # noqa: N802,N803
        self._enter("nvmlEventSetWait")
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self._waiting += 1
            self._lock.notify_all()
            try:
                if not self._lock.wait_for(lambda: eventSet.queue or eventSet.freed, timeoutms / 1000):
                    raise NVMLError(NVML_ERROR_TIMEOUT)
            finally:
                self._waiting -= 1
            if eventSet.freed:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            item = eventSet.queue.popleft()
        if isinstance(item, int):
            raise NVMLError(item)
        return item

    def nvmlEventSetFree(self, eventSet: Any) -> None:  # noqa: N802,N803
        self._enter("nvmlEventSetFree")
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            eventSet.freed = True
            self._lock.notify_all()


__all__ = ["EventData", "FakeGpu", "FakeNvml", "Handle", "MemoryInfo", "NVMLError", "PciInfo", "nvml_bus_id"]
