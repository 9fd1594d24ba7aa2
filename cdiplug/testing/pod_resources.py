"""A stand-in for the kubelet's PodResources v1 server: a real grpc.aio server on a unix socket.

``async with PodResourcesStandIn(socket) as kubelet:`` serves ``List``, ``Get`` and
``GetAllocatableResources`` from what the test says pods hold::

    kubelet.hold("default", "vm-0", "compute", "example.com/nic-vfio", ["0000:3b:02.0"])
    kubelet.hold_claim("default", "dra-pod", "main", "claim-0", "fpga.example.com", "node-a", "fpga-0")
    kubelet.release_pod("default", "vm-0")

``list_calls`` counts ``List`` calls; ``fail_with`` set to a ``grpc.StatusCode`` makes every call
fail with it (a kubelet that is restarting, say).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from cdiplug.api import podresources_v1_pb2 as pb
from cdiplug.api import podresources_v1_pb2_grpc as pb_grpc


class PodResourcesStandIn(pb_grpc.PodResourcesListerServicer):
    def __init__(self, socket: Path | str) -> None:
        self.socket = Path(socket)
        # (namespace, pod) -> container -> resource -> device IDs
        self.pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        # (namespace, pod) -> container -> (claim namespace, claim name, driver, pool, device)
        self.claims: dict[tuple[str, str], dict[str, list[tuple[str, str, str, str, str]]]] = {}
        self.list_calls = 0
        self.fail_with: grpc.StatusCode | None = None
        self._server: grpc.aio.Server | None = None

    def hold(self, namespace: str, pod: str, container: str, resource: str, device_ids: Iterable[str]) -> None:
        containers = self.pods.setdefault((namespace, pod), {})
        containers.setdefault(container, {}).setdefault(resource, []).extend(device_ids)

    def hold_claim(self, namespace: str, pod: str, container: str, claim: str, driver: str, pool: str, device: str) -> None:
        """A pod's container using ``device`` of ``driver`` through the claim ``namespace/claim`` (DRA)."""
        self.pods.setdefault((namespace, pod), {}).setdefault(container, {})
        self.claims.setdefault((namespace, pod), {}).setdefault(container, []).append((namespace, claim, driver, pool, device))

    def release_pod(self, namespace: str, pod: str) -> None:
        self.pods.pop((namespace, pod), None)
        self.claims.pop((namespace, pod), None)

    def _pod(self, key: tuple[str, str]) -> pb.PodResources:
        namespace, name = key
        containers = [
            pb.ContainerResources(
                name=cname,
                devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in sorted(resources.items()) if ids],
                dynamic_resources=[
                    pb.DynamicResource(
                        claim_name=claim,
                        claim_namespace=ns,
                        claim_resources=[pb.ClaimResource(driver_name=driver, pool_name=pool, device_name=device)],
                    )
                    for ns, claim, driver, pool, device in self.claims.get(key, {}).get(cname, [])
                ],
            )
            for cname, resources in sorted(self.pods[key].items())
        ]
        return pb.PodResources(name=name, namespace=namespace, containers=containers)

    async def _check(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if self.fail_with is not None:
            await context.abort(self.fail_with, "stand-in told to fail")

    async def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        self.list_calls += 1
        await self._check(context)
        return pb.ListPodResourcesResponse(pod_resources=[self._pod(k) for k in sorted(self.pods)])

    async def Get(self, request: pb.GetPodResourcesRequest, context: Any) -> pb.GetPodResourcesResponse:
        await self._check(context)
        key = (request.pod_namespace, request.pod_name)
        if key not in self.pods:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"pod {key[0]}/{key[1]} not found")
        return pb.GetPodResourcesResponse(pod_resources=self._pod(key))

    async def GetAllocatableResources(self, request: Any, context: Any) -> pb.AllocatableResourcesResponse:
        await self._check(context)
        return pb.AllocatableResourcesResponse()

    async def __aenter__(self) -> PodResourcesStandIn:
        self._server = grpc.aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket.absolute()}")
        await self._server.start()
        os.chmod(self.socket, 0o600)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
