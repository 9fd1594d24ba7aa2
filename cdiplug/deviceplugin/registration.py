"""Registering a resource with the kubelet: one Register call on ``<kubelet-dir>/kubelet.sock``.

:func:`register_once` sends one ``Register`` (API version v1beta1, endpoint = our socket's file
name, the resource name and its options) with a short deadline and maps gRPC errors to
:class:`~cdiplug.errors.KubeletError`. :func:`register` repeats it until the kubelet accepts: a
missing or silent kubelet is a wait with backoff (from about 50 ms up to about 2 s) and a log
line, never a crash. A kubelet restart is noticed elsewhere (``cdiplug.deviceplugin.kubelet_watch``), which
cancels a waiting :func:`register` and starts a fresh one, so the backoff cap bounds only how
long a silent kubelet goes unnoticed.

The boundary: this module is the gRPC client side of registration; when to register is the
front end's business (``cdiplug.deviceplugin.frontend``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import grpc
import grpc.aio
from attrs import frozen

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.errors import KubeletError
from cdiplug.toolkit.backoff import Backoff

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
CALL_TIMEOUT = 2.0
INITIAL_BACKOFF = 0.05
MAX_BACKOFF = 2.0
# Jitter keeps several resources from hammering a recovering kubelet in lockstep.
JITTER = 0.2
# While waiting, say so again at most this often (the first failure is always logged).
LOG_EVERY = 30.0

# A fresh channel per attempt with its own subchannel: grpc's process-wide subchannel pool would
# otherwise carry a failed connection's reconnect backoff (a second or more) into the next try.
_CHANNEL_OPTIONS = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.enable_retries", 0),
)


class KubeletNotReady(KubeletError):
    """The kubelet is not there or does not answer (yet): worth waiting for."""


@frozen
class Registration:
    """What we tell the kubelet about one resource."""

    resource_name: str
    endpoint: str  # our socket's file name, relative to the kubelet folder
    preferred_allocation: bool = True

    def request(self) -> pb.RegisterRequest:
        return pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.endpoint,
            resource_name=self.resource_name,
            options=pb.DevicePluginOptions(
                pre_start_required=False,  # preparation is Allocate's (see server.py)
                get_preferred_allocation_available=self.preferred_allocation,
            ),
        )


async def register_once(kubelet_socket: Path, registration: Registration, timeout: float = CALL_TIMEOUT) -> None:
    """Send one Register; raises KubeletNotReady (absent, silent) or KubeletError (refused)."""
    if not kubelet_socket.exists():
        raise KubeletNotReady(f"no kubelet socket at {kubelet_socket}")
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}", options=_CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.RegistrationStub(channel)
        try:
            await stub.Register(registration.request(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            what = f"kubelet at {kubelet_socket}: {code.name}: {exc.details() or 'no details'}"
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise KubeletNotReady(what) from exc
            raise KubeletError(f"kubelet refused {registration.resource_name}: {what}") from exc


async def register(
    kubelet_socket: Path,
    registration: Registration,
    *,
    timeout: float = CALL_TIMEOUT,
    initial_backoff: float = INITIAL_BACKOFF,
    max_backoff: float = MAX_BACKOFF,
    asked: asyncio.Event | None = None,
) -> int:
    """Register, waiting for the kubelet as long as it takes; returns the number of attempts.

    Cancel it to stop waiting. A refusal (a bad resource name, an unsupported version) is
    retried too, with the same backoff, and logged as an error each time it changes. ``asked`` is
    set once the first attempt has ended, answered or not.
    """
    extra = {"resource": registration.resource_name}
    backoff = Backoff(initial_backoff, max_backoff, jitter=JITTER)
    attempts = 0
    last_message = ""
    last_logged = 0.0
    started = time.monotonic()
    while True:
        attempts += 1
        try:
            await register_once(kubelet_socket, registration, timeout)
        except KubeletNotReady as exc:
            now = time.monotonic()
            if attempts == 1 or now - last_logged >= LOG_EVERY:
                log.warning("waiting for the kubelet to register %s: %s", registration.resource_name, exc, extra=extra)
                last_logged = now
        except KubeletError as exc:
            if str(exc) != last_message:
                log.error("%s", exc, extra=extra)
                last_message = str(exc)
        else:
            waited = time.monotonic() - started
            log.info(
                "registered %s with the kubelet (endpoint %s%s)",
                registration.resource_name,
                registration.endpoint,
                f", after {attempts} attempts in {waited:.2f} s" if attempts > 1 else "",
                extra=extra,
            )
            return attempts
        finally:
            if asked is not None:
                asked.set()
        await backoff.sleep()
