"""A Kubernetes API server stand-in: the few calls a DRA driver makes, over real HTTP on 127.0.0.1.

:class:`ApiServerStandIn` speaks HTTP/1.1 (keep-alive; chunked streams for watches) and stores
objects in memory with one resourceVersion counter, as the API server does:

- ``resource.k8s.io/v1`` ResourceSlices: list (``fieldSelector`` on ``spec.nodeName`` and
  ``spec.driver``), watch (from a resourceVersion, replaying what came after it), create (409
  AlreadyExists), replace (409 Conflict on a stale resourceVersion, 404 when gone), delete;
  a few of the server's checks (at most 128 devices, 64 with taints; device names DNS labels;
  ``pool.resourceSliceCount`` at least 1). With ``drop_taints`` it drops device taints as a
  server with the ``DRADeviceTaints`` gate off does;
- ResourceClaims: get (tests put them with :meth:`put_claim`), and server-side apply
  (``application/apply-patch+yaml``, JSON inside) of their ``status`` as the API server does it
  for ``status.devices``, a list keyed by driver, pool and device: the entries the request's
  ``fieldManager`` applied before and no longer applies are removed, others' are kept; a UID
  in the body that is not the claim's is 422 (immutable), as the real server answers; :meth:`claim` reads one back; Nodes: get (:meth:`put_node`),
  and PATCH of a node or its ``status`` subresource with a JSON Patch (RFC 6902; a failing op is
  422, as the API server answers) or a JSON merge patch (RFC 7386); ``/status`` changes only the
  status, the node itself all but the status; Events: create (``generateName`` honoured),
  read back with :meth:`events`.

Requests need ``Authorization: Bearer <token>`` or, with ``tls=True``, a client certificate signed
by the stand-in's CA (401 otherwise); ``forbidden`` (``{"patch nodes/status"}``) answers 403 as
RBAC does, ``stall`` accepts requests and never answers them. Every request is in ``received``.

Fault switches (refuse, cut watches, 410 Gone, 409 from a second writer, 429): :mod:`.apifaults`.
:meth:`kubeconfig` writes a kubeconfig file for it; :meth:`wait_for` wakes on every change and request, never
polls. Tests change objects behind a driver's back with :meth:`delete_object` and :meth:`modify_slice`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import re
import ssl
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

from cdiplug.models.names import is_dns_label
from cdiplug.testing.apifaults import FaultSwitches, HttpError
from cdiplug.testing.jsonpatch import PatchError, json_patch, merge_patch

if TYPE_CHECKING:
    from cdiplug.testing.certs import TestPki

SLICES = "resourceslices"
CLAIMS = "resourceclaims"
NODES = "nodes"
EVENTS = "events"
_PATHS = [
    (re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices(?:/(?P<name>[^/]+))?$"), SLICES),
    (
        re.compile(
            r"^/apis/resource\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/resourceclaims(?:/(?P<name>[^/]+)(?P<status>/status)?)?$"
        ),
        CLAIMS,
    ),
    (re.compile(r"^/api/v1/nodes(?:/(?P<name>[^/]+)(?P<status>/status)?)?$"), NODES),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events(?:/(?P<name>[^/]+))?$"), EVENTS),
]
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
_KINDS = {
    SLICES: ("resource.k8s.io/v1", "ResourceSlice"),
    CLAIMS: ("resource.k8s.io/v1", "ResourceClaim"),
    NODES: ("v1", "Node"),
    EVENTS: ("v1", "Event"),
}

Key = tuple[str, str, str]  # (plural, namespace, name)


class Received(NamedTuple):
    """One request as the stand-in got it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    authorization: str | None
    body: bytes


def _field(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _selected(obj: Mapping[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        field, op, value = re.split(r"(!=|==|=)", term, maxsplit=1)
        found = str(_field(obj, field) or "")
        if (op == "!=") == (found == value):
            return False
    return True


class ApiServerStandIn(FaultSwitches):
    """An API server for ResourceSlices, ResourceClaims and Nodes on ``127.0.0.1:<port>``.

    With ``tls=True`` it serves HTTPS with a certificate from a CA of its own (``pki``, made with
    :func:`cdiplug.testing.certs.make_pki`) and also accepts that CA's client certificates.
    """

    def __init__(self, *, token: str = "test-token", drop_taints: bool = False, tls: bool = False) -> None:
        self.token = token
        self.drop_taints = drop_taints
        self.port = 0
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request served
        self.connections = 0  # connections accepted (refused ones not counted)
        self.received: list[Received] = []
        self.forbidden: set[str] = set()  # "<verb> <plural>[/status]" answered 403
        self.stall = False  # accept requests, never answer
        FaultSwitches.__init__(self)
        self.pki: TestPki | None = None
        if tls:
            from cdiplug.testing.certs import make_pki

            self.pki = make_pki()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._device_owners: dict[Key, dict[tuple[str, str, str], str]] = {}  # claim -> status.devices key -> manager
        self._history: list[tuple[int, str, Key, dict[str, Any]]] = []  # (rv, event type, key, object)
        self._version = 0
        self._changed = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._closing = False

    # -- lifecycle --

    async def __aenter__(self) -> ApiServerStandIn:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve_connection, "127.0.0.1", self.port, ssl=self._ssl_context())
        self.port = self._server.sockets[0].getsockname()[1]

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.pki is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory(prefix="cdiplug-standin-") as folder:  # load_cert_chain reads files only
            chain = Path(folder, "server.pem")
            chain.touch(mode=0o600)
            chain.write_text(self.pki.server.cert_pem + self.pki.server.key_pem)
            context.load_cert_chain(chain)
        context.load_verify_locations(cadata=self.pki.ca.cert_pem)
        context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate, or a token
        return context

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._closing = True
            async with self._changed:
                self._changed.notify_all()  # watches end
            for writer in self._connections.values():
                writer.close()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None
            self._closing = False

    @property
    def url(self) -> str:
        return f"{'https' if self.pki else 'http'}://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path, *, certificate: bool = False) -> Path:
        """Write a kubeconfig for this server to ``path`` (token auth, or the client certificate); return it."""
        cluster: dict[str, Any] = {"server": self.url}
        user: dict[str, Any] = {"token": self.token}
        if self.pki is not None:
            cluster["certificate-authority-data"] = _b64(self.pki.ca.cert_pem)
            if certificate:
                user = {
                    "client-certificate-data": _b64(self.pki.client.cert_pem),
                    "client-key-data": _b64(self.pki.client.key_pem),
                }
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": cluster}],
            "users": [{"name": "cdiplug", "user": user}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "cdiplug"}}],
            "current-context": "standin",
        }
        path.write_text(json.dumps(config))
        return path

    # -- what tests use --

    def put_node(self, name: str, capacity: Mapping[str, str] | None = None) -> dict[str, Any]:
        node: dict[str, Any] = {"metadata": {"name": name}}
        if capacity is not None:
            node["status"] = {"capacity": dict(capacity)}
        return self._store((NODES, "", name), node, create_only=False)

    def node(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._objects[(NODES, "", name)])

    def events(self, namespace: str) -> list[dict[str, Any]]:
        """The Events created in ``namespace``, oldest first."""
        found = [o for (p, n, _), o in self._objects.items() if p == EVENTS and n == namespace]
        return sorted(copy.deepcopy(found), key=lambda o: int(o["metadata"]["resourceVersion"]))

    def put_slice(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store a ResourceSlice as someone else (another driver, an earlier run) would have."""
        return self._store((SLICES, "", obj["metadata"]["name"]), dict(obj), create_only=False)

    def put_claim(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        meta = claim["metadata"]
        return self._store((CLAIMS, meta["namespace"], meta["name"]), dict(claim), create_only=False)

    def slices(self, **fields: str) -> list[dict[str, Any]]:
        """Every ResourceSlice, or those whose dotted fields (``spec__driver="x"``) match, by name."""
        out = [copy.deepcopy(o) for (plural, _, _), o in sorted(self._objects.items()) if plural == SLICES]
        for path, value in fields.items():
            out = [o for o in out if _field(o, path.replace("__", ".")) == value]
        return out

    def delete_object(self, plural: str, name: str, namespace: str = "") -> None:
        key = (plural, namespace, name)
        if key in self._objects:
            self._record("DELETED", key, self._objects.pop(key))

    def modify_slice(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        obj = copy.deepcopy(self._objects[(SLICES, "", name)])
        change(obj)
        self._store((SLICES, "", name), obj, create_only=False)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds; it is checked after every change."""
        async with self._changed:
            await self._changed.wait_for(predicate)

    # -- the store --

    def _store(self, key: Key, obj: dict[str, Any], create_only: bool, expect_version: str | None = None) -> dict[str, Any]:
        old = self._objects.get(key)
        if create_only and old is not None:
            raise HttpError(409, "AlreadyExists", f'{key[0]} "{key[2]}" already exists')
        if expect_version and old is not None and old["metadata"]["resourceVersion"] != expect_version:
            raise HttpError(
                409, "Conflict", f'Operation cannot be fulfilled on {key[0]} "{key[2]}": the object has been modified'
            )
        obj = copy.deepcopy(obj)
        api_version, kind = _KINDS[key[0]]
        obj.setdefault("apiVersion", api_version)
        obj.setdefault("kind", kind)
        meta = obj.setdefault("metadata", {})
        meta["name"] = key[2]
        if key[1]:
            meta["namespace"] = key[1]
        meta["uid"] = old["metadata"]["uid"] if old is not None else meta.get("uid") or str(uuid.uuid4())
        self._version += 1
        meta["resourceVersion"] = str(self._version)
        self._objects[key] = obj
        self._record("ADDED" if old is None else "MODIFIED", key, obj, bump=False)
        return copy.deepcopy(obj)

    def _record(self, kind: str, key: Key, obj: dict[str, Any], bump: bool = True) -> None:
        if bump:
            self._version += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._version)
        self._history.append((self._version, kind, key, obj))
        self._notify()

    def _notify(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(notify())

    def _check_slice(self, obj: Mapping[str, Any]) -> None:
        spec = obj.get("spec") or {}
        devices = spec.get("devices") or []
        tainted = any(d.get("taints") for d in devices)
        limit = 64 if tainted else 128
        problems = []
        if len(devices) > limit:
            problems.append(f"spec.devices: Too many: {len(devices)}: must have at most {limit} items")
        for i, d in enumerate(devices):
            if not is_dns_label(str(d.get("name", ""))):
                problems.append(f"spec.devices[{i}].name: Invalid value: {d.get('name')!r}: a DNS label")
            if len(d.get("attributes") or {}) + len(d.get("capacity") or {}) > 32:
                problems.append(f"spec.devices[{i}]: Too many attributes and capacities")
        pool = spec.get("pool") or {}
        if not spec.get("driver") or not pool.get("name") or int(pool.get("resourceSliceCount") or 0) < 1:
            problems.append("spec: driver, pool.name and pool.resourceSliceCount >= 1 are required")
        if problems:
            raise HttpError(422, "Invalid", "ResourceSlice is invalid: " + "; ".join(problems))

    def _strip_taints(self, obj: dict[str, Any]) -> None:
        if self.drop_taints:
            for d in (obj.get("spec") or {}).get("devices") or []:
                d.pop("taints", None)

    # -- HTTP --

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self.refuse:
            self.refused += 1
            writer.transport.abort()
            return
        self._connections[task] = writer
        self.connections += 1
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = header.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                if not await self._handle(method, target, headers, body, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            self._connections.pop(task, None)
            writer.close()

    async def _respond(self, writer: asyncio.StreamWriter, code: int, payload: Mapping[str, Any], extra: str = "") -> None:
        data = json.dumps(payload).encode()
        head = f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
        writer.write(head.encode() + data)
        await writer.drain()

    async def _handle(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        url = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append((method, url.path))
        self.received.append(Received(method, url.path, query, headers.get("content-type"), headers.get("authorization"), body))
        self._seen(query)
        self._notify()  # wait_for() on a count of requests
        if await self._answered_raw(writer):
            return False
        if self.stall:
            async with self._changed:
                await self._changed.wait_for(lambda: self._closing)
            return False
        extra = ""
        try:
            extra = self._throttled(query)
            if extra:
                raise HttpError(429, "TooManyRequests", "the server has received too many requests; try again later")
            if headers.get("authorization") != f"Bearer {self.token}" and not writer.get_extra_info("peercert"):
                raise HttpError(401, "Unauthorized", "Unauthorized")
            found = next(((m, p) for pattern, p in _PATHS if (m := pattern.match(url.path))), None)
            if found is None:
                raise HttpError(404, "NotFound", f"the server could not find the requested resource {url.path}")
            match, plural = found
            groups = match.groupdict()
            ns, name = groups.get("ns") or "", match.group("name")
            name = unquote(name) if name is not None else None
            resource = plural + ("/status" if groups.get("status") else "")
            verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method)
            if f"{verb} {resource}" in self.forbidden:
                raise HttpError(
                    403,
                    "Forbidden",
                    f'{plural} "{name}" is forbidden: User "system:serviceaccount:cdiplug:cdiplug" cannot {verb} '
                    f'resource "{resource}" in API group "" at the cluster scope',
                )
            if method == "GET" and name is None and query.get("watch") in ("true", "1"):
                await self._watch(writer, plural, ns, query)
                return False
            if method == "PATCH" and plural == CLAIMS and name is not None and groups.get("status"):
                code, payload = self._apply_claim_status(ns, name, query, headers.get("content-type"), body)
            elif method == "PATCH" and plural == NODES and name is not None:
                code, payload = self._patch_node(name, bool(groups.get("status")), headers.get("content-type"), body)
            else:
                code, payload = self._call(method, plural, ns, name, query, body)
        except HttpError as exc:
            status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
            code, payload = exc.code, {**status, "message": exc.message, "reason": exc.reason, "code": exc.code}
        await self._respond(writer, code, payload, extra)
        return True

    def _call(
        self, method: str, plural: str, ns: str, name: str | None, query: Mapping[str, str], body: bytes
    ) -> tuple[int, Any]:
        if method == "GET" and name is None:
            selector = query.get("fieldSelector", "")
            items = [o for (p, n, _), o in sorted(self._objects.items()) if p == plural and n == ns and _selected(o, selector)]
            return 200, {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)}, "items": items}
        if method == "GET":
            obj = self._objects.get((plural, ns, name or ""))
            if obj is None:
                raise HttpError(404, "NotFound", f'{plural} "{name}" not found')
            return 200, obj
        if method in ("POST", "PUT") and plural == SLICES:
            obj = json.loads(body)
            key: Key = (plural, ns, str(name if method == "PUT" else obj.get("metadata", {}).get("name") or ""))
            if not key[2]:
                raise HttpError(422, "Invalid", "metadata.name is required")
            if method == "PUT" and key not in self._objects:
                raise HttpError(404, "NotFound", f'{plural} "{key[2]}" not found')
            if method == "PUT":
                self._conflicting(key)
            self._check_slice(obj)
            self._strip_taints(obj)
            expect = (obj.get("metadata") or {}).get("resourceVersion") if method == "PUT" else None
            return (201 if method == "POST" else 200), self._store(key, obj, create_only=method == "POST", expect_version=expect)
        if method == "POST" and plural == EVENTS:
            obj = json.loads(body)
            meta = obj.setdefault("metadata", {})
            meta["name"] = meta.get("name") or f"{meta.get('generateName', '')}{uuid.uuid4().hex[:10]}"
            return 201, self._store((plural, ns, meta["name"]), obj, create_only=True)
        if method == "DELETE" and name is not None:
            key = (plural, ns, name)
            if key not in self._objects:
                raise HttpError(404, "NotFound", f'{plural} "{name}" not found')
            obj = self._objects[key]
            self.delete_object(plural, name, ns)
            return 200, obj
        raise HttpError(405, "MethodNotAllowed", f"{method} is not supported on {plural} here")

    def _apply_claim_status(
        self, ns: str, name: str, query: Mapping[str, str], content_type: str | None, body: bytes
    ) -> tuple[int, Any]:
        key: Key = (CLAIMS, ns, name)
        old = self._objects.get(key)
        if old is None:
            raise HttpError(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found')
        if content_type != APPLY_PATCH:
            raise HttpError(415, "UnsupportedMediaType", f"only server-side apply here, not {content_type}")
        manager = query.get("fieldManager")
        if not manager:
            raise HttpError(400, "BadRequest", "PATCH with apply requires a fieldManager")
        try:
            applied = json.loads(body)
        except ValueError as exc:
            raise HttpError(400, "BadRequest", f"the body of the request was in an unknown format: {exc}") from exc
        uid = (applied.get("metadata") or {}).get("uid")
        if uid and uid != old["metadata"]["uid"]:
            raise HttpError(  # as the real server answers
                422,
                "Invalid",
                f'resourceclaims.resource.k8s.io "{name}" is invalid: metadata.uid: Invalid value: "{uid}": field is immutable',
            )
        new = copy.deepcopy(old)
        status = new.setdefault("status", {})
        owners = self._device_owners.setdefault(key, {})
        wanted = {(d["driver"], d["pool"], d["device"]): d for d in (applied.get("status") or {}).get("devices") or []}
        kept = []
        for entry in status.get("devices") or []:
            k = (entry["driver"], entry["pool"], entry["device"])
            if k in wanted:
                continue  # replaced below (forced)
            if owners.get(k) == manager:
                owners.pop(k)  # ours before, not applied now: removed
                continue
            kept.append(entry)
        for k, entry in wanted.items():
            owners[k] = manager
            kept.append(entry)
        if kept:
            status["devices"] = kept
        else:
            status.pop("devices", None)
        return 200, self._store(key, new, create_only=False)

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._objects[(CLAIMS, namespace, name)])

    def _patch_node(self, name: str, status: bool, content_type: str | None, body: bytes) -> tuple[int, Any]:
        key: Key = (NODES, "", name)
        old = self._objects.get(key)
        if old is None:
            raise HttpError(404, "NotFound", f'nodes "{name}" not found')
        try:
            patch = json.loads(body)
        except ValueError as exc:
            raise HttpError(400, "BadRequest", f"the body of the request was in an unknown format: {exc}") from exc
        try:
            if content_type == JSON_PATCH:
                new = json_patch(old, patch)
            elif content_type == MERGE_PATCH:
                new = merge_patch(old, patch)
            else:
                raise HttpError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")
        except PatchError as exc:
            raise HttpError(422, "Invalid", str(exc)) from exc
        if not isinstance(new, dict):
            raise HttpError(422, "Invalid", "the patched node is not an object")
        kept = copy.deepcopy(old)
        if status:  # the subresource changes only the status; the node itself everything but
            kept["status"] = new.get("status") or {}
        else:
            kept = {**new, "status": old.get("status") or {}}
            kept["metadata"] = {**(new.get("metadata") or {}), "resourceVersion": old["metadata"]["resourceVersion"]}
        return 200, self._store(key, kept, create_only=False)

    async def _watch(self, writer: asyncio.StreamWriter, plural: str, ns: str, query: Mapping[str, str]) -> None:
        selector = query.get("fieldSelector", "")
        since = int(query.get("resourceVersion") or 0) or self._version
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        if self._gone(writer, since, self._version):
            await writer.drain()
            return
        if not query.get("resourceVersion"):  # as the API server: what is there now first, as ADDED
            for (p, n, _), obj in sorted(self._objects.items()):
                if p == plural and n == ns and _selected(obj, selector):
                    line = json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"
                    writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        await writer.drain()
        self._watches.add(writer)
        try:
            with contextlib.suppress(TimeoutError):  # timeoutSeconds: the server ends the watch, cleanly
                async with asyncio.timeout(float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None):
                    await self._stream(writer, plural, ns, selector, since)
                    return
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            self._watches.discard(writer)

    async def _stream(self, writer: asyncio.StreamWriter, plural: str, ns: str, selector: str, sent: int) -> None:
        while True:
            for version, kind, key, obj in self._history:
                if version <= sent:
                    continue
                sent = version
                if key[0] == plural and key[1] == ns and _selected(obj, selector):
                    line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                    writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            await writer.drain()
            async with self._changed:
                await self._changed.wait_for(lambda: self._version > sent or self._closing)
            if self._closing:
                return
