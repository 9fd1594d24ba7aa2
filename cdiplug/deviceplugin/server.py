"""The gRPC edge of one resource: a grpc.aio DevicePlugin server on its own unix socket.

:class:`ResourceServer` serves ``<kubelet-dir>/<socket name>`` (mode 0600: only the kubelet, which
runs as root, talks to it). It turns what the core hands it into protobuf and back:

- :meth:`ResourceServer.publish` takes the advertised :class:`DeviceSnapshot` and pushes the full
  device list to every ListAndWatch stream. The list is serialized once per change, only changed
  devices anew (:mod:`.messages`), and shared;
  each stream has a queue holding only the latest list, so a slow reader gets the newest state,
  never a backlog. The first message of a stream is the current list.
- Allocate and GetPreferredAllocation delegate to the resource's allocator (PreStartContainer is never required)
  (``cdiplug.deviceplugin.allocator.Allocator``) and convert its :class:`ContainerAllocation` answers.
- Our exceptions become gRPC status codes through :func:`cdiplug.wire.lenient.status_for`, the one
  place codes are chosen. A request that does not parse (a device ID that is not valid UTF-8,
  say) reaches the RPC as :class:`Undecodable` (:func:`cdiplug.wire.lenient.add_lenient_service`) and
  becomes INVALID_ARGUMENT naming the field; grpc's own handling would answer INTERNAL without a
  word. Status details and log lines are bounded (:data:`MAX_DETAILS`,
  ``cdiplug.toolkit.brief``): a log line names the RPC and the request's size, never the whole request.

The boundary: this module knows protobuf and sockets, not backends, CDI files or the kubelet's
registration (``cdiplug.deviceplugin.registration``), nor when to (re)start (``cdiplug.deviceplugin.frontend``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc
import grpc.aio

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc  # the servicer base class only
from cdiplug.deviceplugin.messages import ListCache, allocate_response, serialize_passthrough
from cdiplug.errors import CdiplugError, InvalidRequest, PreparationError
from cdiplug.models.devices import ContainerAllocation, DeviceSnapshot, PreferredRequest
from cdiplug.wire.lenient import Rpc, Undecodable, add_lenient_service, status_for
from cdiplug.wire.unixserver import UnixServer

log = logging.getLogger(__name__)

# Longest status message sent: far below gRPC's metadata limit (8 KiB by default), which a longer
# one would exceed and turn into RESOURCE_EXHAUSTED for the caller.
MAX_DETAILS = 1024

_END = object()  # put into a stream's queue to end that stream cleanly (status OK)


class AllocatorLike(Protocol):
    """What the server needs of ``cdiplug.deviceplugin.allocator.Allocator``."""

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]: ...

    def preferred(self, requests: Sequence[PreferredRequest]) -> list[tuple[str, ...]]: ...


def _add_servicer(servicer: _Servicer, server: grpc.aio.Server) -> None:
    """``add_DevicePluginServicer_to_server`` with lenient request deserializers."""
    add_lenient_service(
        server,
        SERVICE,
        {
            "GetDevicePluginOptions": Rpc(servicer.GetDevicePluginOptions, pb.Empty, pb.DevicePluginOptions.SerializeToString),
            "ListAndWatch": Rpc(servicer.ListAndWatch, pb.Empty, serialize_passthrough, stream=True),
            "GetPreferredAllocation": Rpc(
                servicer.GetPreferredAllocation, pb.PreferredAllocationRequest, pb.PreferredAllocationResponse.SerializeToString
            ),
            "Allocate": Rpc(servicer.Allocate, pb.AllocateRequest, pb.AllocateResponse.SerializeToString),
            "PreStartContainer": Rpc(
                servicer.PreStartContainer, pb.PreStartContainerRequest, pb.PreStartContainerResponse.SerializeToString
            ),
        },
    )


SERVICE = "v1beta1.DevicePlugin"


def _summary(requests: Sequence[Sequence[str]]) -> str:
    """A request's size for a log line: never the IDs themselves."""
    ids = sum(len(r) for r in requests)
    return f"({len(requests)} container request{'s' if len(requests) != 1 else ''}, {ids:,} ID{'s' if ids != 1 else ''})"


def _cut(text: str, limit: int = MAX_DETAILS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} chars)"


# -- the server ---------------------------------------------------------------------------------


class ResourceServer:
    """The DevicePlugin service of one resource on ``kubelet_dir / socket_name``.

    ``start()`` serves (a new grpc.aio server each time: a stopped one cannot restart), ``stop()``
    ends the streams, stops serving and removes the socket. ``allocator`` may be replaced while
    serving (a config reload); streams keep running.
    """

    def __init__(self, resource: str, socket_name: str, kubelet_dir: Path, allocator: AllocatorLike) -> None:
        self.resource = resource
        self.socket_name = socket_name
        self.socket_path = Path(kubelet_dir) / socket_name
        self.allocator = allocator
        self._unix = UnixServer(self.socket_path, lambda server: _add_servicer(_Servicer(self), server))
        self._streams: set[asyncio.Queue[Any]] = set()
        self._current: bytes | None = None
        self._advertised: DeviceSnapshot | None = None
        self._lists = ListCache()
        self._log = logging.LoggerAdapter(log, {"resource": resource})

    # -- state --

    @property
    def serving(self) -> bool:
        return self._unix.serving

    @property
    def stream_count(self) -> int:
        return len(self._streams)

    @property
    def advertised(self) -> DeviceSnapshot | None:
        return self._advertised

    def socket_present(self) -> bool:
        """Whether our socket file is still where we bound it (a kubelet restart wipes the folder)."""
        return self._unix.present()

    # -- lifecycle --

    async def start(self) -> None:
        """Serve on our socket (:class:`~cdiplug.wire.unixserver.UnixServer`: a live one refused, a
        stale one replaced, 0600 from the start, never someone else's removed)."""
        if self._unix.serving:
            return
        await self._unix.start()
        self._log.info("serving %s on %s", self.resource, self.socket_path)

    async def stop(self, grace: float | None = 0.2) -> None:
        """End the streams, stop serving and remove our socket (only if it is still ours)."""
        if not self._unix.serving:
            return
        self.end_streams()
        await self._unix.stop(grace)
        self._log.info("stopped serving %s", self.resource)

    async def restart(self) -> None:
        """Serve again on a fresh socket (ours was removed): streams end, state is kept."""
        await self.stop(grace=0)
        await self.start()

    # -- ListAndWatch --

    def publish(self, advertised: DeviceSnapshot) -> None:
        """Push the full advertised list to every stream; an unchanged list is not sent again."""
        if advertised == self._advertised:
            return
        self._advertised = advertised
        # Serialized when a stream needs it: before the first Register none is open, and the
        # kubelet hears of the resource sooner when its list is not built ahead of the call.
        self._current = None
        if self._streams:
            message = self._message()
            for queue in self._streams:
                _offer(queue, message)

    def _message(self) -> bytes | None:
        """The advertised list as ListAndWatch sends it, serialized once per published list."""
        if self._current is None and self._advertised is not None:
            self._current = self._lists.serialize(self._advertised)
        return self._current

    def end_streams(self) -> None:
        """End every ListAndWatch stream now (status OK), before registering again."""
        for queue in self._streams:
            _offer(queue, _END)
        self._streams.clear()

    def _open_stream(self) -> asyncio.Queue[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
        if (message := self._message()) is not None:
            queue.put_nowait(message)  # the first message: the full list at once
        self._streams.add(queue)
        self._log.debug("ListAndWatch stream opened (%d open)", len(self._streams))
        return queue

    def _close_stream(self, queue: asyncio.Queue[Any]) -> None:
        self._streams.discard(queue)
        self._log.debug("ListAndWatch stream closed (%d open)", len(self._streams))


def _offer(queue: asyncio.Queue[Any], item: Any) -> None:
    """Replace whatever the one-slot queue holds with ``item`` (the newest list wins)."""
    if queue.full() and queue.get_nowait() is _END:
        queue.put_nowait(_END)  # the end of a stream is never overwritten
        return
    queue.put_nowait(item)


class _Servicer(pb_grpc.DevicePluginServicer):
    """The DevicePlugin RPCs; each one thin: convert, delegate, convert, map errors."""

    def __init__(self, server: ResourceServer) -> None:
        self._s = server

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=False,  # nothing to do before a container starts: preparation is Allocate's
            get_preferred_allocation_available=True,
        )

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse]
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        queue = self._s._open_stream()
        try:
            while True:
                message = await queue.get()
                if message is _END:
                    return
                yield message
        finally:
            # Reached too when the kubelet cancels: grpc cancels this task at queue.get().
            self._s._close_stream(queue)

    async def Allocate(
        self,
        request: pb.AllocateRequest | Undecodable,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        if isinstance(request, Undecodable):
            await self._abort(context, "Allocate", "(undecodable)", InvalidRequest(request.reason))
        requests = [list(r.devices_ids) for r in request.container_requests]
        try:
            answers = await self._s.allocator.allocate(requests)
        except Exception as exc:
            await self._abort(context, "Allocate", _summary(requests), exc)
        return allocate_response(answers)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest | Undecodable,
        context: grpc.aio.ServicerContext[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        if isinstance(request, Undecodable):
            await self._abort(context, "GetPreferredAllocation", "(undecodable)", InvalidRequest(request.reason))
        requests = [
            PreferredRequest(
                available=r.available_deviceIDs,
                must_include=r.must_include_deviceIDs,
                size=r.allocation_size,
            )
            for r in request.container_requests
        ]
        try:
            answers = self._s.allocator.preferred(requests)
        except Exception as exc:
            await self._abort(context, "GetPreferredAllocation", _summary([r.available for r in requests]), exc)
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in answers]
        )

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest | Undecodable,
        context: grpc.aio.ServicerContext[pb.PreStartContainerRequest, pb.PreStartContainerResponse],
    ) -> pb.PreStartContainerResponse:
        if isinstance(request, Undecodable):
            await self._abort(context, "PreStartContainer", "(undecodable)", InvalidRequest(request.reason))
        # Never required (GetDevicePluginOptions and Register say so), so a kubelet does not call it;
        # a client that does gets the empty answer the API defines.
        return pb.PreStartContainerResponse()

    async def _abort(self, context: grpc.aio.ServicerContext[Any, Any], rpc: str, summary: str, exc: Exception) -> NoReturn:
        """Answer ``exc`` as a status; ``summary`` says how big the request was (never its IDs)."""
        code = status_for(exc)
        extra = {"resource": self._s.resource}
        if isinstance(exc, CdiplugError):
            if isinstance(exc, PreparationError):
                extra["device"] = _cut(exc.device, 256)
            details = _cut(str(exc))
            self._s._log.logger.warning("%s %s -> %s: %s", rpc, summary, code.name, details, extra=extra)
        else:
            # A bug, not a bad request: keep the traceback in the log, tell the kubelet briefly.
            self._s._log.logger.error("%s %s failed unexpectedly", rpc, summary, exc_info=exc, extra=extra)
            details = _cut(f"internal error in {rpc}: {type(exc).__name__}: {exc}")
        await context.abort(code, details)
        raise AssertionError("context.abort returned")  # it raises; this tells the type checker
