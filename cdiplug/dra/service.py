"""The gRPC edge of one DRA driver: ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin`` on ``dra.sock``.

(The services' full names are ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` and
``...v1beta1.DRAPlugin``, as the kubelet calls them; the short names are what registration
advertises.)

The only place DRA protobuf lives (with :mod:`.registration` and :mod:`.health` for theirs) and
gRPC answers are chosen. Both versions have the same messages on the wire and are served by one
implementation over a :class:`~cdiplug.dra.handler.ClaimHandler` (the driver's
:class:`~cdiplug.dra.prepare.ClaimPreparer`): protobuf claims become frozen
:class:`~cdiplug.dra.claims.ClaimRef` values, prepared claims become protobuf devices, and
errors become answers in one place (:func:`error_message`):

- every claim of a call is handled concurrently; a claim that fails gets its ``error`` string in
  the answer (the kubelet retries it) while the others succeed — the protocol's way, rather than
  failing the whole call;
- a claim without a UID, namespace or name is such an error too (InvalidRequest); a request
  protobuf cannot parse (a string that is not UTF-8) is INVALID_ARGUMENT naming the field
  (:mod:`cdiplug.wire.lenient`), and claim names quoted in errors and logs are cut (:mod:`cdiplug.toolkit.brief`);
- errors that are not cdiplug's own are bugs: logged with their traceback, answered as an
  ``error`` naming their type, never a crash of the server;
- each call is handled :func:`~.handler.after_answer` of an event its done callback sets, so a
  handler's background work for it begins once the kubelet has the answer.
"""

from __future__ import annotations

import asyncio
import logging
from types import ModuleType
from typing import Any

import grpc

from cdiplug.api import dra_v1_pb2, dra_v1beta1_pb2
from cdiplug.dra.checkpoint import PreparedClaim
from cdiplug.dra.claims import ClaimRef
from cdiplug.dra.handler import ClaimHandler, after_answer
from cdiplug.errors import CdiplugError, InvalidRequest
from cdiplug.toolkit.brief import brief
from cdiplug.wire.lenient import Rpc, Undecodable, add_lenient_service

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


def error_message(exc: BaseException) -> str:
    """How a claim's failure is answered: in its ``error`` string (the protocol's way: the kubelet
    retries that claim). cdiplug's own errors are the caller's or the node's; anything else is a
    bug, named by its type."""
    if isinstance(exc, CdiplugError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


def _answered(context: grpc.aio.ServicerContext[Any, Any]) -> asyncio.Event:
    """Set once the call has ended (its answer sent): the claims' status writes wait for it."""
    answered = asyncio.Event()
    # (grpc-stubs type the callback as a class of theirs rather than a callable of the context)
    context.add_done_callback(lambda _: answered.set())  # type: ignore[arg-type]
    return answered


async def _refuse_undecodable(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    if isinstance(request, Undecodable):  # the one status this edge answers with: the whole call is unreadable
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)


class _Plugin:
    """NodePrepareResources and NodeUnprepareResources for one protobuf module (v1 or v1beta1)."""

    def __init__(self, handler: ClaimHandler, pb: ModuleType) -> None:
        self.handler = handler
        self.pb = pb

    async def _prepare_one(self, claim: Any) -> Any:
        pb = self.pb
        try:
            done: PreparedClaim = await self.handler.prepare(_ref(claim))
        except Exception as exc:  # per claim: the kubelet retries this one
            self._log(exc, "prepare", claim)
            return pb.NodePrepareResourceResponse(error=error_message(exc))
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
            await self.handler.unprepare(_ref(claim))
        except Exception as exc:
            self._log(exc, "unprepare", claim)
            return self.pb.NodeUnprepareResourceResponse(error=error_message(exc))
        return self.pb.NodeUnprepareResourceResponse()

    def _log(self, exc: BaseException, what: str, claim: Any) -> None:
        where = f"{brief(claim.namespace)}/{brief(claim.name)} ({brief(claim.uid)})"
        if isinstance(exc, CdiplugError):
            log.error("cannot %s claim %s: %s", what, where, exc, extra={"resource": self.handler.resource_name})
        else:
            log.error("cannot %s claim %s", what, where, exc_info=exc, extra={"resource": self.handler.resource_name})

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await _refuse_undecodable(request, context)
        with after_answer(_answered(context)):
            answers = await asyncio.gather(*(self._prepare_one(c) for c in request.claims))
        response = self.pb.NodePrepareResourcesResponse()
        for claim, answer in zip(request.claims, answers):
            response.claims[claim.uid].CopyFrom(answer)
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await _refuse_undecodable(request, context)
        with after_answer(_answered(context)):
            answers = await asyncio.gather(*(self._unprepare_one(c) for c in request.claims))
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim, answer in zip(request.claims, answers):
            response.claims[claim.uid].CopyFrom(answer)
        return response


def _add(server: grpc.aio.Server, service: str, plugin: _Plugin) -> None:
    """The generated ``add_DRAPluginServicer_to_server``, with lenient request deserializers."""
    pb = plugin.pb
    rpcs = {
        "NodePrepareResources": Rpc(
            plugin.NodePrepareResources, pb.NodePrepareResourcesRequest, pb.NodePrepareResourcesResponse.SerializeToString
        ),
        "NodeUnprepareResources": Rpc(
            plugin.NodeUnprepareResources, pb.NodeUnprepareResourcesRequest, pb.NodeUnprepareResourcesResponse.SerializeToString
        ),
    }
    add_lenient_service(server, service, rpcs)


def add_to_server(server: grpc.aio.Server, handler: ClaimHandler) -> None:
    """Serve both versions of the DRA plugin service for ``handler`` on ``server``."""
    for pb in (dra_v1_pb2, dra_v1beta1_pb2):
        _add(server, pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name, _Plugin(handler, pb))
