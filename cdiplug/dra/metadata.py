"""Device metadata files for workloads such as KubeVirt (KEP-5304, "DRA device attributes").

With ``device_metadata: true`` on a DRA resource, each prepared claim gets one file per request
on the host, under the driver's own plugin folder (the KEP's layout)::

    <plugins-dir>/<driver>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json

holding a ``DeviceMetadata`` (``apiVersion: metadata.resource.k8s.io/v1alpha1``, the version
KubeVirt reads; Kubernetes' ``api/metadata/v1alpha1`` types): the claim's ``metadata`` (name,
namespace, uid, generation 1, as the KEP's framework fills it), ``podClaimName`` for a claim made
from a template, and ``requests`` (the allocation result's request name, a subrequest with its
``/<sub>``) with their devices (name, driver, pool) and attributes exactly as our ResourceSlice
publishes them (typed: ``{"string": ...}``, ``{"int": ...}``, ``{"version": ...}``,
``{"bool": ...}``), so ``resource.kubernetes.io/pciBusID`` is there for PCI and NVIDIA devices.
The folder of a subrequest's devices (``gpu/small``) is its request's (``gpu``): the name a
container's ``resources.claims[].request`` uses.

The claim's CDI spec bind-mounts each file read-only into the containers using a device of that
request (:func:`mounts`), at the paths Kubernetes documents (``k8s.io/dynamic-resource-allocation``'s
``api/metadata``), for a claim the pod names and for one made from a template::

    /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json
    /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<pod claim name>/<request>/<driver>-metadata.json

(The KEP text's earlier ``/var/run/dra-device-attributes/<claim>/<request>/...`` is not what
Kubernetes 1.36 or KubeVirt use.) The pod claim name is the claim's
``resource.kubernetes.io/pod-claim-name`` annotation.

Files are written atomically (0644, folders 0755) before the spec naming them, and the claim's
folder is removed on unprepare. Namespace, claim and request names are checked as Kubernetes
names (a DNS label, a DNS subdomain, a DNS label) before any path is built from them, so none
leaves its folder; a file is at most :data:`MAX_FILE` bytes. Blocking functions: call them
through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lightkube.models.resource_v1 import ResourceClaim

from cdiplug.dra.checkpoint import PreparedClaim
from cdiplug.dra.slices import device_body
from cdiplug.errors import CdiError, InputError, InvalidRequest
from cdiplug.models.devices import Device, Mount
from cdiplug.models.names import is_dns_label, is_dns_subdomain
from cdiplug.toolkit.atomic import make_dirs, write_atomic
from cdiplug.toolkit.files import read_bounded

API_VERSION = "metadata.resource.k8s.io/v1alpha1"
KIND = "DeviceMetadata"
FOLDER = "dra-device-metadata"
FILE_NAME = "metadata.json"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"  # on claims made from a template
FILE_MODE = 0o644
DIR_MODE = 0o755
MAX_FILE = 256 * 1024  # 128 devices of 32 attributes fit many times over
MAX_SEGMENT = 255  # NAME_MAX: ``<namespace>_<claim>`` can exceed it (63 + 1 + 253)


def check_names(namespace: str, claim: str, driver: str) -> None:
    """InvalidRequest unless the names are Kubernetes names a path may be built from."""
    if not is_dns_label(namespace):
        raise InvalidRequest(f"claim namespace {namespace[:80]!r} is not a DNS label")
    if not is_dns_subdomain(claim):
        raise InvalidRequest(f"claim name {claim[:80]!r} is not a DNS subdomain")
    if not is_dns_subdomain(driver):
        raise InvalidRequest(f"DRA driver {driver[:80]!r} is not a DNS subdomain")
    if len(f"{namespace}_{claim}".encode()) > MAX_SEGMENT:
        raise InvalidRequest(f"claim {namespace}/{claim[:80]}: its metadata folder name would be over {MAX_SEGMENT} bytes")


def request_of(name: str) -> str:
    """The request a result belongs to (``gpu/small`` -> ``gpu``); InvalidRequest unless
    ``<request>`` or ``<request>/<subrequest>``, each a DNS label."""
    request, _, sub = name.partition("/")
    if not is_dns_label(request) or ("/" in name and not is_dns_label(sub)):
        raise InvalidRequest(f"request name {name[:80]!r} is not a DNS label (or label/label)")
    return request


def driver_folder(plugins_dir: Path, driver: str) -> Path:
    return Path(plugins_dir) / driver / FOLDER


def claim_folder(plugins_dir: Path, driver: str, namespace: str, claim: str) -> Path:
    """``<plugins-dir>/<driver>/dra-device-metadata/<namespace>_<claim>``, the names checked."""
    check_names(namespace, claim, driver)
    return driver_folder(plugins_dir, driver) / f"{namespace}_{claim}"


def host_path(plugins_dir: Path, driver: str, namespace: str, claim: str, request: str) -> Path:
    return claim_folder(plugins_dir, driver, namespace, claim) / request_of(request) / FILE_NAME


def container_path(driver: str, claim: str, request: str, pod_claim: str | None = None) -> str:
    """Where a container finds the file: under ``resourceclaims/<claim>`` for a claim the pod names,
    ``resourceclaimtemplates/<pod claim name>`` for one made from a template (its name is generated)."""
    where = f"resourceclaimtemplates/{pod_claim}" if pod_claim else f"resourceclaims/{claim}"
    return f"{CONTAINER_DIR}/{where}/{request_of(request)}/{driver}-metadata.json"


def pod_claim_name(claim: ResourceClaim) -> str | None:
    """The pod-local name of a claim made from a ResourceClaimTemplate (its annotation); None for
    a claim the pod names itself. InvalidRequest when the annotation is no DNS label."""
    annotations = (claim.metadata.annotations if claim.metadata is not None else None) or {}
    value = annotations.get(POD_CLAIM_ANNOTATION)
    if value is None:
        return None
    if not isinstance(value, str) or not is_dns_label(value):
        raise InvalidRequest(f"annotation {POD_CLAIM_ANNOTATION} {str(value)[:80]!r} is not a DNS label")
    return value


def _requests(record: PreparedClaim) -> dict[str, dict[str, list[str]]]:
    """Request folder -> result request name (``gpu`` or ``gpu/small``) -> the claim's device names."""
    out: dict[str, dict[str, list[str]]] = {}
    for d in record.devices:
        for r in d.request_names:
            names = out.setdefault(request_of(r), {}).setdefault(r, [])
            if d.device not in names:
                names.append(d.device)
    return out


def render(record: PreparedClaim, devices: Mapping[str, Device], pod_claim: str | None = None) -> dict[str, bytes]:
    """Request -> the content of its ``metadata.json``; ``devices`` maps slice names to prepared devices.

    InvalidRequest for names no path may hold, CdiError when a file would be over MAX_FILE.
    """
    check_names(record.namespace, record.name, record.driver)
    pools = {d.device: d.pool for d in record.devices}
    out: dict[str, bytes] = {}
    for request, results in _requests(record).items():
        body: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": record.name, "namespace": record.namespace, "uid": record.uid, "generation": 1},
        }
        if pod_claim:
            body["podClaimName"] = pod_claim
        body["requests"] = [
            {
                "name": result,  # as the allocation result has it: a subrequest keeps its "/<sub>"
                "devices": [
                    {
                        "name": name,
                        "driver": record.driver,
                        "pool": pools[name],
                        # as the slice publishes them (names, types, the 32-attribute limit)
                        "attributes": device_body(devices[name])["attributes"],
                    }
                    for name in names
                    if name in devices
                ],
            }
            for result, names in results.items()
        ]
        content = json.dumps(body, indent=2, sort_keys=True).encode() + b"\n"
        if len(content) > MAX_FILE:
            raise CdiError(
                f"the device metadata of claim {record.namespace}/{record.name} request {request} is over {MAX_FILE} bytes"
            )
        out[request] = content
    return out


def mounts(plugins_dir: Path, record: PreparedClaim, pod_claim: str | None = None) -> dict[str, tuple[Mount, ...]]:
    """Slice device name -> the read-only bind mounts of the metadata of the requests it serves."""
    out: dict[str, tuple[Mount, ...]] = {}
    for d in record.devices:
        requests = dict.fromkeys(request_of(r) for r in d.request_names)
        out[d.device] = tuple(
            Mount(
                host_path=str(host_path(plugins_dir, record.driver, record.namespace, record.name, r)),
                container_path=container_path(record.driver, record.name, r, pod_claim),
                read_only=True,  # the CDI builder makes it ["ro", "bind"], as the KEP's spec has it
            )
            for r in requests
        )
    return out


def written_pod_claim(plugins_dir: Path, record: PreparedClaim) -> str | None:
    """The ``podClaimName`` the claim's files were written with (to write them again the same way)."""
    for d in record.devices:
        for r in d.request_names:
            path = host_path(plugins_dir, record.driver, record.namespace, record.name, r)
            try:
                data = json.loads(read_bounded(path, MAX_FILE, "device metadata", follow=False, missing_ok=True) or b"null")
            except (InputError, ValueError):
                continue
            value = data.get("podClaimName") if isinstance(data, dict) else None
            if isinstance(value, str) and is_dns_label(value):
                return value
    return None


def write(plugins_dir: Path, record: PreparedClaim, devices: Mapping[str, Device], pod_claim: str | None = None) -> list[Path]:
    """Write the claim's metadata files atomically; the paths written. CdiError on failure."""
    written: list[Path] = []
    for request, content in render(record, devices, pod_claim).items():
        path = host_path(plugins_dir, record.driver, record.namespace, record.name, request)
        try:
            make_dirs(path.parent, DIR_MODE)
            write_atomic(path, content, FILE_MODE)
        except OSError as exc:
            raise CdiError(f"cannot write device metadata {path}: {exc.strerror or exc}") from exc
        written.append(path)
    return written


def _uid_of(path: Path) -> str | None:
    try:
        data = json.loads(read_bounded(path, MAX_FILE, "device metadata", follow=False, missing_ok=True) or b"null")
    except (InputError, ValueError):
        return None
    meta = data.get("metadata") if isinstance(data, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid if isinstance(uid, str) else None


def remove(plugins_dir: Path, driver: str, namespace: str, claim: str, uid: str) -> bool:
    """Remove the claim's metadata folder; False when it was not there.

    A folder whose files name another claim UID (the claim deleted and made again under the same
    name, prepared meanwhile) is left alone.
    """
    folder = claim_folder(plugins_dir, driver, namespace, claim)
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CdiError(f"cannot read device metadata folder {folder}: {exc.strerror}") from exc
    for entry in entries:
        found = _uid_of(Path(entry.path) / FILE_NAME) if entry.is_dir(follow_symlinks=False) else None
        if found is not None and found != uid:
            return False
    try:
        shutil.rmtree(folder)  # never follows a link inside it
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CdiError(f"cannot remove device metadata folder {folder}: {exc.strerror}") from exc
    return True


def remove_stale(plugins_dir: Path, driver: str, keep: Iterable[tuple[str, str]]) -> list[Path]:
    """Remove the claim folders of ``driver`` not in ``keep`` (namespace, name): a crash mid-prepare."""
    root = driver_folder(plugins_dir, driver)
    wanted = {f"{ns}_{name}" for ns, name in keep}
    try:
        entries = list(os.scandir(root))
    except OSError:  # none there, or unreadable: nothing this start can clean
        return []
    removed: list[Path] = []
    for entry in entries:
        if entry.name in wanted or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            shutil.rmtree(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed
