"""The exception tree of cdiplug.

Every failure that crosses a module boundary is one of these. Errors from the OS, NVML, gRPC or
netlink are caught where they enter and re-raised as one of these with ``raise ... from``. gRPC
status codes are chosen in one place, :func:`cdiplug.wire.lenient.status_for`, from the class of the error.
"""

from __future__ import annotations

MAX_MESSAGE = 1000  # characters of an InputError's message; the rest is cut


class CdiplugError(Exception):
    """Base of every error cdiplug raises on purpose."""


class InputError(CdiplugError):
    """A file we were given is unusable: not a regular file, too big, not UTF-8, not valid
    YAML/JSON, nested too deep, a value out of range. Names the file (``source``) and, where
    known, the place inside it (``path``, as ``$.resources[1].name`` or a line and column).
    """

    def __init__(self, message: str, path: str = "$", source: str | None = None) -> None:
        # A value quoted from a hostile file must not make a message of megabytes.
        message = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + f"… ({len(message):,} chars)"
        path = path if len(path) <= 200 else path[:200] + "…"
        self.message = message
        self.path = path
        self.source = source
        where = f" @ {path}"
        if source:
            where += f" (in {source})"
        super().__init__(message + where)


class ConfigError(InputError):
    """Bad configuration: names the field path and the file it came from."""


class BackendNotFound(ConfigError):
    """A resource names a backend that no installed entry point provides."""


class InvalidRequest(CdiplugError):
    """A request from the kubelet is malformed: unknown, duplicate or missing device IDs.

    Mapped to INVALID_ARGUMENT at the gRPC edge.
    """


class DeviceUnavailable(CdiplugError):
    """A requested device exists but cannot be handed out now (unhealthy, gone).

    Mapped to FAILED_PRECONDITION at the gRPC edge.
    """


class PreparationError(CdiplugError):
    """Preparing a device for a container failed (binding to vfio-pci, say).

    ``device`` names the device, ``reason`` says why. Mapped to FAILED_PRECONDITION.
    """

    def __init__(self, device: str, reason: str) -> None:
        self.device = device
        self.reason = reason
        super().__init__(f"cannot prepare device {device}: {reason}")


class NoSuchDevice(PreparationError):
    """The device named is not on this node (a PCI address no function has)."""

    def __init__(self, device: str, reason: str) -> None:
        super().__init__(device, reason)
        self.args = (f"no such device {device}: {reason}",)


class DeviceInUse(PreparationError):
    """Refused to prepare a device the host is still using (an interface up, a mounted disk)."""


class CdiError(CdiplugError):
    """A CDI spec could not be built, validated or written. Mapped to INTERNAL at the gRPC edge."""


class CdiNameError(CdiError):
    """A CDI kind or device name breaks the CDI naming rules."""


class SocketInUse(CdiplugError):
    """Another live process answers on the socket we were about to serve on."""


class KubeletError(CdiplugError):
    """Talking to the kubelet (Register, pod resources) failed."""


class KubernetesError(CdiplugError):
    """A call to the Kubernetes API server failed (DRA: ResourceSlices, ResourceClaims).

    ``status`` is the HTTP status when the server answered (404, 409, ...), else None.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class BackendError(CdiplugError):
    """A backend failed to discover or watch its devices (sysfs unreadable, NVML failed)."""


class BackendInitError(BackendError):
    """A backend could not start at all (no driver library, no devices where some were required)."""
