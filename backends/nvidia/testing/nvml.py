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
with the machine. Fixtures (``cdiplug_backends.nvidia.testing.machines``): :meth:`FakeNvml.nvswitch8`,
:meth:`FakeNvml.nvlink_pairs`, :meth:`FakeNvml.pcie_box`.

This module never imports pynvml; the constants (``cdiplug_backends.nvidia.testing.values``, re-exported
here with the value shapes) carry the real values (a test compares them).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import machines
from .machines import FakeGpu, FakeMig, Machine, TopologyFn
from .mig import MigCalls, MigHandle
from .values import *  # noqa: F403 - pynvml's constants and shapes, under pynvml's names
from .values import (
    CONSTANTS,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    NVML_FEATURE_DISABLED,
    NVML_FEATURE_ENABLED,
    NVML_NVLINK_DEVICE_TYPE_GPU,
    NVML_NVLINK_DEVICE_TYPE_SWITCH,
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
    NVML_NVLINK_MAX_LINKS,
    NVML_TOPOLOGY_INTERNAL,
    NVML_TOPOLOGY_NODE,
    NVML_TOPOLOGY_SYSTEM,
    EventData,
    Handle,
    MemoryInfo,
    NVMLError,
    PciInfo,
    nvml_bus_id,
    nvmlEventTypeXidCriticalError,
    pci_info,
)


class _EventSet:
    def __init__(self, owner: FakeNvml) -> None:
        self.owner = owner
        self.masks: dict[int, int] = {}  # GPU index -> registered event types
        self.queue: collections.deque[EventData | int] = collections.deque()  # int: an error code to raise
        self.freed = False

    def __repr__(self) -> str:
        return f"<fake nvmlEventSet_t {id(self):#x}>"


class FakeNvml(MigCalls):
    """A pynvml-like object for a made-up machine. Thread-safe: the health thread waits on it.

    MIG devices that exist on a GPU (``FakeGpu.migs``) are answered by :class:`~.mig.MigCalls`."""

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
        for name, value in CONSTANTS.items():
            setattr(self, name, value)
        self.gpus = list(gpus)
        self.switches = frozenset(switches)  # bus IDs of NVSwitches that links may end on
        self._topology = topology
        self._init_error = init_error
        self.driver_version = driver_version
        self._handles = [Handle(i) for i in range(len(self.gpus))]
        self._mig_handles: dict[tuple[int, int], MigHandle] = {}
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

    def write_dev(
        self, dev_root: Path, control: Iterable[str] = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
    ) -> None:
        """Empty files standing for ``/dev/nvidia<minor>`` of every GPU and the control nodes."""
        dev = Path(dev_root) / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        for gpu in self.gpus:
            (dev / f"nvidia{gpu.minor}").touch()
        for name in control:
            (dev / name).touch()

    # --- fixtures (cdiplug_backends.nvidia.testing.machines) ---------------------------------------------

    @classmethod
    def nvswitch8(cls, name: str = "NVIDIA H100 80GB HBM3") -> FakeNvml:
        """8 GPUs all-to-all over 4 NVSwitches (see :func:`~cdiplug_backends.nvidia.testing.machines.nvswitch8`)."""
        return cls._of(machines.nvswitch8(name))

    @classmethod
    def nvlink_pairs(cls, name: str = "NVIDIA A100 80GB PCIe") -> FakeNvml:
        """2 sockets x 4 GPUs, NVLink bridges in pairs (see :func:`~cdiplug_backends.nvidia.testing.machines.nvlink_pairs`)."""
        return cls._of(machines.nvlink_pairs(name))

    @classmethod
    def pcie_box(cls, name: str = "NVIDIA A10") -> FakeNvml:
        """4 PCIe GPUs, no NVLink (see :func:`~cdiplug_backends.nvidia.testing.machines.pcie_box`)."""
        return cls._of(machines.pcie_box(name))

    @classmethod
    def _of(cls, machine: Machine) -> FakeNvml:
        return cls(machine.gpus, machine.topology, switches=machine.switches)

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

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self._init_error is not None:
            raise NVMLError(self._init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Handle:
        self._enter("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == text:
                code = self._failing.get(gpu.uuid)
                if code is not None:
                    raise NVMLError(code)
                return self._handles[i]
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, MigHandle):
            self._enter("nvmlDeviceGetUUID")
            return self._mig("nvmlDeviceGetUUID", handle).uuid
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._gpu("nvmlDeviceGetIndex", handle)
        return int(handle.index)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> MemoryInfo:
        if isinstance(handle, MigHandle):
            self._enter("nvmlDeviceGetMemoryInfo")
            return self.mig_memory(handle)
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        used = 512 * 1024**2
        return MemoryInfo(total=gpu.memory_total, free=gpu.memory_total - used, used=used)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> PciInfo:
        return pci_info(self._gpu("nvmlDeviceGetPciInfo", handle).pci_bus_id)

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetArchitecture", handle).architecture

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device1)
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device2)
        if device1 is device2:
            return NVML_TOPOLOGY_INTERNAL
        return self._level(device1.index, device2.index)

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", device)
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED if 0 <= link < NVML_NVLINK_MAX_LINKS else NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_DISABLED if link in gpu.down_links else NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> PciInfo:
        gpu = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", device)
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return pci_info(gpu.nvlinks[link])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        remote = gpu.nvlinks[link]
        if remote in self.switches:
            return NVML_NVLINK_DEVICE_TYPE_SWITCH
        if any(g.pci_bus_id == remote for g in self.gpus):
            return NVML_NVLINK_DEVICE_TYPE_GPU
        return NVML_NVLINK_DEVICE_TYPE_UNKNOWN

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_events

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        es = _EventSet(self)
        with self._lock:
            self._event_sets.append(es)
            self._lock.notify_all()
        return es

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & ~gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            eventSet.masks[handle.index] = eventSet.masks.get(handle.index, 0) | eventTypes
            self._lock.notify_all()

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> EventData:
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

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            eventSet.freed = True
            self._lock.notify_all()


__all__ = ["EventData", "FakeGpu", "FakeMig", "FakeNvml", "Handle", "MemoryInfo", "NVMLError", "PciInfo", "nvml_bus_id"]
