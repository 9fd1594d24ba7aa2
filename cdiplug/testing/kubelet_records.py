"""What the kubelet stand-in reports, as frozen values: registrations, events and pod results.

:class:`RegistrationRecord` (with the :class:`PluginOptions` a plugin announced) records one accepted
Register call, :class:`Event` one thing the stand-in saw, and :class:`PodResult` (with one
:class:`ContainerResult` per container and its :class:`PodPhase`) what happened to a pod.
``cdiplug.testing.kubelet`` makes them and re-exports them; nothing here talks gRPC.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from attrs import field, frozen

from cdiplug.models.devices import ContainerAllocation


class PodPhase(str, enum.Enum):
    RUNNING = "Running"
    PENDING = "Pending"
    FAILED = "Failed"


@frozen
class PluginOptions:
    """What a plugin said it can do (GetDevicePluginOptions, or the options sent with Register)."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


@frozen
class RegistrationRecord:
    """One accepted Register call. Times (``time.monotonic()``): ``received_at`` the call arrived,
    ``connected_at`` the plugin was dialed and answered GetDevicePluginOptions (Register then
    returns), ``listed_at`` its first ListAndWatch list arrived (None until then)."""

    resource: str
    endpoint: str
    version: str
    options: PluginOptions  # from GetDevicePluginOptions, which the kubelet trusts
    register_options: PluginOptions  # as sent in the RegisterRequest
    received_at: float
    connected_at: float
    listed_at: float | None = None


@frozen
class Event:
    """Something the stand-in saw (``registered``, ``rejected``, ``devices``, ``disconnected``, ...)."""

    at: float
    kind: str
    resource: str = ""
    detail: str = ""


@frozen
class ContainerResult:
    """What one container got: the plugin's answer per resource, in request order."""

    name: str
    allocations: tuple[tuple[str, ContainerAllocation], ...] = field(
        default=(), converter=tuple[tuple[str, ContainerAllocation], ...]
    )

    @property
    def env(self) -> Mapping[str, str]:
        """Every env var the container got, later resources winning (as the kubelet merges them)."""
        return {k: v for _, a in self.allocations for k, v in a.env}


@frozen
class PodResult:
    """What happened to a pod: Running with its devices, Pending (reason ``Insufficient <resource>``)
    or Failed (``UnexpectedAdmissionError``, with the plugin's gRPC status in ``code``)."""

    name: str
    phase: PodPhase
    reason: str = ""
    message: str = ""
    containers: tuple[ContainerResult, ...] = field(default=(), converter=tuple[ContainerResult, ...])
    code: str | None = None  # grpc.StatusCode name when a plugin call failed

    @property
    def admitted(self) -> bool:
        return self.phase is PodPhase.RUNNING

    def device_ids(self, resource: str | None = None) -> tuple[str, ...]:
        """The devices of ``resource`` (or of all resources) over all containers, in answer order."""
        return tuple(i for c in self.containers for r, a in c.allocations if resource in (None, r) for i in a.device_ids)

    @property
    def env(self) -> Mapping[str, str]:
        return {k: v for c in self.containers for k, v in c.env.items()}

    def _all(self, name: str) -> tuple[Any, ...]:
        return tuple(x for c in self.containers for _, a in c.allocations for x in getattr(a, name))

    cdi_devices = property(lambda self: self._all("cdi_devices"), doc="CDI names over all containers")
    device_specs = property(lambda self: self._all("device_specs"), doc="DeviceNodes over all containers")
    mounts = property(lambda self: self._all("mounts"), doc="Mounts over all containers")
    annotations = property(lambda self: dict(self._all("annotations")), doc="annotations, merged")
