"""Device health for the kubelet: ``v1alpha1.DRAResourceHealth`` (KEP-4680) on a driver's ``dra.sock``.

Where the kubelet offers it, it calls ``NodeWatchResources`` and shows each device's health in
the pods' ``status.containerStatuses[].allocatedResourcesStatus``. :class:`HealthFeed` holds the
latest health of the driver's devices, fed from the backend's snapshots; every stream sends the
whole pool at once, again whenever any device's health changes, and again every
``heartbeat`` seconds with the current time as ``last_updated_time``: the kubelet takes health it
has not heard about for a while as Unknown, and a quiet pool is a healthy one, not a lost one.

The boundary: the gRPC edge of the health service and its protobuf; snapshots come in plain.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from ..api import drahealth_v1alpha1_pb2 as pb
from ..api import drahealth_v1alpha1_pb2_grpc as pb_grpc
from ..model import DeviceSnapshot
from .slices import device_name

HEARTBEAT = 10.0


class HealthFeed(pb_grpc.DRAResourceHealthServicer):
    """The health of one driver's pool, streamed to every watcher."""

    def __init__(self, pool: str, heartbeat: float = HEARTBEAT) -> None:
        self.pool = pool
        self.heartbeat = heartbeat
        self._health: dict[str, bool] = {}  # device name -> healthy
        self._changed = asyncio.Event()  # set (and replaced) on every change

    def update(self, snapshot: DeviceSnapshot) -> None:
        """Take a snapshot's health (on the event loop; never blocks)."""
        health = {device_name(d.id): d.healthy for d in snapshot.devices}
        if health == self._health:
            return
        self._health = health
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _message(self) -> pb.NodeWatchResourcesResponse:
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=self.pool, device_name=name),
                    health=pb.HEALTHY if healthy else pb.UNHEALTHY,
                    last_updated_time=int(time.time()),
                    health_check_timeout_seconds=int(self.heartbeat * 3),
                )
                for name, healthy in sorted(self._health.items())
            ]
        )

    async def NodeWatchResources(
        self,
        request: pb.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[pb.NodeWatchResourcesRequest, pb.NodeWatchResourcesResponse],
    ) -> AsyncIterator[pb.NodeWatchResourcesResponse]:
        while True:
            changed = self._changed
            yield self._message()
            try:
                await asyncio.wait_for(changed.wait(), self.heartbeat)
            except TimeoutError:
                pass  # nothing changed: say so again


def add_to_server(server: grpc.aio.Server, feed: HealthFeed) -> None:
    pb_grpc.add_DRAResourceHealthServicer_to_server(feed, server)
