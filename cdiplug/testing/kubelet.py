"""A kubelet stand-in: the kubelet's device manager, as far as a device plugin can tell.

:class:`KubeletStandIn` serves the real v1beta1 ``Registration`` service (grpc.aio) on
``<kubelet_dir>/kubelet.sock`` and behaves as ``pkg/kubelet/cm/devicemanager`` of Kubernetes:

- ``Register`` checks the API version and the resource name with the kubelet's rules and wording
  (a plain error: gRPC status UNKNOWN), dials ``<kubelet_dir>/<endpoint>``, asks
  ``GetDevicePluginOptions`` and only then answers. A new registration replaces the old connection.
- It holds ``ListAndWatch`` open: capacity counts every listed device, allocatable the healthy
  ones. When the current stream ends, every device of the resource turns unhealthy until the plugin
  registers again.
- :meth:`~KubeletStandIn.admit_pod` plays the scheduler's fit check (too few free devices: Pending,
  ``Insufficient <resource>``) and the kubelet's admission, one pod at a time: it picks devices
  (``GetPreferredAllocation`` when offered, ``available`` = healthy unallocated), calls ``Allocate``
  once per container and resource with one ContainerAllocateRequest, ``PreStartContainer`` when
  required, and keeps the allocation until :meth:`~KubeletStandIn.remove_pod`.
- :meth:`~KubeletStandIn.restart` stops, removes every file of the folder but the checkpoint (the
  kubelet cleans it at start) and serves again; allocations survive, as through the checkpoint.

Raw calls (``allocate``, ``preferred_allocation``, ``pre_start``) send exactly what they are given
and raise ``grpc.aio.AioRpcError`` with the plugin's status. :meth:`~KubeletStandIn.wait_until`
wakes on every change, never polls. Use as ``async with KubeletStandIn(folder) as kubelet:`` in one
event loop; the folder and the plugin's socket name must fit a unix socket path (107 bytes).

This module keeps the state and serves kubelet.sock. The frozen values it hands out are in
``kubelet_records``, the kubelet's pure rules in ``kubelet_rules`` and the connection to one plugin
in ``kubelet_plugin``; their public names are re-exported here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import attrs
import grpc

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.errors import CdiplugError
from cdiplug.models.devices import ContainerAllocation, Device, Health
from cdiplug.testing.kubelet_plugin import PluginConnection, describe_error, dial, listed_devices
from cdiplug.testing.kubelet_records import (
    ContainerResult,
    Event,
    PluginOptions,  # noqa: F401 - re-exported
    PodPhase,
    PodResult,
    RegistrationRecord,
)
from cdiplug.testing.kubelet_rules import API_VERSION, is_extended_resource_name, pick_devices, register_problem  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
# The kubelet keeps its checkpoint when it cleans the folder; nothing else survives.
CHECKPOINT_FILE = "kubelet_internal_checkpoint"

T = TypeVar("T")


class StandInError(CdiplugError):
    """The stand-in was used wrongly, or the resource asked for is not registered."""


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, owner: KubeletStandIn) -> None:
        self.owner = owner

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[pb.RegisterRequest, pb.Empty]
    ) -> pb.Empty:
        return await self.owner._register(request, context)


class KubeletStandIn:
    """A kubelet device manager on ``<kubelet_dir>/kubelet.sock`` (see the module docstring).

    ``dial_timeout`` bounds dialing a plugin during Register (the kubelet waits 10 s);
    ``call_timeout`` bounds every call the stand-in makes to a plugin.
    """

    def __init__(self, kubelet_dir: Path | str, *, dial_timeout: float = 10.0, call_timeout: float = 10.0) -> None:
        self.kubelet_dir = Path(kubelet_dir).absolute()
        self.dial_timeout = dial_timeout
        self.call_timeout = call_timeout
        self.started_at: float | None = None  # monotonic time kubelet.sock was last served
        self._server: grpc.aio.Server | None = None
        self._endpoints: dict[str, PluginConnection] = {}
        self._devices: dict[str, dict[str, Device]] = {}
        self._pods: dict[str, PodResult] = {}
        self._registrations: list[RegistrationRecord] = []
        self._events: collections.deque[Event] = collections.deque(maxlen=10_000)
        self._changed = asyncio.Event()
        self._admit_lock = asyncio.Lock()

    @property
    def socket_path(self) -> Path:
        return self.kubelet_dir / KUBELET_SOCKET

    # --- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> KubeletStandIn:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, wipe: bool = True) -> None:
        """Serve kubelet.sock. ``wipe`` first removes every file in the folder, as the kubelet does."""
        if self._server is not None:
            raise StandInError("the kubelet stand-in is already running")
        self.kubelet_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        if wipe:
            self.wipe()
        if len(str(self.socket_path).encode()) > 107:
            raise StandInError(f"{self.socket_path} is too long for a unix socket path (107 bytes at most)")
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise StandInError(f"cannot serve on {self.socket_path}")
        await server.start()
        self._server = server
        self.started_at = time.monotonic()
        self._record("started", detail=str(self.socket_path))

    async def stop(self) -> None:
        """Stop as a kubelet exiting: plugin connections close, kubelet.sock goes away, registrations
        and device lists are forgotten; pod allocations are kept (as in the kubelet's checkpoint)."""
        endpoints, self._endpoints = list(self._endpoints.values()), {}
        self._devices.clear()
        for endpoint in endpoints:
            await endpoint.close()
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=None)
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            self._record("stopped")

    async def restart(self, wipe: bool = True) -> None:
        """Stop, clean the folder (when ``wipe``) and serve again: plugins must notice and register
        again; until then their resources have no capacity."""
        await self.stop()
        await self.start(wipe=wipe)

    def wipe(self) -> list[Path]:
        """Remove every file (sockets included) from the folder but the kubelet's checkpoint."""
        removed = []
        for entry in sorted(self.kubelet_dir.iterdir()):
            if entry.name == CHECKPOINT_FILE or (entry.is_dir() and not entry.is_symlink()):
                continue
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed.append(entry)
        return removed

    # --- Register and ListAndWatch ------------------------------------------------------------

    async def _register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[pb.RegisterRequest, pb.Empty]
    ) -> pb.Empty:
        received_at = time.monotonic()
        resource = request.resource_name
        problem = register_problem(request.version, resource, request.endpoint, self.kubelet_dir)
        if problem is None:
            try:
                endpoint = await dial(self.kubelet_dir, request, received_at, self.dial_timeout, self.call_timeout)
            except (grpc.aio.AioRpcError, TimeoutError, OSError) as exc:
                problem = f"failed to dial device plugin: {describe_error(exc)}"
        if problem is not None:
            self._record("rejected", resource, problem)
            await context.abort(grpc.StatusCode.UNKNOWN, problem)
        old = self._endpoints.get(resource)
        self._endpoints[resource] = endpoint
        self._registrations.append(endpoint.registration)
        endpoint.task = asyncio.create_task(self._list_and_watch(endpoint), name=f"kubelet-stand-in ListAndWatch {resource}")
        if old is not None:
            self._record("replaced", resource, old.registration.endpoint)
            await old.close()
        self._record("registered", resource, request.endpoint)
        return pb.Empty()

    async def _list_and_watch(self, endpoint: PluginConnection) -> None:
        resource = endpoint.registration.resource
        reason = "stream ended"
        try:
            async for response in endpoint.stub.ListAndWatch(pb.Empty()):
                if self._endpoints.get(resource) is not endpoint:
                    return
                self._devices[resource] = listed_devices(response, self._devices.get(resource))
                endpoint.updates += 1
                if endpoint.registration.listed_at is None:
                    self._set_registration(endpoint, attrs.evolve(endpoint.registration, listed_at=time.monotonic()))
                healthy = sum(d.healthy for d in self._devices[resource].values())
                self._record("devices", resource, f"{len(response.devices)} devices, {healthy} healthy")
        except grpc.aio.AioRpcError as exc:
            reason = describe_error(exc)
        if self._endpoints.get(resource) is endpoint:
            # As the kubelet: the plugin is gone, so are its devices (until it registers again).
            for device_id, device in list(self._devices.get(resource, {}).items()):
                self._devices[resource][device_id] = attrs.evolve(device, health=Health.UNHEALTHY)
            self._record("disconnected", resource, reason)

    def _set_registration(self, endpoint: PluginConnection, registration: RegistrationRecord) -> None:
        index = next(i for i, r in enumerate(self._registrations) if r is endpoint.registration)
        self._registrations[index] = endpoint.registration = registration

    # --- what the node shows ----------------------------------------------------------------

    def is_registered(self, resource: str) -> bool:
        """Registered and its first device list has arrived."""
        endpoint = self._endpoints.get(resource)
        return endpoint is not None and endpoint.registration.listed_at is not None

    def registration(self, resource: str) -> RegistrationRecord | None:
        """The current registration of ``resource``, or None."""
        endpoint = self._endpoints.get(resource)
        return endpoint.registration if endpoint is not None else None

    @property
    def registrations(self) -> tuple[RegistrationRecord, ...]:
        """Every accepted registration since this stand-in was made, oldest first."""
        return tuple(self._registrations)

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(sorted(self._endpoints))

    def devices(self, resource: str) -> tuple[Device, ...]:
        """The last device list of ``resource`` (IDs, health, NUMA nodes), sorted by ID."""
        return tuple(sorted(self._devices.get(resource, {}).values(), key=lambda d: d.id))

    def updates(self, resource: str) -> int:
        """How many ListAndWatch lists the current registration of ``resource`` has sent."""
        endpoint = self._endpoints.get(resource)
        return endpoint.updates if endpoint is not None else 0

    def capacity(self, resource: str) -> int:
        return len(self._devices.get(resource, {}))

    def allocatable(self, resource: str) -> int:
        return sum(d.healthy for d in self._devices.get(resource, {}).values())

    def allocated(self, resource: str) -> frozenset[str]:
        """Devices of ``resource`` held by admitted pods."""
        return frozenset(i for pod in self._pods.values() for i in pod.device_ids(resource))

    @property
    def pods(self) -> Mapping[str, PodResult]:
        """Admitted pods by name."""
        return dict(self._pods)

    def describe(self) -> str:
        """One line of state, for failure messages."""
        parts = [
            f"{r}: {self.allocatable(r)}/{self.capacity(r)} allocatable" + ("" if self.is_registered(r) else " (not listed)")
            for r in sorted(set(self._endpoints) | set(self._devices))
        ]
        last = [f"{e.kind} {e.resource} {e.detail}".strip() for e in list(self._events)[-5:]]
        return "; ".join(parts or ["nothing registered"]) + f" | last events: {last}"

    # --- waiting ------------------------------------------------------------------------------

    async def wait_until(self, predicate: Callable[[], T], timeout: float = 5.0, what: str | None = None) -> T:
        """Wait until ``predicate()`` is true, re-checked on every change the stand-in sees; its value.

        Raises TimeoutError naming ``what`` and the state."""
        deadline = time.monotonic() + timeout
        while True:
            changed = self._changed
            value = predicate()
            if value:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"kubelet stand-in: gave up after {timeout} s waiting for {what or repr(predicate)}; {self.describe()}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def wait_registered(self, resource: str, timeout: float = 5.0) -> RegistrationRecord:
        """Wait until ``resource`` is registered and has sent its device list."""
        await self.wait_until(lambda: self.is_registered(resource), timeout, f"{resource} to register")
        return self._endpoints[resource].registration

    # --- pods -------------------------------------------------------------------------------

    async def admit_pod(self, name: str, requests: Mapping[str, int] | Sequence[Mapping[str, int]]) -> PodResult:
        """Schedule and admit a pod asking for ``{resource: count}`` (one container), or a list of
        such mappings (one per container). Returns Running, Pending or Failed (see PodResult).

        Running pods hold their devices until :meth:`remove_pod`; Pending and Failed pods hold none.
        """
        containers = [dict(requests)] if isinstance(requests, Mapping) else [dict(c) for c in requests]
        for container in containers:
            for resource, count in container.items():
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise StandInError(f"pod {name}: {resource} must be a count of 0 or more, got {count!r}")
        async with self._admit_lock:  # the kubelet admits pods one at a time
            if name in self._pods:
                raise StandInError(f"pod {name} is already admitted")
            result = await self._admit(name, containers)
            self._pods.pop(name, None)
            if result.admitted:
                self._pods[name] = result
            self._record(
                {PodPhase.RUNNING: "admitted", PodPhase.PENDING: "pending", PodPhase.FAILED: "failed"}[result.phase],
                detail=f"{name} {result.reason} {list(result.device_ids())}".strip(),
            )
            return result

    async def _admit(self, name: str, containers: list[dict[str, int]]) -> PodResult:
        totals: collections.Counter[str] = collections.Counter()
        for container in containers:
            totals.update({r: n for r, n in container.items() if n})
        # The scheduler's fit check: node allocatable minus what running pods requested.
        for resource, count in sorted(totals.items()):
            free = self.allocatable(resource) - len(self.allocated(resource))
            if count > free:
                return self._pending(name, resource)
        taken: dict[str, set[str]] = {r: set(self.allocated(r)) for r in totals}
        results = []
        for index, container in enumerate(containers):
            allocations = []
            for resource, count in container.items():
                if not count:
                    continue
                available = sorted(d.id for d in self.devices(resource) if d.healthy and d.id not in taken[resource])
                if len(available) < count:  # the device manager's own check
                    return self._pending(name, resource)
                try:
                    ids = await self._pick(resource, available, count)
                    allocation = await self._allocate_container(resource, ids)
                except grpc.aio.AioRpcError as exc:
                    return PodResult(
                        name,
                        PodPhase.FAILED,
                        "UnexpectedAdmissionError",
                        f"Allocate failed due to {exc.details()}, which is unexpected",
                        code=exc.code().name,
                    )
                except StandInError as exc:
                    return PodResult(name, PodPhase.FAILED, "UnexpectedAdmissionError", str(exc))
                taken[resource].update(ids)
                allocations.append((resource, allocation))
            results.append(ContainerResult(f"container-{index}", allocations))
        return PodResult(name, PodPhase.RUNNING, containers=results)

    def _pending(self, name: str, resource: str) -> PodResult:
        reason = f"Insufficient {resource}"
        return PodResult(name, PodPhase.PENDING, reason, f"0/1 nodes are available: 1 {reason}.")

    async def _pick(self, resource: str, available: list[str], count: int) -> list[str]:
        """The device manager's choice: the plugin's preference (within ``available``) first, then
        the remaining devices in ID order."""
        registration = self.registration(resource)
        preferred: Sequence[str] = ()
        if registration is not None and registration.options.get_preferred_allocation_available:
            preferred = await self.preferred_allocation(resource, available, (), count)
        return pick_devices(available, preferred, count)

    async def _allocate_container(self, resource: str, ids: list[str]) -> ContainerAllocation:
        answers = await self.allocate(resource, ids)
        if len(answers) != 1:
            raise StandInError(f"{resource}: plugin answered {len(answers)} container responses for 1 container request")
        registration = self.registration(resource)
        if registration is not None and registration.options.pre_start_required:
            await self.pre_start(resource, ids)
        return answers[0]

    def remove_pod(self, name: str) -> bool:
        """Forget an admitted pod and free its devices; False when there was no such pod."""
        pod = self._pods.pop(name, None)
        if pod is not None:
            self._record("removed", detail=name)
        return pod is not None

    # --- raw calls ----------------------------------------------------------------------------

    def _connection(self, resource: str) -> PluginConnection:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            known = ", ".join(sorted(self._endpoints)) or "none"
            raise StandInError(f"{resource} is not registered with the kubelet stand-in (registered: {known})")
        return endpoint

    async def allocate(self, resource: str, *containers: Sequence[str]) -> tuple[ContainerAllocation, ...]:
        """Send one Allocate call with one ContainerAllocateRequest per argument, exactly as given
        (``allocate(r, [])`` sends one empty request, ``allocate(r)`` none). Raises AioRpcError."""
        return await self._connection(resource).allocate(containers, self.call_timeout)

    async def preferred_allocation(
        self, resource: str, available: Iterable[str], must_include: Iterable[str] = (), size: int = 1
    ) -> tuple[str, ...]:
        """One GetPreferredAllocation container request; the plugin's answer. Raises AioRpcError."""
        connection = self._connection(resource)
        answers = await connection.preferred_allocation(available, must_include, size, self.call_timeout)
        if len(answers) != 1:
            raise StandInError(f"{resource}: {len(answers)} preferred-allocation answers for 1 request")
        return answers[0]

    async def pre_start(self, resource: str, ids: Sequence[str]) -> None:
        """One PreStartContainer call. Raises AioRpcError."""
        await self._connection(resource).pre_start(ids, self.call_timeout)

    # --- bookkeeping --------------------------------------------------------------------------

    def _record(self, kind: str, resource: str = "", detail: str = "") -> None:
        self._events.append(Event(time.monotonic(), kind, resource, detail))
        log.debug("kubelet stand-in: %s %s %s", kind, resource, detail)
        # Wake every waiter, then start a fresh event for the next change.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
