"""A DRA kubelet stand-in: the kubelet's plugin watcher and DRA manager, as far as a driver can tell.

:class:`DraKubeletStandIn` watches ``plugins_registry`` (inotify, no polling) the way the
kubelet's plugin watcher does. When ``<driver>-reg.sock`` appears, :meth:`wait_registered`
dials it, calls ``GetInfo``, checks what the kubelet checks (type ``DRAPlugin``, the driver name,
an absolute endpoint, a supported service: it prefers ``v1.DRAPlugin``, then
``v1beta1.DRAPlugin``), answers ``NotifyRegistrationStatus`` and returns a
:class:`DraPluginConnection` to the driver's ``dra.sock``. That connection calls
``NodePrepareResources`` / ``NodeUnprepareResources`` over the real socket, answering frozen
:class:`ClaimResult` values, and reads the health stream (``NodeWatchResources``, ``v1beta1`` as Kubernetes 1.36 calls it or
``v1alpha1`` as earlier ones do).

Use in one event loop: ``async with DraKubeletStandIn(registry_dir) as kubelet:``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType

import grpc
from attrs import frozen

from cdiplug.api import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
    drahealth_v1beta1_pb2,
    drahealth_v1beta1_pb2_grpc,
)
from cdiplug.api import pluginregistration_v1_pb2 as reg_pb
from cdiplug.api import pluginregistration_v1_pb2_grpc as reg_grpc
from cdiplug.dra.claims import ClaimRef as ClaimRef  # the kubelet names claims as the driver reads them
from cdiplug.errors import CdiplugError
from cdiplug.toolkit.filewatch import FolderWatch

SERVICES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
# The health service's versions, as the kubelet calls them (1.36: v1beta1, before: v1alpha1).
HEALTH_SERVICES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1beta1": (drahealth_v1beta1_pb2, drahealth_v1beta1_pb2_grpc),
    "v1alpha1": (drahealth_v1alpha1_pb2, drahealth_v1alpha1_pb2_grpc),
}


@frozen
class DeviceHealthReport:
    """One device in one message of the health stream."""

    pool: str
    device: str
    health: str  # HEALTHY / UNHEALTHY / UNKNOWN
    last_updated_time: int
    timeout_seconds: int
    message: str  # why the device has this health


class RegistrationRefused(CdiplugError):
    """The plugin's GetInfo answer is one the kubelet would refuse."""


@frozen
class AnsweredDevice:
    """One device of a claim as the driver answered it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


@frozen
class ClaimResult:
    """The driver's answer for one claim: its devices, or its error."""

    devices: tuple[AnsweredDevice, ...] = ()
    error: str = ""


@frozen
class PluginInfo:
    type: str
    name: str
    endpoint: str
    versions: tuple[str, ...]


class DraPluginConnection:
    """Calls to one registered driver over its ``dra.sock``."""

    def __init__(self, info: PluginInfo, service: str, timeout: float) -> None:
        self.info = info
        self.service = service
        self.timeout = timeout
        self._pb, grpc_module = SERVICES[service]
        self._channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        self._stub = grpc_module.DRAPluginStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    def _claims(self, claims: Sequence[ClaimRef]) -> list[object]:
        return [self._pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        """NodePrepareResources; raises grpc.aio.AioRpcError when the whole call fails."""
        request = self._pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        response = await self._stub.NodePrepareResources(request, timeout=self.timeout)
        return {
            uid: ClaimResult(
                devices=tuple(
                    AnsweredDevice(tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids)) for d in r.devices
                ),
                error=r.error,
            )
            for uid, r in response.claims.items()
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources: the error per claim UID ("" when it succeeded)."""
        request = self._pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        response = await self._stub.NodeUnprepareResources(request, timeout=self.timeout)
        return {uid: r.error for uid, r in response.claims.items()}

    async def health(self, version: str = "v1alpha1") -> AsyncIterator[dict[str, str]]:
        """The health stream: per message, device name -> HEALTHY / UNHEALTHY / UNKNOWN."""
        async for message in self.health_reports(version):
            yield {r.device: r.health for r in message}

    async def health_reports(self, version: str = "v1beta1") -> AsyncIterator[list[DeviceHealthReport]]:
        """The health stream of ``version`` (v1beta1 or v1alpha1), every field of every message."""
        pb, pb_grpc = HEALTH_SERVICES[version]
        stub = pb_grpc.DRAResourceHealthStub(self._channel)
        async for message in stub.NodeWatchResources(pb.NodeWatchResourcesRequest()):
            yield [
                DeviceHealthReport(
                    pool=d.device.pool_name,
                    device=d.device.device_name,
                    health=pb.HealthStatus.Name(d.health),
                    last_updated_time=d.last_updated_time,
                    timeout_seconds=d.health_check_timeout_seconds,
                    message=d.message,
                )
                for d in message.devices
            ]


class DraKubeletStandIn:
    """The kubelet's plugin watcher on ``registry_dir`` (see the module docstring)."""

    def __init__(self, registry_dir: Path, *, prefer: str = "v1.DRAPlugin", timeout: float = 10.0) -> None:
        self.registry_dir = Path(registry_dir)
        self.prefer = prefer
        self.timeout = timeout
        self.statuses: list[tuple[str, bool]] = []  # (driver, registered) as notified
        self._watch: FolderWatch | None = None
        self._connections: list[DraPluginConnection] = []

    async def __aenter__(self) -> DraKubeletStandIn:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._watch = FolderWatch(self.registry_dir)
        await self._watch.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in self._connections:
            await conn.close()
        if self._watch is not None:
            await self._watch.__aexit__(None, None, None)

    def socket(self, driver: str, pod_uid: str | None = None) -> Path:
        """The registration socket of ``driver`` (of the daemon whose ``--pod-uid`` is ``pod_uid``)."""
        return self.registry_dir / (f"{driver}-{pod_uid}-reg.sock" if pod_uid else f"{driver}-reg.sock")

    async def wait_registered(self, driver: str, *, refuse: str | None = None, pod_uid: str | None = None) -> DraPluginConnection:
        """Wait for the driver's registration socket, register it and connect to its endpoint.

        ``refuse`` answers NotifyRegistrationStatus with that error instead (and returns nothing usable).
        """
        assert self._watch is not None, "use as async context manager"
        watch = aiter(self._watch)
        while not self.socket(driver, pod_uid).exists():
            await anext(watch)
        return await self.register(driver, refuse=refuse, pod_uid=pod_uid)

    async def register(self, driver: str, *, refuse: str | None = None, pod_uid: str | None = None) -> DraPluginConnection:
        async with grpc.aio.insecure_channel(f"unix://{self.socket(driver, pod_uid)}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            answer = await stub.GetInfo(reg_pb.InfoRequest(), timeout=self.timeout, wait_for_ready=True)
            info = PluginInfo(answer.type, answer.name, answer.endpoint, tuple(answer.supported_versions))
            problem = refuse or self._problem(info, driver)
            await stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=problem is None, error=problem or ""), timeout=self.timeout
            )
        self.statuses.append((driver, problem is None))
        if problem is not None:
            raise RegistrationRefused(problem)
        service = self.prefer if self.prefer in info.versions else next(v for v in SERVICES if v in info.versions)
        conn = DraPluginConnection(info, service, self.timeout)
        self._connections.append(conn)
        return conn

    @staticmethod
    def _problem(info: PluginInfo, driver: str) -> str | None:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if info.name != driver:
            return f"plugin name {info.name!r} is not the driver {driver!r}"
        if not Path(info.endpoint).is_absolute():
            return f"endpoint {info.endpoint!r} is not an absolute path"
        if not any(v in SERVICES for v in info.versions):
            return f"none of the versions {list(info.versions)} is supported"
        return None
