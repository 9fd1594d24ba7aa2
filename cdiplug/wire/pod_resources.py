"""A small client of the kubelet's PodResources v1 API: which devices do pods hold right now?

The kubelet serves ``v1.PodResourcesLister`` on a unix socket (by default
``/var/lib/kubelet/pod-resources/kubelet.sock``). :func:`list_allocated` calls ``List`` and folds
the answer into an :class:`AllocatedDevices` value: resource name -> the device IDs some container
of some pod holds, and DRA driver -> the devices pods hold through claims. The front ends ask it
which devices their consumers hold (the device plugin's release, the handover). A gRPC edge:
protobuf and gRPC errors stay here; a failure is a :class:`~cdiplug.errors.KubeletError` naming the socket.

Device IDs are reported as the kubelet knows them, so with ``replicas`` they are the advertised
``<id>::<i>``; :meth:`AllocatedDevices.underlying` maps them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

import grpc
import grpc.aio
from attrs import field, frozen

from cdiplug.api import podresources_v1_pb2 as pb
from cdiplug.api import podresources_v1_pb2_grpc as pb_grpc
from cdiplug.errors import KubeletError
from cdiplug.models.replicas import underlying

DEFAULT_TIMEOUT = 5.0
_MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet's own limit for this API


def _freeze(value: Mapping[str, Iterable[str]]) -> Mapping[str, frozenset[str]]:
    return MappingProxyType({str(k): frozenset(v) for k, v in value.items()})


@frozen
class AllocatedDevices:
    """Resource name -> the device IDs pods hold (as advertised); DRA driver -> the device names
    pods hold through claims (``pool/device``)."""

    by_resource: Mapping[str, frozenset[str]] = field(factory=dict, converter=_freeze)
    by_driver: Mapping[str, frozenset[str]] = field(factory=dict, converter=_freeze)

    def of(self, resource: str) -> frozenset[str]:
        return self.by_resource.get(resource, frozenset())

    def of_driver(self, driver: str) -> frozenset[str]:
        """The ``pool/device`` names of ``driver`` that running pods' claims hold."""
        return self.by_driver.get(driver, frozenset())

    def underlying(self, resource: str) -> frozenset[str]:
        """The held IDs of ``resource`` with replica suffixes (``::<i>``) taken off."""
        return frozenset(underlying(i) for i in self.of(resource))

    # attrs compares the mapping proxies by content; only the hash needs help (a proxy has none).
    def __hash__(self) -> int:
        return hash((frozenset(self.by_resource.items()), frozenset(self.by_driver.items())))


def from_response(response: pb.ListPodResourcesResponse) -> AllocatedDevices:
    held: dict[str, set[str]] = {}
    claimed: dict[str, set[str]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                held.setdefault(devices.resource_name, set()).update(devices.device_ids)
            for dynamic in container.dynamic_resources:
                for claim in dynamic.claim_resources:
                    claimed.setdefault(claim.driver_name, set()).add(f"{claim.pool_name}/{claim.device_name}")
    return AllocatedDevices(held, claimed)


async def list_allocated(socket: Path | str, timeout: float = DEFAULT_TIMEOUT) -> AllocatedDevices:
    """Ask the kubelet at ``socket`` which devices pods hold. Raises KubeletError."""
    target = f"unix://{Path(socket).absolute()}"
    options = [("grpc.max_receive_message_length", _MAX_MESSAGE)]
    try:
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            stub = pb_grpc.PodResourcesListerStub(channel)
            response = await stub.List(pb.ListPodResourcesRequest(), timeout=timeout, wait_for_ready=False)
    except grpc.aio.AioRpcError as exc:
        raise KubeletError(f"PodResources List at {socket} failed: {exc.code().name}: {exc.details() or 'no details'}") from exc
    return from_response(response)
