"""pynvml's vocabulary for :class:`~cdiplug_backends.nvidia.testing.nvml.FakeNvml`: constants, error and value shapes.

The ``NVML_*`` and ``nvmlEventType*`` constants carry pynvml's names and real values (a test
compares them with pynvml); :class:`NVMLError` carries NVML return codes; :class:`PciInfo`,
:class:`MemoryInfo`, :class:`EventData` and :class:`Handle` have the attribute names of what
pynvml returns. Nothing here holds state or imports pynvml; ``cdiplug_backends.nvidia.testing.nvml`` re-exports
every public name, so code and tests use them from there as from ``pynvml``.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

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
# Every constant by name: FakeNvml sets them as attributes, as the pynvml module has them.
CONSTANTS = {k: v for k, v in globals().items() if k.startswith(("NVML_", "nvmlEventType"))}

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
    busId: bytes
    busIdLegacy: bytes
    domain: int
    bus: int
    device: int
    pciDeviceId: int = 0x233010DE


@frozen
class MemoryInfo:
    total: int
    free: int
    used: int


@frozen
class EventData:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = NO_INSTANCE
    computeInstanceId: int = NO_INSTANCE


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


def pci_info(bus_id: str) -> PciInfo:
    """``nvmlDeviceGetPciInfo`` of the function at ``bus_id`` (``0000:3b:00.0``)."""
    domain, bus, rest = bus_id.split(":")
    dev = rest.split(".")[0]
    return PciInfo(
        busId=nvml_bus_id(bus_id),
        busIdLegacy=nvml_bus_id(bus_id)[4:],
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(dev, 16),
    )


# Re-exported by cdiplug_backends.nvidia.testing.nvml: every constant under pynvml's name, and the shapes.
__all__ = [*CONSTANTS, "EventData", "Handle", "MemoryInfo", "NO_INSTANCE", "NVMLError", "PciInfo", "nvml_bus_id"]
