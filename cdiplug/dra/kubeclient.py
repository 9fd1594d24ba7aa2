"""The Kubernetes API as the DRA front end uses it: a few calls on ResourceSlices, ResourceClaims, Nodes.

:class:`KubeClient` is the seam: a protocol of plain-dict calls. :class:`LightkubeClient`
implements it with lightkube's async client (httpx under it; models of ``resource.k8s.io/v1``
that follow the Kubernetes releases). lightkube was chosen over kubernetes_asyncio because it is
small (a fraction of the import time and memory of the fully generated client), typed, and does
watches with resource versions itself; either does in-cluster and kubeconfig auth.

Auth (:func:`connect`): ``--kubeconfig`` when given; else in-cluster (the service account);
else ``$KUBECONFIG``. Every error of the client or the transport becomes a
:class:`~cdiplug.errors.KubernetesError` here, with the HTTP status where the server answered.

This module imports lightkube; it is itself imported only by the DRA front end, which is
imported only when some resource has ``api: dra``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import httpx2
import msgspec
from lightkube import AsyncClient, KubeConfig
from lightkube.config.kubeconfig import SERVICE_ACCOUNT
from lightkube.core.exceptions import ApiError, ConfigError, NotReadyError
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from ..errors import KubernetesError

FIELD_MANAGER = "cdiplug"
# What the client raises: the server's answers, the transport's failures, and answers it cannot decode.
_ERRORS = (ApiError, httpx2.HTTPError, msgspec.ValidationError, msgspec.DecodeError)
NOT_FOUND = 404
CONFLICT = 409
GONE = 410


class KubeClient(Protocol):
    """What the DRA front end asks of the API server; objects are JSON-shaped dicts."""

    async def list_slices(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        """This node's slices of ``driver`` and the list's resourceVersion."""
        ...

    def watch_slices(self, driver: str, node: str, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Events (ADDED, MODIFIED, DELETED) on those slices after ``resource_version``."""
        ...

    async def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def replace_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def delete_slice(self, name: str) -> None: ...

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def get_node(self, name: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def _error(what: str, exc: Exception) -> KubernetesError:
    if isinstance(exc, ApiError):
        status = exc.status
        code = int(status.code) if status is not None and status.code is not None else None
        message = status.message if status is not None and status.message else str(exc)
        return KubernetesError(f"{what}: {message}", code)
    if isinstance(exc, httpx2.HTTPError):
        return KubernetesError(f"{what}: {type(exc).__name__}: {exc}")
    return KubernetesError(f"{what}: {type(exc).__name__}: {exc}")


def _fields(driver: str, node: str) -> dict[str, Any]:
    return {"spec.nodeName": node, "spec.driver": driver}


def _slice(body: Mapping[str, Any]) -> ResourceSlice:
    try:
        obj = ResourceSlice.from_dict(dict(body))
    except msgspec.ValidationError as exc:
        raise KubernetesError(f"not a valid ResourceSlice: {exc}") from exc
    assert isinstance(obj, ResourceSlice)
    return obj


def _dict(obj: Any) -> dict[str, Any]:
    out = obj.to_dict()
    assert isinstance(out, dict)
    return out


class LightkubeClient:
    """:class:`KubeClient` over lightkube's :class:`AsyncClient`."""

    def __init__(self, config: KubeConfig, timeout: float = 10.0) -> None:
        self._client = AsyncClient(config, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(timeout), trust_env=False)

    async def list_slices(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        what = f"cannot list the ResourceSlices of {driver} on {node}"
        try:
            listing = self._client.list(ResourceSlice, fields=_fields(driver, node))
            items = [_dict(item) async for item in listing]
            try:
                version = listing.resourceVersion
            except NotReadyError:
                version = ""
            return items, version
        except _ERRORS as exc:
            raise _error(what, exc) from exc

    async def watch_slices(self, driver: str, node: str, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        what = f"watching the ResourceSlices of {driver} on {node} failed"
        try:
            async for kind, obj in self._client.watch(
                ResourceSlice, fields=_fields(driver, node), resource_version=resource_version
            ):
                yield kind, _dict(obj)
        except _ERRORS as exc:
            raise _error(what, exc) from exc

    async def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            created = await self._client.create(_slice(body))
        except _ERRORS as exc:
            raise _error(f"cannot create ResourceSlice {body['metadata']['name']}", exc) from exc
        return _dict(created)

    async def replace_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            replaced = await self._client.replace(_slice(body))
        except _ERRORS as exc:
            raise _error(f"cannot update ResourceSlice {body['metadata']['name']}", exc) from exc
        return _dict(replaced)

    async def delete_slice(self, name: str) -> None:
        try:
            await self._client.delete(ResourceSlice, name)
        except _ERRORS as exc:
            err = _error(f"cannot delete ResourceSlice {name}", exc)
            if err.status != NOT_FOUND:
                raise err from exc

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            claim = await self._client.get(ResourceClaim, name, namespace=namespace)
        except _ERRORS as exc:
            raise _error(f"cannot read ResourceClaim {namespace}/{name}", exc) from exc
        return _dict(claim)

    async def get_node(self, name: str) -> dict[str, Any]:
        try:
            node = await self._client.get(Node, name)
        except _ERRORS as exc:
            raise _error(f"cannot read Node {name}", exc) from exc
        return _dict(node)

    async def close(self) -> None:
        await self._client.close()


def load_config(kubeconfig: Path | None) -> KubeConfig:
    """``kubeconfig`` when given, else in-cluster, else ``$KUBECONFIG``; KubernetesError if none works."""
    try:
        if kubeconfig is not None:
            return KubeConfig.from_file(kubeconfig)
        if Path(SERVICE_ACCOUNT, "token").exists() and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return KubeConfig.from_service_account()
        env = os.environ.get("KUBECONFIG")
        if env:
            return KubeConfig.from_file(env.split(os.pathsep)[0])
    except (ConfigError, OSError, KeyError, ValueError) as exc:
        raise KubernetesError(f"cannot load Kubernetes credentials: {exc}") from exc
    raise KubernetesError("no Kubernetes credentials: not in a cluster, and neither --kubeconfig nor $KUBECONFIG is set")


def connect(kubeconfig: Path | None) -> KubeClient:
    """A client for the API server named by ``kubeconfig`` (see :func:`load_config`)."""
    return LightkubeClient(load_config(kubeconfig))
