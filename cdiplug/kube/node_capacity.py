"""Node-status capacity: advertise countable things that need no device plugin (dongles, licences).

As the Kubernetes task "Advertise Extended Resources for a Node" does, this sends a JSON Patch
(``application/json-patch+json``) to ``/api/v1/nodes/<node>/status`` that adds
``/status/capacity/<name>`` (``/`` in the name escaped as ``~1``, ``~`` as ``~0``: RFC 6901).
Only capacity is patched: the kubelet copies every capacity entry into allocatable at its next
status update and drops allocatable extended resources that left capacity
(``pkg/kubelet/nodestatus/setters.go``), so patching allocatable too would race with it.

The boundary: this module checks the names and builds the patch; it is sent through cdiplug's
one Kubernetes client (:mod:`cdiplug.kube`, credentials in kubectl's order). The command line
is ``cdiplug.cli.node_capacity``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from cdiplug.errors import CdiplugError, KubernetesError
from cdiplug.kube.credentials import Credentials
from cdiplug.models.names import extended_resource_problem, is_dns_subdomain

if TYPE_CHECKING:
    from cdiplug.kube.failures import ApiCallError

RBAC_HINT = "it needs 'patch' on the 'nodes/status' resource; see deploy/rbac-node-capacity.yaml"
DEFAULT_TIMEOUT = 30.0


class NodeCapacityError(CdiplugError):
    """The API server refused or could not be reached; the message names the node and the server."""


class CapacityUsageError(NodeCapacityError):
    """A bad node name, resource name or quantity on the command line."""


# -- the patch ------------------------------------------------------------------------------------


def json_pointer_escape(token: str) -> str:
    """One reference token of an RFC 6901 JSON Pointer: ``~`` -> ``~0`` first, then ``/`` -> ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def capacity_path(resource: str) -> str:
    return "/status/capacity/" + json_pointer_escape(resource)


def check_node_name(node: str) -> None:
    if not is_dns_subdomain(node):
        raise CapacityUsageError(f"node name {node!r} is not a DNS-1123 subdomain (lower case, digits, '-', '.')")


def check_resource(resource: str) -> None:
    problem = extended_resource_problem(resource)
    if problem:
        raise CapacityUsageError(problem)


def parse_quantity(assignment: str) -> tuple[str, int]:
    """``example.com/dongle=4`` -> ``("example.com/dongle", 4)``; the count is a non-negative integer."""
    resource, sep, count = assignment.partition("=")
    if not sep:
        raise CapacityUsageError(f"{assignment!r}: expected NAME=COUNT, as in example.com/dongle=4")
    check_resource(resource)
    if not count.isascii() or not count.isdigit():
        raise CapacityUsageError(f"{assignment!r}: the count {count!r} is not a non-negative integer")
    return resource, int(count)


def set_patch(quantities: Mapping[str, int]) -> list[dict[str, str]]:
    """``add`` replaces an existing entry too (RFC 6902 4.1), so one op per resource suffices."""
    return [{"op": "add", "path": capacity_path(name), "value": str(count)} for name, count in quantities.items()]


def remove_patch(resources: Iterable[str]) -> list[dict[str, str]]:
    return [{"op": "remove", "path": capacity_path(name)} for name in resources]


# -- sending it -----------------------------------------------------------------------------------


class NodeCapacity:
    """Patch the capacity of nodes on one API server; each call bounded by ``timeout`` seconds."""

    def __init__(self, credentials: Credentials, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.credentials = credentials
        self.timeout = timeout

    def set(self, node: str, quantities: Mapping[str, int]) -> dict[str, str]:
        """Advertise ``quantities``; returns the node's capacity as the API server now has it."""
        check_node_name(node)
        for resource, count in quantities.items():
            check_resource(resource)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise CapacityUsageError(f"{resource}: the count {count!r} is not a non-negative integer")
        if not quantities:
            raise CapacityUsageError("name at least one NAME=COUNT")
        return asyncio.run(self._patch(node, set_patch(quantities), "set"))

    def remove(self, node: str, resources: Iterable[str]) -> dict[str, str]:
        check_node_name(node)
        resources = list(dict.fromkeys(resources))
        for resource in resources:
            check_resource(resource)
        if not resources:
            raise CapacityUsageError("name at least one resource to remove")
        return asyncio.run(self._patch(node, remove_patch(resources), "remove"))

    async def _patch(self, node: str, patch: list[dict[str, str]], verb: str) -> dict[str, str]:
        from cdiplug.kube.client import LightkubeClient  # lightkube only when something is sent
        from cdiplug.kube.failures import ApiCallError

        where = f"node {node!r} on {self.credentials.where}"
        try:
            client = LightkubeClient(self.credentials, self.timeout)
        except KubernetesError as exc:
            raise NodeCapacityError(f"node {node!r}: {exc}") from exc
        try:
            answer = await client.patch_node_status(node, patch)
        except ApiCallError as exc:
            raise NodeCapacityError(self._explain(exc, where, verb)) from exc
        finally:
            await client.close()
        capacity = answer.status.capacity if answer.status is not None else None
        if capacity is None:
            raise NodeCapacityError(f"the API server answered for {where} without status.capacity")
        return {str(k): str(v) for k, v in capacity.items()}

    @staticmethod
    def _explain(exc: ApiCallError, where: str, verb: str) -> str:
        message = exc.detail
        if exc.status is None:
            return f"cannot reach the API server for {where}: {message}"
        if exc.status == 404:
            return f"{where}: node not found ({message})"
        if exc.status == 403:
            return f"{where}: forbidden; {RBAC_HINT} ({message})"
        if exc.status == 401:
            return f"{where}: unauthorized, the API server rejected the credentials ({message})"
        if exc.status == 422 and verb == "remove":
            return f"{where}: cannot remove, most likely a named resource is not in its capacity ({message})"
        if message.startswith(f"HTTP {exc.status}"):  # an answer that is no Kubernetes Status: the client's words
            return f"{where}: {message}"
        return f"{where}: HTTP {exc.status} ({message})"
