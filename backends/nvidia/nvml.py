"""The one seam to NVML: the only module of cdiplug that calls pynvml (or a stand-in for it).

It takes an NVML-like module (``world.nvml``: ``pynvml`` itself or ``cdiplug_backends.nvidia.testing.FakeNvml``)
or imports ``pynvml`` lazily, calls it by pynvml's function names, and turns what comes back into
plain values (:class:`GpuInfo`, :class:`NvmlEvent`, bus IDs in sysfs spelling). Every NVML error
becomes an :class:`NvmlError` here, raised ``from`` the original; a failed ``nvmlInit`` becomes
:class:`NvmlUnavailable`. Every call blocks (event waits for up to their timeout): callers on the
event loop go through ``asyncio.to_thread``.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from attrs import frozen

from cdiplug.sdk import BackendError

T = TypeVar("T")

NO_INSTANCE = 0xFFFFFFFF


class NvmlError(BackendError):
    """An NVML call failed. ``code`` is NVML's return code (None when no call was made)."""

    def __init__(self, call: str, reason: str, code: int | None = None) -> None:
        self.call = call
        self.reason = reason
        self.code = code
        super().__init__(f"{call}: {reason}")


class NvmlUnavailable(NvmlError):
    """NVML cannot be used at all: no driver library, no driver loaded, no permission."""


class PcieLevel(enum.IntEnum):
    """How close two GPUs are on PCIe (``nvmlDeviceGetTopologyCommonAncestor``), closest first."""

    SAME_BOARD = 0  # NVML_TOPOLOGY_INTERNAL: two GPUs on one card
    SINGLE_SWITCH = 10  # NVML_TOPOLOGY_SINGLE: one PCIe switch between them
    MULTIPLE_SWITCHES = 20  # NVML_TOPOLOGY_MULTIPLE: several switches, no host bridge
    HOST_BRIDGE = 30  # NVML_TOPOLOGY_HOSTBRIDGE: the same host bridge
    SAME_CPU = 40  # NVML_TOPOLOGY_NODE: the same NUMA node / CPU socket
    ACROSS_CPUS = 50  # NVML_TOPOLOGY_SYSTEM: across the CPU interconnect


_LEVEL_NAMES = {
    "NVML_TOPOLOGY_INTERNAL": PcieLevel.SAME_BOARD,
    "NVML_TOPOLOGY_SINGLE": PcieLevel.SINGLE_SWITCH,
    "NVML_TOPOLOGY_MULTIPLE": PcieLevel.MULTIPLE_SWITCHES,
    "NVML_TOPOLOGY_HOSTBRIDGE": PcieLevel.HOST_BRIDGE,
    "NVML_TOPOLOGY_NODE": PcieLevel.SAME_CPU,
    "NVML_TOPOLOGY_SYSTEM": PcieLevel.ACROSS_CPUS,
}


@frozen
class GpuInfo:
    """What NVML says about one GPU. ``memory`` is in bytes; ``pci_bus_id`` is ``0000:3b:00.0``.

    ``mig_enabled`` is None when the GPU does not support MIG.
    """

    index: int
    uuid: str
    name: str
    minor: int
    memory: int
    pci_bus_id: str
    mig_enabled: bool | None = None
    # For DRA attributes; None when this NVML cannot tell.
    architecture: str | None = None
    compute_capability: tuple[int, int] | None = None
    driver_version: str | None = None


# nvmlDeviceGetArchitecture's answers (NVML_DEVICE_ARCH_*).
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
}


@frozen
class NvmlEvent:
    """One event from an event set. ``uuid`` is None when the event names no GPU we can identify."""

    uuid: str | None
    event_type: int
    data: int  # the XID for XID events
    is_xid: bool


def normalize_bus_id(raw: bytes | str) -> str:
    """NVML's ``00000000:3B:00.0`` (bytes, NUL-padded) -> sysfs's ``0000:3b:00.0``."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    text = text.split("\x00", 1)[0].strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            pass
    elif len(parts) == 2:  # the legacy "BB:DD.F" form carries no domain
        return f"0000:{text}"
    return text


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Nvml:
    """NVML through one module object. Every method blocks; all raise :class:`NvmlError` only."""

    def __init__(self, module: Any) -> None:
        self._m = module
        self._error_type: type[BaseException] = getattr(module, "NVMLError", Exception)

    @classmethod
    def load(cls, module: Any | None = None) -> Nvml:
        """Wrap ``module``, or import ``pynvml`` (nvidia-ml-py) when it is None."""
        if module is None:
            try:
                module = importlib.import_module("pynvml")
            except ImportError as exc:
                raise NvmlUnavailable("import pynvml", f"the nvidia-ml-py package is not installed ({exc})") from exc
        return cls(module)

    def _const(self, name: str, default: int) -> int:
        return int(getattr(self._m, name, default))

    def _code(self, name: str) -> int | None:
        value = getattr(self._m, name, None)
        return None if value is None else int(value)

    def call(self, name: str, *args: object) -> Any:
        """``module.<name>(*args)``, with NVML errors (and a missing function) as NvmlError."""
        fn = getattr(self._m, name, None)
        if fn is None:
            raise NvmlError(name, "this NVML binding has no such function")
        try:
            return fn(*args)
        except self._error_type as exc:
            code = getattr(exc, "value", None)
            raise NvmlError(name, str(exc) or f"NVML error {code}", code) from exc

    def _guard(self, name: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except NvmlError:
            raise
        except (AttributeError, TypeError, ValueError) as exc:
            # A binding returning an unexpected shape must not become a traceback in the daemon.
            raise NvmlError(name, f"unexpected answer: {exc}") from exc

    def is_code(self, exc: NvmlError, name: str) -> bool:
        """Whether ``exc`` carries NVML's error ``name`` (``NVML_ERROR_TIMEOUT``)."""
        code = self._code(name)
        return code is not None and exc.code == code

    # --- life cycle ---------------------------------------------------------------------------

    def init(self) -> None:
        try:
            self.call("nvmlInit")
        except NvmlError as exc:
            raise NvmlUnavailable("nvmlInit", exc.reason, exc.code) from exc

    def shutdown(self) -> None:
        self.call("nvmlShutdown")

    def driver_version(self) -> str:
        return _text(self.call("nvmlSystemGetDriverVersion"))

    # --- devices ------------------------------------------------------------------------------

    def device_count(self) -> int:
        return int(self.call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> object:
        return self.call("nvmlDeviceGetHandleByIndex", index)

    def handle_by_uuid(self, uuid: str) -> object:
        return self.call("nvmlDeviceGetHandleByUUID", uuid)

    def uuid(self, handle: object) -> str:
        return _text(self.call("nvmlDeviceGetUUID", handle))

    def pci_bus_id(self, handle: object) -> str:
        info = self.call("nvmlDeviceGetPciInfo", handle)
        return self._guard("nvmlDeviceGetPciInfo", lambda: normalize_bus_id(info.busId))

    def memory(self, handle: object) -> int:
        info = self.call("nvmlDeviceGetMemoryInfo", handle)
        return self._guard("nvmlDeviceGetMemoryInfo", lambda: int(info.total))

    def mig_enabled(self, handle: object) -> bool | None:
        try:
            current = self.call("nvmlDeviceGetMigMode", handle)
        except NvmlError as exc:
            if self.is_code(exc, "NVML_ERROR_NOT_SUPPORTED"):
                return None
            raise
        enabled = self._const("NVML_DEVICE_MIG_ENABLE", 1)
        return self._guard("nvmlDeviceGetMigMode", lambda: int(current[0]) == enabled)

    def _optional(self, name: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or None when NVML cannot answer it (an old driver, a binding without it)."""
        try:
            return self._guard(name, fn)
        except NvmlError:
            return None

    def architecture(self, handle: object) -> str | None:
        code = self._optional("nvmlDeviceGetArchitecture", lambda: int(self.call("nvmlDeviceGetArchitecture", handle)))
        return None if code is None else ARCHITECTURES.get(code, f"arch-{code}")

    def compute_capability(self, handle: object) -> tuple[int, int] | None:
        def read() -> tuple[int, int]:
            major, minor = self.call("nvmlDeviceGetCudaComputeCapability", handle)
            return int(major), int(minor)

        return self._optional("nvmlDeviceGetCudaComputeCapability", read)

    def gpu_info(self, index: int) -> tuple[object, GpuInfo]:
        """The handle and the facts of GPU ``index``."""
        h = self.handle(index)
        info = GpuInfo(
            index=index,
            uuid=self.uuid(h),
            name=_text(self.call("nvmlDeviceGetName", h)),
            minor=int(self.call("nvmlDeviceGetMinorNumber", h)),
            memory=self.memory(h),
            pci_bus_id=self.pci_bus_id(h),
            mig_enabled=self.mig_enabled(h),
            architecture=self.architecture(h),
            compute_capability=self.compute_capability(h),
            driver_version=self._optional("nvmlSystemGetDriverVersion", self.driver_version),
        )
        return h, info

    def probe(self, uuid: str) -> None:
        """Ask a GPU a few cheap questions by UUID; raises NvmlError when it does not answer."""
        h = self.handle_by_uuid(uuid)
        found = self.uuid(h)
        if found != uuid:
            raise NvmlError("nvmlDeviceGetUUID", f"handle for {uuid} answers as {found}")
        self.memory(h)
        self.pci_bus_id(h)

    # --- topology -----------------------------------------------------------------------------

    def common_ancestor(self, a: object, b: object) -> PcieLevel:
        raw = int(self.call("nvmlDeviceGetTopologyCommonAncestor", a, b))
        for name, level in _LEVEL_NAMES.items():
            if self._code(name) == raw:
                return level
        raise NvmlError("nvmlDeviceGetTopologyCommonAncestor", f"unknown topology level {raw}")

    def nvlink_remotes(self, handle: object) -> tuple[str, ...]:
        """The PCI bus ID at the far end of every active NVLink of a GPU (one entry per link)."""
        remotes: list[str] = []
        enabled = self._const("NVML_FEATURE_ENABLED", 1)
        for link in range(self._const("NVML_NVLINK_MAX_LINKS", 18)):
            try:
                state = self.call("nvmlDeviceGetNvLinkState", handle, link)
            except NvmlError as exc:
                # NOT_SUPPORTED / INVALID_ARGUMENT: no such link on this GPU (or no NVLink at all).
                if self.is_code(exc, "NVML_ERROR_NOT_SUPPORTED") or self.is_code(exc, "NVML_ERROR_INVALID_ARGUMENT"):
                    continue
                raise
            if int(state) != enabled:
                continue
            try:
                info = self.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            except NvmlError as exc:
                if self.is_code(exc, "NVML_ERROR_NOT_SUPPORTED"):
                    continue
                raise
            remotes.append(self._guard("nvmlDeviceGetNvLinkRemotePciInfo", lambda: normalize_bus_id(info.busId)))
        return tuple(remotes)

    # --- events -------------------------------------------------------------------------------

    @property
    def xid_event_type(self) -> int:
        return self._const("nvmlEventTypeXidCriticalError", 0x8)

    def create_event_set(self) -> object:
        return self.call("nvmlEventSetCreate")

    def register_xid_events(self, handle: object, event_set: object) -> bool:
        """Register a GPU for XID events; False when the GPU cannot report them."""
        xid = self.xid_event_type
        try:
            supported = int(self.call("nvmlDeviceGetSupportedEventTypes", handle))
        except NvmlError as exc:
            if self.is_code(exc, "NVML_ERROR_NOT_SUPPORTED"):
                return False
            raise
        if not supported & xid:
            return False
        try:
            self.call("nvmlDeviceRegisterEvents", handle, xid, event_set)
        except NvmlError as exc:
            if self.is_code(exc, "NVML_ERROR_NOT_SUPPORTED"):
                return False
            raise
        return True

    def wait(self, event_set: object, timeout_ms: int) -> NvmlEvent | None:
        """The next event, or None after ``timeout_ms`` without one."""
        try:
            data = self.call("nvmlEventSetWait", event_set, timeout_ms)
        except NvmlError as exc:
            if self.is_code(exc, "NVML_ERROR_TIMEOUT"):
                return None
            raise
        event_type = self._guard("nvmlEventSetWait", lambda: int(data.eventType))
        value = self._guard("nvmlEventSetWait", lambda: int(data.eventData))
        device = getattr(data, "device", None)
        uuid: str | None = None
        if device is not None and bool(device):
            try:
                uuid = self.uuid(device)
            except NvmlError:
                uuid = None  # an event whose GPU we cannot name: the caller re-probes
        return NvmlEvent(uuid=uuid, event_type=event_type, data=value, is_xid=bool(event_type & self.xid_event_type))

    def free_event_set(self, event_set: object) -> None:
        self.call("nvmlEventSetFree", event_set)
