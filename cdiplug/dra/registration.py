"""Plugin registration v1 for one DRA driver: the server on ``<plugins-registry-dir>/<driver>-reg.sock``.

The kubelet's plugin watcher notices the socket, calls ``GetInfo`` (we answer type ``DRAPlugin``,
the driver name, the absolute path of our ``dra.sock`` and the services it serves, newest
first) and then ``NotifyRegistrationStatus``; the status goes to ``on_status(registered, error)``
(the front end marks the resource ready for ``/readyz``). The kubelet connects again after it
restarts; a removed socket is what tells it that we are gone.

The boundary: this module is the gRPC edge of registration and holds its protobuf.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from cdiplug.api import pluginregistration_v1_pb2 as pb
from cdiplug.api import pluginregistration_v1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"

StatusCallback = Callable[[bool, str], None]


class RegistrationService(pb_grpc.RegistrationServicer):
    """GetInfo and NotifyRegistrationStatus of one driver."""

    def __init__(self, driver: str, endpoint: Path, versions: Sequence[str], on_status: StatusCallback) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.versions = tuple(versions)
        self.on_status = on_status

    async def GetInfo(
        self, request: pb.InfoRequest, context: grpc.aio.ServicerContext[pb.InfoRequest, pb.PluginInfo]
    ) -> pb.PluginInfo:
        return pb.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=str(self.endpoint), supported_versions=list(self.versions)
        )

    async def NotifyRegistrationStatus(
        self,
        request: pb.RegistrationStatus,
        context: grpc.aio.ServicerContext[pb.RegistrationStatus, pb.RegistrationStatusResponse],
    ) -> pb.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("DRA driver %s registered with the kubelet", self.driver)
        else:
            log.error("the kubelet refused DRA driver %s: %s", self.driver, request.error or "no reason given")
        self.on_status(request.plugin_registered, request.error)
        return pb.RegistrationStatusResponse()


def add_to_server(server: grpc.aio.Server, service: RegistrationService) -> None:
    pb_grpc.add_RegistrationServicer_to_server(service, server)
