#!/usr/bin/env python3
"""The thinnest grpc.aio device plugin: Python's floor, measured beside cdiplug in the same run.

``python3 bench/floor_plugin.py --kubelet-dir D --resources N --devices M [--numa-nodes K]``
serves ``example.com/bench0`` … ``bench<N-1>``, each on its own unix socket in D
(``example.com-bench0.sock``, as cdiplug names them), and Registers them all with the kubelet
(concurrently). Each resource has M devices ``bench<i>-<j>``, Healthy, spread round-robin over K
NUMA nodes (0: no topology), the same IDs and topology the bench gives cdiplug's fake backend.

- ``GetDevicePluginOptions``: GetPreferredAllocation available (as cdiplug), no PreStart.
- ``ListAndWatch``: the static list, once; then the stream stays open.
- ``Allocate``: one ContainerAllocateResponse per container request, with one env var.
- ``GetPreferredAllocation``: must-include first, then the first available, up to the size.

No configuration, no backends, no CDI, no logging, no metrics: what is left is the interpreter,
grpc and protobuf. It imports nothing from cdiplug but the two generated stub modules, and loads
those by file (under a package of its own, ``_floor_stubs``) so that whatever ``cdiplug/__init__``
or ``cdiplug/api/__init__`` may import stays out of the floor. SIGTERM/SIGINT: stop, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import signal
import sys
import types
from pathlib import Path

import grpc

STUBS = ("deviceplugin_v1beta1_pb2", "deviceplugin_v1beta1_pb2_grpc")


def stub_folder() -> Path:
    """The folder of the generated device-plugin stubs, found without importing cdiplug."""
    spec = importlib.util.find_spec("cdiplug")  # finding a top-level package does not run it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("floor_plugin: cannot find the cdiplug package (for its generated stubs)")
    root = Path(next(iter(spec.submodule_search_locations)))
    if (root / "api" / f"{STUBS[0]}.py").is_file():
        return root / "api"
    found = sorted(root.rglob(f"{STUBS[0]}.py"))  # the stubs moved: take them wherever they are
    if not found:
        raise SystemExit(f"floor_plugin: no {STUBS[0]}.py under {root}")
    return found[0].parent


def load_stubs() -> tuple[types.ModuleType, types.ModuleType]:
    """Import the two stub modules from their folder under a package ``_floor_stubs`` (so the grpc
    module's ``from . import ..._pb2`` works) without executing any ``__init__`` of cdiplug."""
    folder = stub_folder()
    package = types.ModuleType("_floor_stubs")
    package.__path__ = [str(folder)]
    sys.modules["_floor_stubs"] = package
    modules = []
    for name in STUBS:
        spec = importlib.util.spec_from_file_location(f"_floor_stubs.{name}", folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        modules.append(module)
    return modules[0], modules[1]


pb, pb_grpc = load_stubs()


class FloorPlugin(pb_grpc.DevicePluginServicer):  # type: ignore[name-defined,misc]
    def __init__(self, ids: list[str], numa_nodes: int) -> None:
        devices = []
        for j, device_id in enumerate(ids):
            device = pb.Device(ID=device_id, health="Healthy")
            if numa_nodes:
                device.topology.nodes.add(ID=j % numa_nodes)
            devices.append(device)
        self.listed = pb.ListAndWatchResponse(devices=devices)

    async def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, request, context):
        yield self.listed
        await asyncio.Event().wait()  # until the kubelet hangs up or we stop

    async def Allocate(self, request, context):
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(envs={"FLOOR_DEVICES": ",".join(c.devices_ids)}) for c in request.container_requests
            ]
        )

    async def GetPreferredAllocation(self, request, context):
        answers = []
        for c in request.container_requests:
            chosen = list(dict.fromkeys(c.must_include_deviceIDs))
            for device_id in c.available_deviceIDs:
                if len(chosen) >= c.allocation_size:
                    break
                if device_id not in chosen:
                    chosen.append(device_id)
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen[: c.allocation_size]))
        return pb.PreferredAllocationResponse(container_responses=answers)

    async def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


async def serve(kubelet_dir: Path, resources: int, devices: int, numa_nodes: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    servers = []
    names = [f"example.com/bench{i}" for i in range(resources)]
    for name in names:
        cls = name.rpartition("/")[2]
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(FloorPlugin([f"{cls}-{j}" for j in range(devices)], numa_nodes), server)
        server.add_insecure_port(f"unix:{kubelet_dir / (name.replace('/', '-') + '.sock')}")
        await server.start()
        servers.append(server)

    async def register(name: str) -> None:
        async with grpc.aio.insecure_channel(f"unix:{kubelet_dir / 'kubelet.sock'}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version="v1beta1",
                    endpoint=name.replace("/", "-") + ".sock",
                    resource_name=name,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=30,
            )

    await asyncio.gather(*(register(n) for n in names))
    await stop.wait()
    await asyncio.gather(*(s.stop(None) for s in servers))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubelet-dir", type=Path, required=True)
    parser.add_argument("--resources", type=int, default=1)
    parser.add_argument("--devices", type=int, default=128)
    parser.add_argument("--numa-nodes", type=int, default=0, help="spread devices over this many NUMA nodes (0: none)")
    args = parser.parse_args()
    asyncio.run(serve(args.kubelet_dir, args.resources, args.devices, args.numa_nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
