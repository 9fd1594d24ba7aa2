"""The kubelet stand-in's side of one registered device plugin: dialing it, the raw calls, the answers.

:func:`dial` connects to ``<kubelet_dir>/<endpoint>`` as the kubelet does while it handles a
Register call (channel ready within the dial timeout, then GetDevicePluginOptions) and returns a
:class:`PluginConnection`: channel, stub, the :class:`~cdiplug.testing.kubelet_records.Registration`
it was made for and its ListAndWatch task. Its raw calls send exactly what they are given and raise
``grpc.aio.AioRpcError`` with the plugin's status. The plugin's answers leave this module as
cdiplug's value objects (:func:`listed_devices`, ``ContainerAllocation``); protobuf stays here and
in ``cdiplug.testing.kubelet``, the stand-in's gRPC edge, which keeps the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import grpc

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.models.devices import ContainerAllocation, Device, DeviceNode, Health, Mount
from cdiplug.testing.kubelet_records import PluginOptions, RegistrationRecord


class PluginConnection:
    """The connection to one registered plugin: channel, stub, options, ListAndWatch task."""

    def __init__(self, registration: RegistrationRecord, channel: grpc.aio.Channel, stub: pb_grpc.DevicePluginStub) -> None:
        self.registration = registration
        self.channel = channel
        self.stub = stub
        self.task: asyncio.Task[None] | None = None
        self.updates = 0

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.channel.close(grace=None)

    async def allocate(self, containers: Sequence[Sequence[str]], timeout: float) -> tuple[ContainerAllocation, ...]:
        """One Allocate call with one ContainerAllocateRequest per entry of ``containers``, as given."""
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers])
        response = await self.stub.Allocate(request, timeout=timeout)
        ids = [*containers, *[()] * len(response.container_responses)]  # more answers than asks: no IDs
        return tuple(_allocation(ids[i], r) for i, r in enumerate(response.container_responses))

    async def preferred_allocation(
        self, available: Iterable[str], must_include: Iterable[str], size: int, timeout: float
    ) -> tuple[tuple[str, ...], ...]:
        """One GetPreferredAllocation call with one container request; every container answer."""
        one = pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
        )
        request = pb.PreferredAllocationRequest(container_requests=[one])
        response = await self.stub.GetPreferredAllocation(request, timeout=timeout)
        return tuple(tuple(r.deviceIDs) for r in response.container_responses)

    async def pre_start(self, ids: Sequence[str], timeout: float) -> None:
        """One PreStartContainer call."""
        await self.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=timeout)


async def dial(
    kubelet_dir: Path, request: pb.RegisterRequest, received_at: float, dial_timeout: float, call_timeout: float
) -> PluginConnection:
    """Connect to the plugin a RegisterRequest names and ask its options, as the kubelet does before
    it answers Register. Raises AioRpcError, TimeoutError or OSError; closes the channel then."""
    path = kubelet_dir / request.endpoint
    channel = grpc.aio.insecure_channel(f"unix:{path}", options=[("grpc.default_authority", "localhost")])
    try:
        await asyncio.wait_for(channel.channel_ready(), dial_timeout)
        stub = pb_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=call_timeout)
    except BaseException:
        await channel.close(grace=None)
        raise
    registration = RegistrationRecord(
        request.resource_name,
        request.endpoint,
        request.version,
        _options(options),
        _options(request.options),
        received_at=received_at,
        connected_at=time.monotonic(),
    )
    return PluginConnection(registration, channel, stub)


def listed_devices(response: pb.ListAndWatchResponse, previous: Mapping[str, Device] | None = None) -> dict[str, Device]:
    """One ListAndWatch list as the kubelet keeps it: by ID, with health and NUMA nodes.

    A device listed as in ``previous`` (the last list) is kept as the same object, so a list
    in which one device changed costs a look at each and one new :class:`Device`.
    """
    last = previous or {}
    out: dict[str, Device] = {}
    healthy_value = Health.HEALTHY.value
    for d in response.devices:
        device_id = d.ID
        # The kubelet counts anything but "Healthy" as unhealthy.
        health = Health.HEALTHY if d.health == healthy_value else Health.UNHEALTHY
        listed = d.topology.nodes  # empty without a topology (reading never sets it)
        nodes = (listed[0].ID,) if len(listed) == 1 else tuple(n.ID for n in listed)
        kept = last.get(device_id)
        if kept is None or kept.health is not health or kept.numa_nodes != nodes:
            kept = Device(id=device_id, health=health, numa_nodes=nodes)
        out[device_id] = kept
    return out


def describe_error(exc: BaseException) -> str:
    """A failed call or dial in a few words, for events and Register's answer."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__


def _options(message: pb.DevicePluginOptions) -> PluginOptions:
    return PluginOptions(message.pre_start_required, message.get_preferred_allocation_available)


def _allocation(ids: Sequence[str], response: pb.ContainerAllocateResponse) -> ContainerAllocation:
    """A ContainerAllocateResponse as the project's value object (the kubelet's side of the edge)."""
    return ContainerAllocation(
        device_ids=tuple(ids),
        env=sorted(response.envs.items()),
        device_specs=[DeviceNode(d.container_path, d.host_path or None, d.permissions) for d in response.devices],
        mounts=[Mount(m.host_path, m.container_path, m.read_only) for m in response.mounts],
        cdi_devices=tuple(c.name for c in response.cdi_devices),
        annotations=sorted(response.annotations.items()),
    )
