"""Device health for the kubelet: ``DRAResourceHealth`` (KEP-4680) ``v1alpha1`` and ``v1beta1`` on a driver's ``dra.sock``.

Where the kubelet offers it, it calls ``NodeWatchResources`` and shows each device's health in
the pods' ``status.containerStatuses[].allocatedResourcesStatus``. The kubelet v1.36.2 knows
only ``v1alpha1`` (its binary's descriptor: device, health, last_updated_time,
health_check_timeout_seconds = 4, message = 5); 1.37 moves to ``v1beta1`` with the same schema and
drops ``v1alpha1``. Both are served, with the cause as ``message``, from one :class:`HealthFeed`, which holds the latest health of the driver's devices, fed from the
backend's snapshots. Every stream sends the whole pool at once, again whenever any device's
health changes, and again every ``heartbeat`` seconds (10 s: well inside the kubelet's 30 s
freshness window) with the current time as ``last_updated_time``: the kubelet takes health it
has not heard about for a while as Unknown, and a quiet pool is a healthy one, not a lost one.

The boundary: the gRPC edge of the health service and its protobuf; snapshots come in plain.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from types import ModuleType

import attrs
import grpc

from cdiplug.api import drahealth_v1alpha1_pb2 as alpha
from cdiplug.api import drahealth_v1alpha1_pb2_grpc as alpha_grpc
from cdiplug.api import drahealth_v1beta1_pb2 as beta
from cdiplug.api import drahealth_v1beta1_pb2_grpc as beta_grpc
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.names import dns_label_for
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder

HEARTBEAT = 10.0
MAX_HEARTBEAT = 20.0  # the kubelet's window is 30 s: a resend must come well before it
SERVICES = ("v1alpha1.DRAResourceHealth", "v1beta1.DRAResourceHealth")


@attrs.frozen
class DeviceState:
    """One device's health as streamed: healthy or not, and why (for people)."""

    healthy: bool
    message: str


def _message(resource: str, device: Device) -> str:
    cause = device.cause
    if device.healthy:
        note = f" (note: {cause.name}={cause.code}, taint cdiplug.dev/{cause.name})" if cause is not None else ""
        return f"{resource}: the backend reports {device.id} healthy{note}"
    if device.health_cause is None:
        # The host marks every device of a failed backend unhealthy; a backend marks its own.
        return (
            f"{resource}: {device.id} is reported unhealthy by its backend, or its backend is down (taint cdiplug.dev/unhealthy)"
        )
    assert cause is not None
    return f"{resource}: {device.id} is unhealthy: {cause.name}={cause.code} (taint cdiplug.dev/{cause.name})"


class HealthFeed:
    """The health of one driver's pool, streamed to every watcher of either API version."""

    def __init__(
        self,
        pool: str,
        heartbeat: float = HEARTBEAT,
        *,
        resource: str = "",
        driver: str = "",
        recorder: Recorder = NULL_RECORDER,
    ) -> None:
        if not 0 < heartbeat <= MAX_HEARTBEAT:
            raise ValueError(f"health heartbeat {heartbeat} s must be above 0 and at most {MAX_HEARTBEAT} s")
        self.pool = pool
        self.heartbeat = heartbeat
        self.resource = resource  # resource and driver label the health-message counter
        self.driver = driver
        self.recorder = recorder
        self._health: dict[str, DeviceState] = {}  # device name -> state
        self._changed = asyncio.Event()  # set (and replaced) on every change

    def update(self, snapshot: DeviceSnapshot) -> None:
        """Take a snapshot's health (on the event loop; never blocks)."""
        health = {dns_label_for(d.id): DeviceState(d.healthy, _message(snapshot.resource, d)) for d in snapshot.devices}
        if health == self._health:
            return
        self._health = health
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    @property
    def timeout_seconds(self) -> int:
        """How long the kubelet may trust a message: three heartbeats (0 would mean its default)."""
        return max(1, math.ceil(self.heartbeat * 3))

    async def watch(self) -> AsyncIterator[dict[str, DeviceState]]:
        """The pool now, on every change, and every ``heartbeat`` seconds when nothing changed."""
        while True:
            changed = self._changed
            yield dict(self._health)
            try:
                async with asyncio.timeout(self.heartbeat):
                    await changed.wait()
            except TimeoutError:
                pass  # nothing changed: say so again


def _servicer(pb: ModuleType, pb_grpc: ModuleType, feed: HealthFeed) -> object:
    """``NodeWatchResources`` of one version's ``DRAResourceHealth`` (v1alpha1 and v1beta1 share the schema)."""

    class Servicer(pb_grpc.DRAResourceHealthServicer):  # type: ignore[misc, name-defined]
        async def NodeWatchResources(
            self, request: object, context: grpc.aio.ServicerContext[object, object]
        ) -> AsyncIterator[object]:
            timeout = feed.timeout_seconds
            async for states in feed.watch():
                now = int(time.time())
                feed.recorder.health_sent(feed.resource, feed.driver)
                yield pb.NodeWatchResourcesResponse(
                    devices=[
                        pb.DeviceHealth(
                            device=pb.DeviceIdentifier(pool_name=feed.pool, device_name=name),
                            health=pb.HEALTHY if s.healthy else pb.UNHEALTHY,
                            last_updated_time=now,
                            health_check_timeout_seconds=timeout,
                            message=s.message,
                        )
                        for name, s in sorted(states.items())
                    ]
                )

    return Servicer()


def add_to_server(server: grpc.aio.Server, feed: HealthFeed) -> None:
    """Serve ``feed`` as ``v1alpha1`` and ``v1beta1.DRAResourceHealth``."""
    alpha_grpc.add_DRAResourceHealthServicer_to_server(_servicer(alpha, alpha_grpc, feed), server)
    beta_grpc.add_DRAResourceHealthServicer_to_server(_servicer(beta, beta_grpc, feed), server)
