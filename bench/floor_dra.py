#!/usr/bin/env python3
"""The thinnest correct Python DRA kubelet plugin: Python's floor, measured beside cdiplug and the Go driver.

``python3 bench/floor_dra.py --driver-name D --node-name N --kubeconfig F [--num-devices 4]
[--cdi-root /var/run/cdi] [--state-dir S]`` publishes one ResourceSlice of driver D (pool N, node
N, devices ``dev-0`` … ``dev-<n-1>``, a name each and nothing more), then serves, from one
grpc.aio server, ``v1.DRAPlugin`` on ``<plugins-dir>/D/dra.sock`` and plugin registration on
``<plugins-registry-dir>/D-reg.sock`` (GetInfo: type DRAPlugin, name D, that endpoint, versions
``v1.DRAPlugin``; NotifyRegistrationStatus: acknowledged).

- ``NodePrepareResources``: per claim (concurrently), GET the ResourceClaim through lightkube,
  check its UID, take the allocation's results of driver D, write the claim's CDI spec (one file
  per claim as dra-example-driver writes it: kind ``k8s.D/device``, a device ``<claim UID>-<device>``
  with one env variable each; temporary file and rename, no fsync); then one durable write of
  the checkpoint for the call (the whole JSON file to a temporary one, fsync, rename, as the
  kubelet's checkpoint manager does it for the Go drivers) and the answer, a CDI device ID per
  device. A claim already in the checkpoint is answered from it.
- ``NodeUnprepareResources``: remove each claim's spec file, one durable checkpoint write, answer.
- SIGTERM/SIGINT: stop the server, remove the sockets, delete the ResourceSlice, exit 0.

Left out, on purpose: no device health service, no claim status writes (KEP-4817), no restore of
the checkpoint at start (specs are not rewritten after a reboot), no configuration (no opaque
parameters, no DeviceClass configuration, no admin access), no sharing or partitions, no
logging, no metrics, no retries; an error is the claim's ``error`` string. It imports nothing
from cdiplug but the two generated stub modules (DRA v1 and plugin registration), loaded by file
under a package of its own (``_floor_stubs``) as ``floor_plugin.py`` does, so nothing that
``cdiplug/__init__`` or ``cdiplug/api/__init__`` may import creeps in.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import Device, ResourcePool, ResourceSliceSpec
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

STUBS = ("dra_v1_pb2", "dra_v1_pb2_grpc", "pluginregistration_v1_pb2", "pluginregistration_v1_pb2_grpc")
NOT_FOUND = 404
CONFLICT = 409


def load_stubs() -> list[types.ModuleType]:
    """The stub modules, from cdiplug's folder of them, under a package ``_floor_stubs`` (so a grpc
    module's ``from . import ..._pb2`` works) without executing any ``__init__`` of cdiplug."""
    spec = importlib.util.find_spec("cdiplug")  # finding a top-level package does not run it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("floor_dra: cannot find the cdiplug package (for its generated stubs)")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = [root / "api"] if (root / "api" / f"{STUBS[0]}.py").is_file() else [p.parent for p in root.rglob(f"{STUBS[0]}.py")]
    if not found:
        raise SystemExit(f"floor_dra: no {STUBS[0]}.py under {root}")
    package = types.ModuleType("_floor_stubs")
    package.__path__ = [str(found[0])]
    sys.modules["_floor_stubs"] = package
    modules = []
    for name in STUBS:
        module_spec = importlib.util.spec_from_file_location(f"_floor_stubs.{name}", found[0] / f"{name}.py")
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
        modules.append(module)
    return modules


dra, dra_grpc, reg, reg_grpc = load_stubs()


def write_file(path: Path, data: bytes, durable: bool) -> None:
    """``data`` to ``path`` atomically (a temporary file renamed over it); ``durable``: fsync first."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(temporary, path)


class Registration(reg_grpc.RegistrationServicer):  # type: ignore[name-defined,misc]
    def __init__(self, driver: str, endpoint: Path) -> None:
        self.info = reg.PluginInfo(type="DRAPlugin", name=driver, endpoint=str(endpoint), supported_versions=["v1.DRAPlugin"])

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return self.info

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return reg.RegistrationStatusResponse()


class FloorDra(dra_grpc.DRAPluginServicer):  # type: ignore[name-defined,misc]
    def __init__(self, kube: AsyncClient, driver: str, cdi_root: Path, state_dir: Path) -> None:
        self.kube, self.driver, self.cdi_root = kube, driver, cdi_root
        self.vendor_class = f"k8s.{driver}/device"
        self.checkpoint = state_dir / "checkpoint.json"
        self.claims: dict[str, dict[str, Any]] = {}  # UID -> namespace, name, devices [request, pool, device]
        self.lock = asyncio.Lock()  # one checkpoint write at a time

    def spec_file(self, uid: str) -> Path:
        return self.cdi_root / f"k8s.{self.driver}-device_{uid}.json"

    async def save(self, change: dict[str, dict[str, Any] | None]) -> None:
        """Apply ``change`` (UID -> record, or None: gone) to the claims and write the checkpoint durably."""
        async with self.lock:
            for uid, record in change.items():
                if record is None:
                    self.claims.pop(uid, None)
                else:
                    self.claims[uid] = record
            data = json.dumps({"claims": self.claims}).encode()
            await asyncio.to_thread(write_file, self.checkpoint, data, True)

    async def prepare(self, claim: Any) -> dict[str, Any]:
        if claim.uid in self.claims:
            return self.claims[claim.uid]
        obj = await self.kube.get(ResourceClaim, claim.name, namespace=claim.namespace)
        if obj.metadata is None or obj.metadata.uid != claim.uid:
            raise ValueError(f"claim {claim.namespace}/{claim.name} has another UID than {claim.uid}")
        allocation = obj.status.allocation if obj.status else None
        results = (allocation.devices.results or []) if allocation and allocation.devices else []
        devices = [[r.request, r.pool, r.device] for r in results if r.driver == self.driver]
        if not devices:
            raise ValueError(f"claim {claim.namespace}/{claim.name} is not allocated devices of {self.driver}")
        spec = {
            "cdiVersion": "0.5.0",
            "kind": self.vendor_class,
            "devices": [
                {"name": f"{claim.uid}-{device}", "containerEdits": {"env": [f"FLOOR_DEVICE_{i}={device}"]}}
                for i, (_, _, device) in enumerate(devices)
            ],
        }
        await asyncio.to_thread(write_file, self.spec_file(claim.uid), json.dumps(spec).encode(), False)
        return {"namespace": claim.namespace, "name": claim.name, "devices": devices}

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        outcomes = await asyncio.gather(*(self.prepare(c) for c in request.claims), return_exceptions=True)
        answer = dra.NodePrepareResourcesResponse()
        change: dict[str, dict[str, Any] | None] = {}
        for claim, outcome in zip(request.claims, outcomes):
            if isinstance(outcome, BaseException):
                answer.claims[claim.uid].error = f"{type(outcome).__name__}: {outcome}"
                continue
            change[claim.uid] = outcome
            for req, pool, device in outcome["devices"]:
                answer.claims[claim.uid].devices.add(
                    request_names=[req],
                    pool_name=pool,
                    device_name=device,
                    cdi_device_ids=[f"{self.vendor_class}={claim.uid}-{device}"],
                )
        if any(uid not in self.claims for uid in change):
            await self.save(change)
        return answer

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        answer = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            error = ""
            try:
                await asyncio.to_thread(self.spec_file(claim.uid).unlink, missing_ok=True)
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc}"
            answer.claims[claim.uid].error = error  # (the entry, empty on success)
        await self.save(dict.fromkeys((c.uid for c in request.claims), None))
        return answer


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    driver, node = args.driver_name, args.node_name
    config = KubeConfig.from_file(args.kubeconfig).get()
    assert config is not None and config.user is not None
    # Idle connections kept as long as Go's clients keep them (httpx's default is 5 s), as cdiplug does.
    transport = httpx2.AsyncHTTPTransport(
        verify=verify_cluster(config.cluster, config.user, config.abs_file, trust_env=False),
        trust_env=False,
        limits=httpx2.Limits(keepalive_expiry=args.keepalive),
    )
    kube = AsyncClient(config, field_manager="floor-dra", trust_env=False, transport=transport)
    name = f"{node}-{driver}"
    body = ResourceSlice(
        metadata=ObjectMeta(name=name),
        spec=ResourceSliceSpec(
            driver=driver,
            pool=ResourcePool(name=node, generation=1, resourceSliceCount=1),
            nodeName=node,
            devices=[Device(name=f"dev-{i}") for i in range(args.num_devices)],
        ),
    )
    try:
        await kube.create(body)
    except ApiError as exc:  # one left by a floor that was killed: replace it
        if exc.status.code != CONFLICT:
            raise
        await kube.delete(ResourceSlice, name)
        await kube.create(body)

    args.state_dir.mkdir(parents=True, exist_ok=True)
    (args.plugins_dir / driver).mkdir(parents=True, exist_ok=True)
    endpoint = args.plugins_dir / driver / "dra.sock"
    registration = args.plugins_registry_dir / f"{driver}-reg.sock"
    server = grpc.aio.server()
    dra_grpc.add_DRAPluginServicer_to_server(FloorDra(kube, driver, args.cdi_root, args.state_dir), server)
    reg_grpc.add_RegistrationServicer_to_server(Registration(driver, endpoint), server)
    for socket in (endpoint, registration):  # the DRA socket first: the kubelet dials it once registered
        socket.unlink(missing_ok=True)
        server.add_insecure_port(f"unix://{socket}")
    await server.start()
    await stop.wait()

    await server.stop(None)
    for socket in (registration, endpoint):
        socket.unlink(missing_ok=True)
    try:
        await kube.delete(ResourceSlice, name)
    except ApiError as exc:
        if exc.status.code != NOT_FOUND:
            raise
    await kube.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--driver-name", required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--cdi-root", type=Path, default=Path("/var/run/cdi"))
    parser.add_argument("--state-dir", type=Path, required=True, help="the checkpoint's folder")
    parser.add_argument("--num-devices", type=int, default=4)
    parser.add_argument("--plugins-registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"))
    parser.add_argument("--plugins-dir", type=Path, default=Path("/var/lib/kubelet/plugins"))
    parser.add_argument("--keepalive", type=float, default=90.0, help="seconds an idle API connection is kept")
    asyncio.run(serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
