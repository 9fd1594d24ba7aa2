"""The Kubernetes API as cdiplug uses it: ResourceSlices, ResourceClaims (and their status), Nodes and Events, over lightkube.

:class:`KubeClient` is the seam (the DRA front end, the node's own Node and ``cdiplug
node-capacity`` use it; tests pass fakes or the API-server stand-in). Slices, Nodes and Events
come and go as lightkube's typed models, and so do ResourceClaims and DeviceClasses (what users
wrote in them is read strictly by :mod:`cdiplug.dra.claims` and :mod:`cdiplug.dra.admission`);
patches are patches (JSON). An answer that does not decode as its model (a claim with a number
for a device name) is an error naming the call and the field (``… @ $.status.…``).
:class:`LightkubeClient` implements it with lightkube's async client (httpx under it; models of
``resource.k8s.io/v1`` that follow the Kubernetes releases). lightkube was chosen over
kubernetes_asyncio because it is small (a fraction of the import time and memory of the fully
generated client), typed, and does watches with resource versions itself.

Credentials come from :mod:`cdiplug.kube.credentials` (kubectl's order); lightkube only gets
their contents, never a file to read. Every call but a watch is bounded by ``timeout`` as a
whole (connect, send, answer), and every error of the client or the transport becomes a
:class:`~cdiplug.errors.KubernetesError` naming the API object, the server and where the
credentials came from, with the HTTP status where the server answered (None otherwise: retry),
and the server's ``Retry-After`` (a 429, a 503) as ``retry_after`` seconds.

A watch asks the server to end it after ``watch_timeout`` seconds (``timeoutSeconds``; lightkube
then opens it again from the last version) and gives up on it when nothing came for
``watch_timeout`` plus ``watch_grace`` (:data:`WATCH_GRACE`) seconds: a server that accepted the watch and went
silent (a half-open connection, a server that never answers) would otherwise hold it forever,
and every change after would be missed. Giving up ends the events; the caller watches again
from the last version seen (the server answers 410 Gone if that is too old: list again). One
call is one watch request: lightkube would open the watch again itself, at once, whenever the
server ends it, and a server (or a proxy) that ends every watch at once would make that a busy
loop (some 300 requests a second); instead the events end and the caller decides, with backoff.
That guard is the client's transport (lightkube's ``transport`` argument, an httpx2 transport
wrapping the usual one): within one watch call it refuses a second watch request.

Every failure of a call, whatever the client library raises for it (an error status, a
redirect, an answer without a ``Content-Type`` that lightkube's own error handling trips over,
an answer that does not decode), becomes one :class:`ApiCallError` naming the call (:mod:`.failures`).

This module imports lightkube; only the DRA front end, ``node-capacity`` and the node's own
dealings with its Node (:mod:`.own_node`) import it, each only when it is used.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx2
import msgspec
from lightkube import AsyncClient
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import Cluster, Context, User
from lightkube.core.exceptions import ConfigError, NotReadyError
from lightkube.models import core_v1 as core
from lightkube.models import resource_v1 as resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from cdiplug.errors import KubernetesError
from cdiplug.kube.credentials import Credentials, find_credentials
from cdiplug.kube.failures import ApiCallError, call_error

FIELD_MANAGER = "cdiplug"
DEFAULT_TIMEOUT = 10.0
WATCH_TIMEOUT = 300  # seconds the server keeps one watch open (timeoutSeconds)
WATCH_GRACE = 30.0  # seconds more without an event before a watch is given up as silent
# Seconds an idle connection to the API server is kept for the next call, as Go's clients keep
# them (net/http's IdleConnTimeout under client-go). httpx closes them after 5 s: on a node where
# pods start every few seconds nearly every claim read of a prepare would open a new TLS
# connection first (3-6 ms of the call on the bench cluster).
KEEPALIVE = 90.0
NOT_FOUND = 404
CONFLICT = 409

T = TypeVar("T")
# The watch requests sent by the current watch_slices call (in its task): a second one is
# lightkube opening the watch again by itself, refused so that the call ends instead.
_WATCH_OPENS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("cdiplug_watch_opens", default=None)


class _WatchEnded(Exception):
    """The server ended the watch and lightkube was about to open it again."""


class KubeClient(Protocol):
    """What cdiplug asks of the API server, as lightkube's models."""

    async def list_slices(self, driver: str, node: str) -> tuple[list[ResourceSlice], str]:
        """This node's slices of ``driver`` and the list's resourceVersion."""
        ...

    def watch_slices(self, driver: str, node: str, resource_version: str) -> AsyncIterator[tuple[str, ResourceSlice]]:
        """Events (ADDED, MODIFIED, DELETED) on those slices after ``resource_version``."""
        ...

    async def create_slice(self, body: ResourceSlice) -> ResourceSlice: ...

    async def replace_slice(self, body: ResourceSlice) -> ResourceSlice: ...

    async def delete_slice(self, name: str) -> None: ...

    async def get_claim(self, namespace: str, name: str) -> resource.ResourceClaim:
        """ResourceClaim ``namespace/name``; a claim with a field of the wrong type is an error naming the claim and the field."""
        ...

    async def get_device_class(self, name: str) -> resource.DeviceClass:
        """DeviceClass ``name`` (the admission webhook reads a claim's classes' configuration)."""
        ...

    async def get_node(self, name: str) -> core.Node: ...

    async def apply_claim_status(
        self, namespace: str, name: str, body: Mapping[str, Any], manager: str
    ) -> resource.ResourceClaim:
        """Server-side apply ``body`` to ``resourceclaims/<name>/status`` as field manager ``manager`` (forced)."""
        ...

    async def patch_node_status(self, name: str, patch: Sequence[Mapping[str, Any]]) -> core.Node:
        """Apply a JSON Patch (RFC 6902) to ``nodes/<name>/status``; the node as the server now has it."""
        ...

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> core.Node:
        """Apply a JSON merge patch (RFC 7386) to Node ``name`` (its labels); the node as the server now has it."""
        ...

    def watch_node(self, name: str) -> AsyncIterator[tuple[str, core.Node]]:
        """Events on Node ``name``: the node as it is first (ADDED), then each change, as long as it runs."""
        ...

    async def create_event(self, namespace: str, body: Event) -> Event:
        """Create a core v1 Event in ``namespace``."""
        ...

    async def close(self) -> None: ...


def _b64(pem: str | None) -> str | None:
    return base64.b64encode(pem.encode()).decode() if pem else None


def lightkube_config(credentials: Credentials) -> SingleConfig:
    """lightkube's configuration for ``credentials``: contents only, no file for lightkube to read but a token file."""
    cluster = Cluster(server=credentials.server, certificate_auth_data=_b64(credentials.ca_pem), insecure=credentials.insecure)
    username, password = credentials.basic_auth or (None, None)
    user = User(
        token=credentials.token,
        token_file=str(credentials.token_file) if credentials.token_file else None,
        client_cert_data=_b64(credentials.client_cert_pem),
        client_key_data=_b64(credentials.client_key_pem),
        username=username,
        password=password,
    )
    return SingleConfig(context_name="cdiplug", context=Context(cluster="cdiplug", user="cdiplug"), cluster=cluster, user=user)


def _fields(driver: str, node: str) -> dict[str, Any]:
    return {"spec.nodeName": node, "spec.driver": driver}


def slice_object(body: Mapping[str, Any]) -> ResourceSlice:
    """``body`` (a ResourceSlice as JSON) as lightkube's model; a KubernetesError when it is none."""
    try:
        obj = ResourceSlice.from_dict(dict(body))
    except msgspec.ValidationError as exc:
        raise KubernetesError(f"not a valid ResourceSlice: {exc}") from exc
    assert isinstance(obj, ResourceSlice)
    return obj


class _OneWatchPerCall(httpx2.AsyncBaseTransport):
    """The client's transport: within one :meth:`LightkubeClient.watch_slices` call, a second watch request is refused."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        opens = _WATCH_OPENS.get()
        if opens is not None and request.url.params.get("watch") == "true":
            opens[0] += 1
            if opens[0] > 1:
                raise _WatchEnded
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _transport(config: SingleConfig) -> _OneWatchPerCall:
    """The usual transport (the server's CA, the client certificate) under the watch guard."""
    assert config.user is not None
    verify = verify_cluster(config.cluster, config.user, config.abs_file, trust_env=False)
    limits = httpx2.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE)
    return _OneWatchPerCall(httpx2.AsyncHTTPTransport(verify=verify, trust_env=False, limits=limits))


class LightkubeClient:
    """:class:`KubeClient` over lightkube's :class:`AsyncClient`; each call bounded by ``timeout`` seconds."""

    def __init__(
        self,
        credentials: Credentials,
        timeout: float = DEFAULT_TIMEOUT,
        watch_timeout: int = WATCH_TIMEOUT,
        watch_grace: float = WATCH_GRACE,
    ) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self.watch_timeout = watch_timeout
        self.watch_grace = watch_grace
        try:
            config = lightkube_config(credentials)
            self._client = AsyncClient(
                config,
                field_manager=FIELD_MANAGER,
                timeout=httpx2.Timeout(timeout),
                trust_env=False,
                transport=_transport(config),
            )
        except (ConfigError, OSError, ValueError) as exc:  # ssl.SSLError among them: a CA or key not usable
            raise KubernetesError(f"cannot use the credentials from {credentials.source}: {exc}") from exc

    def _error(self, what: str, exc: BaseException) -> ApiCallError:
        return call_error(what, self.credentials.where, exc, self.timeout)

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout):
                return await call
        except Exception as exc:  # whatever the library raised (KeyError on an answer without Content-Type)
            raise self._error(what, exc) from exc

    async def list_slices(self, driver: str, node: str) -> tuple[list[ResourceSlice], str]:
        listing = self._client.list(ResourceSlice, fields=_fields(driver, node))

        async def read() -> tuple[list[ResourceSlice], str]:
            items = [item async for item in listing]
            try:
                return items, listing.resourceVersion
            except NotReadyError:
                return items, ""

        return await self._call(f"cannot list the ResourceSlices of {driver} on {node}", read())

    async def watch_slices(self, driver: str, node: str, resource_version: str) -> AsyncIterator[tuple[str, ResourceSlice]]:
        # Not bounded as a whole: a watch waits for changes as long as there are none (lightkube
        # opens it again when the server ends it); but each wait for the next event is.
        events = self._client.watch(
            ResourceSlice, fields=_fields(driver, node), resource_version=resource_version, server_timeout=self.watch_timeout
        ).__aiter__()
        _WATCH_OPENS.set([0])  # in the caller's task, which runs this generator's steps
        try:
            while True:
                try:
                    async with asyncio.timeout(self.watch_timeout + self.watch_grace):
                        kind, obj = await events.__anext__()
                except (StopAsyncIteration, TimeoutError, _WatchEnded):
                    return  # ended, or silent for too long: the caller watches again from the last version
                yield kind, obj
        except Exception as exc:
            raise self._error(f"watching the ResourceSlices of {driver} on {node} failed", exc) from exc
        finally:
            _WATCH_OPENS.set(None)  # not reset(token): a generator closed by the GC runs this elsewhere
            close = getattr(events, "aclose", None)  # lightkube's is a generator: close its response
            if close is not None:
                await close()

    async def create_slice(self, body: ResourceSlice) -> ResourceSlice:
        what = f"cannot create ResourceSlice {body.metadata.name if body.metadata else None}"
        return await self._call(what, self._client.create(body))

    async def replace_slice(self, body: ResourceSlice) -> ResourceSlice:
        what = f"cannot update ResourceSlice {body.metadata.name if body.metadata else None}"
        return await self._call(what, self._client.replace(body))

    async def delete_slice(self, name: str) -> None:
        try:
            await self._call(f"cannot delete ResourceSlice {name}", self._client.delete(ResourceSlice, name))
        except KubernetesError as exc:
            if exc.status != NOT_FOUND:
                raise

    async def get_claim(self, namespace: str, name: str) -> resource.ResourceClaim:
        what = f"cannot read ResourceClaim {namespace}/{name}"
        return await self._call(what, self._client.get(ResourceClaim, name, namespace=namespace))

    async def get_device_class(self, name: str) -> resource.DeviceClass:
        return await self._call(f"cannot read DeviceClass {name}", self._client.get(DeviceClass, name))

    async def apply_claim_status(
        self, namespace: str, name: str, body: Mapping[str, Any], manager: str
    ) -> resource.ResourceClaim:
        call = self._client.patch(
            ResourceClaim.Status,
            name,
            dict(body),
            namespace=namespace,
            patch_type=PatchType.APPLY,
            field_manager=manager,
            force=True,  # a manager of our own owns our entries; force only takes back what is ours
        )
        return await self._call(f"cannot write the status of ResourceClaim {namespace}/{name}", call)

    async def get_node(self, name: str) -> core.Node:
        return await self._call(f"cannot read Node {name}", self._client.get(Node, name))

    async def patch_node_status(self, name: str, patch: Sequence[Mapping[str, Any]]) -> core.Node:
        ops = [dict(op) for op in patch]
        call = self._client.patch(Node.Status, name, ops, patch_type=PatchType.JSON)
        return await self._call(f"cannot patch the status of Node {name}", call)

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> core.Node:
        call = self._client.patch(Node, name, dict(patch), patch_type=PatchType.MERGE)
        return await self._call(f"cannot patch Node {name}", call)

    async def watch_node(self, name: str) -> AsyncIterator[tuple[str, core.Node]]:
        # From no resourceVersion: the server sends the node as it is first (ADDED), then changes.
        try:
            async for kind, obj in self._client.watch(Node, fields={"metadata.name": name}):
                yield kind, obj
        except Exception as exc:
            raise self._error(f"watching Node {name} failed", exc) from exc

    async def create_event(self, namespace: str, body: Event) -> Event:
        metadata = msgspec.structs.replace(body.metadata or ObjectMeta(), namespace=namespace)
        event = msgspec.structs.replace(body, metadata=metadata)
        return await self._call(f"cannot create an Event in {namespace}", self._client.create(event))

    async def close(self) -> None:
        await self._client.close()


def connect(
    kubeconfig: Path | str | None = None,
    context: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    watch_timeout: int = WATCH_TIMEOUT,
) -> KubeClient:
    """A client for the API server found in kubectl's order (:func:`~cdiplug.kube.credentials.find_credentials`)."""
    return LightkubeClient(find_credentials(kubeconfig, context), timeout, watch_timeout)
