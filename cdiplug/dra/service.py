"""The gRPC edge of one DRA driver: ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin`` on ``dra.sock``.

(The services' full names are ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` and
``...v1beta1.DRAPlugin``, as the kubelet calls them; the short names are what registration
advertises.)

The only place DRA protobuf lives (with :mod:`.registration` and :mod:`.health` for theirs) and
gRPC answers are chosen. Both versions have the same messages on the wire and are served by one
implementation over :class:`~cdiplug.dra.prepare.ClaimPreparer`:

- every claim of a call is handled concurrently; a claim that fails gets its ``error`` string in
  the answer (the kubelet retries it) while the others succeed — the protocol's way, rather than
  failing the whole call;
- a claim without a UID, namespace or name is such an error too (InvalidRequest); a request
  protobuf cannot parse (a string that is not UTF-8) is INVALID_ARGUMENT naming the field
  (:mod:`cdiplug.wire`), and claim names quoted in errors and logs are cut (:mod:`cdiplug.brief`);
- errors that are not cdiplug's own are bugs: logged with their traceback, answered as an
  ``error`` naming their type, never a crash of the server.
"""

from __future__ import annotations

import asyncio
import logging
from types import ModuleType
from typing import Any

import grpc

from ..api import dra_v1_pb2, dra_v1beta1_pb2
from ..brief import brief
from ..errors import CdiplugError, InvalidRequest
from ..wire import Undecodable, lenient
from .checkpoint import PreparedClaim
from .claims import ClaimRef
from .prepare import ClaimPreparer

log = logging.getLogger(__name__)

# What registration advertises (the kubelet picks one); the gRPC services themselves are
# k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin and ...v1beta1.DRAPlugin.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


MAX_NAME = 253  # a namespace, name or UID longer than this is no Kubernetes name


def _ref(claim: Any) -> ClaimRef:
    ref = ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)
    if not (ref.uid and ref.namespace and ref.name):
        raise InvalidRequest(
            f"claim {brief(ref.namespace)}/{brief(ref.name)} ({brief(ref.uid)}) lacks its UID, namespace or name"
        )
    if max(len(ref.uid), len(ref.namespace), len(ref.name)) > MAX_NAME:
        raise InvalidRequest(f"claim {brief(ref.namespace)}/{brief(ref.name)} ({brief(ref.uid)}): a name is too long")
    return ref


def _message(exc: BaseException) -> str:
    if isinstance(exc, CdiplugError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


class _Plugin:
    """NodePrepareResources and NodeUnprepareResources for one protobuf module (v1 or v1beta1)."""

    def __init__(self, preparer: ClaimPreparer, pb: ModuleType) -> None:
        self.preparer = preparer
        self.pb = pb

    async def _prepare_one(self, claim: Any) -> Any:
        pb = self.pb
        try:
            done: PreparedClaim = await self.preparer.prepare(_ref(claim))
        except Exception as exc:  # per claim: the kubelet retries this one
            self._log(exc, "prepare", claim)
            return pb.NodePrepareResourceResponse(error=_message(exc))
        return pb.NodePrepareResourceResponse(
            devices=[
                pb.Device(
                    request_names=list(d.request_names),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
                for d in done.devices
            ]
        )

    async def _unprepare_one(self, claim: Any) -> Any:
        try:
            await self.preparer.unprepare(_ref(claim))
        except Exception as exc:
            self._log(exc, "unprepare", claim)
            return self.pb.NodeUnprepareResourceResponse(error=_message(exc))
        return self.pb.NodeUnprepareResourceResponse()

    def _log(self, exc: BaseException, what: str, claim: Any) -> None:
        where = f"{brief(claim.namespace)}/{brief(claim.name)} ({brief(claim.uid)})"
        if isinstance(exc, CdiplugError):
            log.error("cannot %s claim %s: %s", what, where, exc, extra={"resource": self.preparer.resource.name})
        else:
            log.error("cannot %s claim %s", what, where, exc_info=exc, extra={"resource": self.preparer.resource.name})

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        answers = await asyncio.gather(*(self._prepare_one(c) for c in request.claims))
        response = self.pb.NodePrepareResourcesResponse()
        for claim, answer in zip(request.claims, answers):
            response.claims[claim.uid].CopyFrom(answer)
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        answers = await asyncio.gather(*(self._unprepare_one(c) for c in request.claims))
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim, answer in zip(request.claims, answers):
            response.claims[claim.uid].CopyFrom(answer)
        return response


def _add(server: grpc.aio.Server, service: str, plugin: _Plugin) -> None:
    """The generated ``add_DRAPluginServicer_to_server``, with :func:`lenient` request deserializers."""
    pb = plugin.pb
    handlers = {
        "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
            plugin.NodePrepareResources,
            request_deserializer=lenient(pb.NodePrepareResourcesRequest),
            response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
        ),
        "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
            plugin.NodeUnprepareResources,
            request_deserializer=lenient(pb.NodeUnprepareResourcesRequest),
            response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


def add_to_server(server: grpc.aio.Server, preparer: ClaimPreparer) -> None:
    """Serve both versions of the DRA plugin service for ``preparer`` on ``server``."""
    for pb in (dra_v1_pb2, dra_v1beta1_pb2):
        _add(server, pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name, _Plugin(preparer, pb))
