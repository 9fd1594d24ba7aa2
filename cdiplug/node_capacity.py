"""Node-status capacity: advertise countable things that need no device plugin (dongles, licences).

As the Kubernetes task "Advertise Extended Resources for a Node" does, this sends a JSON Patch
(``application/json-patch+json``) to ``/api/v1/nodes/<node>/status`` that adds
``/status/capacity/<name>`` (``/`` in the name escaped as ``~1``, ``~`` as ``~0``: RFC 6901).
Only capacity is patched: the kubelet copies every capacity entry into allocatable at its next
status update and drops allocatable extended resources that left capacity
(``pkg/kubelet/nodestatus/setters.go``), so patching allocatable too would race with it.

The boundary: this module finds the API server (a kubeconfig file or the in-cluster service
account), builds the patch and sends it with the standard library's HTTP client; the ``kubernetes``
package is not a runtime dependency. The command line is ``cdiplug.cli.node_capacity``.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from .errors import CdiplugError, InputError
from .files import CONFIG_LIMIT, read_text
from .names import extended_resource_problem, is_dns_subdomain
from .safeload import load_yaml

PATCH_CONTENT_TYPE = "application/json-patch+json"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RBAC_HINT = "it needs 'patch' on the 'nodes/status' resource; see deploy/rbac-node-capacity.yaml"
# Used with fullmatch: with match, "$" would also accept a name that ends in a newline.


class NodeCapacityError(CdiplugError):
    """The API server refused or could not be reached; the message names the node and the server."""


class KubeconfigError(NodeCapacityError):
    """No usable credentials: a kubeconfig that cannot be read or lacks what is needed."""


class CapacityUsageError(NodeCapacityError):
    """A bad node name, resource name or quantity on the command line."""


@frozen
class ApiServer:
    """Where the API server is and how to authenticate to it."""

    url: str
    source: str  # where these settings came from, for error messages
    token: str | None = field(default=None, repr=False)
    ca_pem: str | None = field(default=None, repr=False)
    client_cert_pem: str | None = field(default=None, repr=False)
    client_key_pem: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    insecure: bool = False

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        context = ssl.create_default_context(cadata=self.ca_pem) if self.ca_pem else ssl.create_default_context()
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem:
            # load_cert_chain reads only files: a private folder, gone once loaded.
            with tempfile.TemporaryDirectory(prefix="cdiplug-kube-") as folder:
                cert, key = Path(folder, "client.crt"), Path(folder, "client.key")
                cert.write_text(self.client_cert_pem)
                key.touch(mode=0o600)
                key.write_text(self.client_key_pem or "")
                try:
                    context.load_cert_chain(cert, key)
                except ssl.SSLError as exc:
                    raise KubeconfigError(f"client certificate or key in {self.source} not usable: {exc.reason}") from exc
        return context

    def headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.basic_auth:
            pair = base64.b64encode(":".join(self.basic_auth).encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        return {}


# -- finding the API server -----------------------------------------------------------------------


def _read(path: Path, what: str, source: str) -> str:
    """A file a kubeconfig names: a regular file of at most 1 MiB, UTF-8 (``cdiplug.files``)."""
    try:
        return read_text(path, CONFIG_LIMIT, what) or ""
    except InputError as exc:
        raise KubeconfigError(f"{exc.message}: {path} (named in {source})") from exc


def _named(items: Any, name: str, kind: str, source: str) -> Mapping[str, Any]:
    for item in items or ():
        if isinstance(item, Mapping) and item.get("name") == name:
            value = item.get(kind)
            if isinstance(value, Mapping):
                return value
            raise KubeconfigError(f"{kind} {name!r} in {source} has no {kind!r} mapping")
    raise KubeconfigError(f"{kind} {name!r} not found in {source}")


def _pem(entry: Mapping[str, Any], key: str, base: Path, what: str, source: str) -> str | None:
    """``<key>-data`` (base64) or ``<key>`` (a file, relative to the kubeconfig's folder)."""
    data = entry.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(data, validate=True).decode()
        except (ValueError, UnicodeDecodeError) as exc:
            raise KubeconfigError(f"{key}-data in {source} is not base64 of a PEM file") from exc
    path = entry.get(key)
    return _read(base / path, what, source) if path else None


def load_kubeconfig(path: Path | str, context: str | None = None) -> ApiServer:
    """The API server of ``context`` (default: the current context) in the kubeconfig at ``path``."""
    path = Path(path)
    source = str(path)
    try:
        data = load_yaml(read_text(path, CONFIG_LIMIT, "kubeconfig") or "", source)
    except InputError as exc:
        raise KubeconfigError(str(exc)) from exc
    if not isinstance(data, Mapping):
        raise KubeconfigError(f"kubeconfig {source} is not a mapping")
    context = context or data.get("current-context")
    if not context:
        raise KubeconfigError(f"kubeconfig {source} has no current-context; name one with --context")
    ctx = _named(data.get("contexts"), context, "context", source)
    cluster = _named(data.get("clusters"), str(ctx.get("cluster")), "cluster", source)
    user = _named(data.get("users"), str(ctx.get("user")), "user", source) if ctx.get("user") else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"cluster {ctx.get('cluster')!r} in {source} has no http(s) server URL")
    base = path.parent
    if "exec" in user or "auth-provider" in user:
        raise KubeconfigError(
            f"user {ctx.get('user')!r} in {source} uses an exec or auth-provider plugin, which cdiplug "
            "does not run; use a kubeconfig with a token or a client certificate"
        )
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = _read(base / user["tokenFile"], "token file", source).strip()
    cert = _pem(user, "client-certificate", base, "client certificate", source)
    key = _pem(user, "client-key", base, "client key", source)
    if bool(cert) != bool(key):
        raise KubeconfigError(
            f"user {ctx.get('user')!r} in {source} has a client certificate without its key, or a key without its certificate"
        )
    basic = (str(user["username"]), str(user.get("password", ""))) if user.get("username") else None
    return ApiServer(
        url=server.rstrip("/"),
        source=f"{source} (context {context})",
        token=token or None,
        ca_pem=_pem(cluster, "certificate-authority", base, "certificate authority", source),
        client_cert_pem=cert,
        client_key_pem=key,
        basic_auth=basic,
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
    )


def in_cluster(env: Mapping[str, str], account_dir: Path = SERVICE_ACCOUNT_DIR) -> ApiServer:
    """The API server as a pod sees it: ``KUBERNETES_SERVICE_HOST/PORT`` and the service account."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeconfigError("KUBERNETES_SERVICE_HOST is not set: not running in a pod")
    source = f"the service account in {account_dir}"
    host = f"[{host}]" if ":" in host else host
    return ApiServer(
        url=f"https://{host}:{port}",
        source=source,
        token=_read(account_dir / "token", "token", source).strip(),
        ca_pem=_read(account_dir / "ca.crt", "CA certificate", source),
    )


def find_api_server(
    kubeconfig: str | None,
    context: str | None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> ApiServer:
    """``kubeconfig`` if given, else ``$KUBECONFIG`` (its first file that exists), else the service
    account when running in a pod, else ``~/.kube/config``."""
    env = os.environ if env is None else env
    if kubeconfig:
        return load_kubeconfig(kubeconfig, context)
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    for candidate in listed:
        if Path(candidate).exists():
            return load_kubeconfig(candidate, context)
    if listed:
        raise KubeconfigError(f"none of the files in KUBECONFIG exist: {env['KUBECONFIG']}")
    if env.get("KUBERNETES_SERVICE_HOST") and not context:
        return in_cluster(env, account_dir)
    default = (home if home is not None else Path.home()) / ".kube" / "config"
    if default.exists():
        return load_kubeconfig(default, context)
    raise KubeconfigError(f"no kubeconfig: pass --kubeconfig, set KUBECONFIG, create {default} or run in a pod")


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
    """Patch the capacity of nodes on one API server."""

    def __init__(self, api: ApiServer, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout
        self._context = api.ssl_context()

    def set(self, node: str, quantities: Mapping[str, int]) -> dict[str, str]:
        """Advertise ``quantities``; returns the node's capacity as the API server now has it."""
        check_node_name(node)
        for resource, count in quantities.items():
            check_resource(resource)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise CapacityUsageError(f"{resource}: the count {count!r} is not a non-negative integer")
        if not quantities:
            raise CapacityUsageError("name at least one NAME=COUNT")
        return self._patch(node, set_patch(quantities), "set")

    def remove(self, node: str, resources: Iterable[str]) -> dict[str, str]:
        check_node_name(node)
        resources = list(dict.fromkeys(resources))
        for resource in resources:
            check_resource(resource)
        if not resources:
            raise CapacityUsageError("name at least one resource to remove")
        return self._patch(node, remove_patch(resources), "remove")

    def _patch(self, node: str, patch: list[dict[str, str]], verb: str) -> dict[str, str]:
        url = f"{self.api.url}/api/v1/nodes/{urllib.parse.quote(node, safe='')}/status"
        request = urllib.request.Request(
            url,
            data=json.dumps(patch).encode(),
            method="PATCH",
            headers={"Content-Type": PATCH_CONTENT_TYPE, "Accept": "application/json", **self.api.headers()},
        )
        where = f"node {node!r} on {self.api.url} (credentials from {self.api.source})"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise NodeCapacityError(self._explain(exc, where, verb)) from exc
        except urllib.error.URLError as exc:
            raise NodeCapacityError(f"cannot reach the API server for {where}: {exc.reason}") from exc
        except OSError as exc:  # ssl.SSLError and socket timeouts among them
            raise NodeCapacityError(f"cannot talk to the API server for {where}: {exc}") from exc
        try:
            capacity = json.loads(body)["status"]["capacity"]
        except (ValueError, KeyError, TypeError) as exc:
            raise NodeCapacityError(f"the API server answered for {where} without status.capacity") from exc
        return {str(k): str(v) for k, v in capacity.items()}

    @staticmethod
    def _explain(exc: urllib.error.HTTPError, where: str, verb: str) -> str:
        try:
            message = json.loads(exc.read()).get("message") or exc.reason
        except (ValueError, AttributeError, OSError):
            message = exc.reason
        if exc.code == 404:
            return f"{where}: node not found ({message})"
        if exc.code == 403:
            return f"{where}: forbidden; {RBAC_HINT} ({message})"
        if exc.code == 401:
            return f"{where}: unauthorized, the API server rejected the credentials ({message})"
        if exc.code == 422 and verb == "remove":
            return f"{where}: cannot remove, most likely a named resource is not in its capacity ({message})"
        return f"{where}: HTTP {exc.code} ({message})"
