"""The DRA health stream (cdiplug.dra.health.HealthFeed) over a real gRPC socket.

The first message lists every device of the pool; a health change sends the pool again; a quiet
pool is repeated after the heartbeat with a fresh ``last_updated_time``.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from cdiplug.api import drahealth_v1alpha1_pb2 as pb
from cdiplug.api import drahealth_v1alpha1_pb2_grpc as pb_grpc
from cdiplug.dra.health import HealthFeed, add_to_server
from cdiplug.dra.slices import device_name
from cdiplug.model import Device, DeviceSnapshot, Health
from cdiplug.unixserver import UnixServer


def health(message: pb.NodeWatchResourcesResponse) -> dict[str, str]:
    return {d.device.device_name: pb.HealthStatus.Name(d.health) for d in message.devices}


async def test_stream(short_tmp: Path) -> None:
    feed = HealthFeed("node-a", heartbeat=0.05)
    feed.update(DeviceSnapshot("example.com/fpga", [Device("fpga-0"), Device("0000:3b:00.1")]))
    server = UnixServer(short_tmp / "dra.sock", lambda s: add_to_server(s, feed))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{short_tmp / 'dra.sock'}") as channel:
            stream = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
            first = await stream.read()
            assert health(first) == {"fpga-0": "HEALTHY", device_name("0000:3b:00.1"): "HEALTHY"}
            assert {d.device.pool_name for d in first.devices} == {"node-a"}
            feed.update(DeviceSnapshot("example.com/fpga", [Device("fpga-0", health=Health.UNHEALTHY)]))
            changed = await stream.read()
            assert health(changed) == {"fpga-0": "UNHEALTHY"}
            again = await stream.read()  # nothing changed: the heartbeat repeats it
            assert (
                health(again) == {"fpga-0": "UNHEALTHY"}
                and again.devices[0].last_updated_time >= changed.devices[0].last_updated_time
            )
            stream.cancel()
    finally:
        await server.stop()
