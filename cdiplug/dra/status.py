"""A ResourceClaim's device status (KEP-4817): what a driver tells back about the devices it prepared.

:func:`device_status` builds one ``status.devices[]`` entry from frozen values: the driver, pool
and device name, a ``Ready`` condition (True once prepared; False with a reason and a bounded
message when the preparation failed) and ``data``, a JSON object with what the prepared
:class:`~cdiplug.models.devices.Device` carries: its ID, its attributes (the PCI backend's
address, IOMMU group and NUMA node; the NVIDIA backend's UUID and minor; the fake backend's own),
its NUMA nodes and the host paths of its device nodes (the VFIO group device once bound).
:func:`apply_body` wraps entries as the server-side apply body of the claim's ``status``
subresource: the API server keeps ``status.devices`` as a list keyed by driver, pool and device,
so an apply with the driver's own field manager changes only that driver's entries, and an apply
with none removes them (and nobody else's).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from attrs import frozen

from cdiplug.errors import KubernetesError
from cdiplug.kube.client import NOT_FOUND, KubeClient
from cdiplug.models.devices import Device, Version

log = logging.getLogger(__name__)

READY = "Ready"
PREPARED = "Prepared"
PREPARE_FAILED = "PrepareFailed"
MAX_MESSAGE = 1024  # characters of a failure's message (the API allows 32768; a claim is read by people)
MAX_DATA = 10 * 1024  # bytes of ``data`` as JSON: the API server's limit for it
FIELD_MANAGER_PREFIX = "cdiplug-status-"
WRITE_TIMEOUT = 5.0  # seconds a status write may take: the kubelet waits for the prepare's answer


@frozen
class Failure:
    """Why a preparation failed: ``reason`` a CamelCase word, ``message`` for people."""

    reason: str
    message: str


def field_manager(driver: str) -> str:
    """The field manager that owns ``driver``'s entries of ``status.devices`` (one per driver: drivers never clash)."""
    return FIELD_MANAGER_PREFIX + driver


def bounded(message: str, limit: int = MAX_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _value(value: str | int | bool | Version) -> str | int | bool:
    return str(value) if isinstance(value, Version) else value


def device_data(device: Device) -> dict[str, Any]:
    """``data`` of one device: what the prepared device carries, generic over backends."""
    data: dict[str, Any] = {"id": device.id, "attributes": {k: _value(v) for k, v in device.attributes}}
    if device.numa_nodes:
        data["numaNodes"] = list(device.numa_nodes)
    nodes = [n.source for n in device.edits.device_nodes]
    if nodes:
        data["deviceNodes"] = nodes
    if len(json.dumps(data)) > MAX_DATA:  # never a status the server refuses: the ID is what must be there
        data = {"id": device.id, "truncated": True}
    return data


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def device_status(
    driver: str,
    pool: str,
    name: str,
    device: Device,
    failure: Failure | None = None,
    generation: int | None = None,
    now: str | None = None,
) -> dict[str, Any]:
    """One ``status.devices[]`` entry: ``device`` named ``name`` in ``pool``, prepared or (``failure``) not."""
    condition: dict[str, Any] = {
        "type": READY,
        "status": "False" if failure else "True",
        "reason": failure.reason if failure else PREPARED,
        "message": bounded(failure.message) if failure else "prepared by " + driver,
        "lastTransitionTime": now or _now(),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return {"driver": driver, "pool": pool, "device": name, "conditions": [condition], "data": device_data(device)}


def apply_body(namespace: str, name: str, uid: str, entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The server-side apply body for the claim's ``status``: exactly these entries of ours (none clears them).

    The UID is a precondition: a claim deleted and created again under the same name is not written.
    """
    status: dict[str, Any] = {}
    devices = [dict(e) for e in entries]
    if devices:
        status["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": status,
    }


async def publish(
    client: Callable[[], KubeClient],
    driver: str,
    namespace: str,
    name: str,
    uid: str,
    entries: Iterable[Mapping[str, Any]],
    timeout: float = WRITE_TIMEOUT,
) -> bool:
    """Make ``driver``'s entries of the claim's ``status.devices`` exactly ``entries``; whether it was written.

    Never raises: the kubelet needs only the CDI IDs, so a status that cannot be written (no
    permission, a server that does not answer within ``timeout``) is logged, not a failed call.
    """
    body = apply_body(namespace, name, uid, entries)
    what = "write" if body["status"] else "clear"
    try:
        async with asyncio.timeout(timeout):
            await client().apply_claim_status(namespace, name, body, field_manager(driver))
        return True
    except TimeoutError:
        log.warning(
            "%s: cannot %s the device status of claim %s/%s: no answer within %g s", driver, what, namespace, name, timeout
        )
    except KubernetesError as exc:
        if exc.status == NOT_FOUND and not body["status"]:
            return True  # the claim is gone, and our entries with it
        log.warning("%s: cannot %s the device status of claim %s/%s: %s", driver, what, namespace, name, exc)
    except Exception as exc:  # a status is never worth a failed prepare
        log.warning("%s: cannot %s the device status of claim %s/%s: %r", driver, what, namespace, name, exc)
    return False
