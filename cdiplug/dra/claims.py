"""A ResourceClaim as the DRA front end reads it: our allocation results and our configuration.

:func:`allocated` turns the claim object (lightkube's ``ResourceClaim`` of ``resource.k8s.io/v1``,
as the client read it) into a frozen :class:`AllocatedClaim`:

- ``results``: the allocation results whose ``driver`` is ours and whose ``pool`` is this node's,
  in the claim's order, each with its ``adminAccess``;
- ``configs``: the allocation's opaque configuration entries for our driver
  (``status.allocation.devices.config[]``, which the scheduler fills from the DeviceClasses and
  the claim), in precedence order as the reference drivers apply them: every ``FromClass`` entry
  before every ``FromClaim`` entry, each group in the claim's order; a later entry overrides an
  earlier one. An entry naming ``requests`` applies to those requests only (a request named
  ``gpu`` covers its subrequests ``gpu/small``); :meth:`AllocatedClaim.configs_for` gives the
  entries of one request. What the parameters mean is the backend's business.

Strict: this is what users send. A claim that is not the one the kubelet named (another UID:
deleted and created again), is not allocated, or has a value we cannot take is an
:class:`~cdiplug.errors.InvalidRequest` naming the claim and the field
(``… @ $.status.allocation.devices.results[2].device``), every quoted value cut
(:mod:`cdiplug.toolkit.brief`); the kubelet retries that claim alone. A field of the wrong type
(a number for a name, parameters that are no JSON object) never gets here: the client refuses
the claim as it reads it, naming the claim and the field the same way
(:meth:`~cdiplug.kube.client.KubeClient.get_claim`). Sizes are bounded: results and
configuration entries per claim, the length of names, the nesting and size of parameters.

Pure: no I/O; Kubernetes objects end here.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs
from attrs import frozen
from lightkube.models.resource_v1 import DeviceAllocationResult, ResourceClaim

from cdiplug.errors import InvalidRequest
from cdiplug.toolkit.brief import brief

T = TypeVar("T")

MAX_RESULTS = 256  # the API allows 32 per claim; a few times that is no claim of the API server's
MAX_CONFIGS = 64  # the API allows 32 in the claim plus the classes'
MAX_NAME = 253  # a request ("req/sub"), pool or device name longer than this is no Kubernetes name
MAX_PARAMETERS = 64 << 10  # bytes of one entry's parameters, as JSON
MAX_DEPTH = 32  # nesting of parameters
_SHARE_ID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?")  # a UID: it goes into CDI names
_QUANTITY = re.compile(r"[+-]?[0-9.]{1,40}([eE][+-]?[0-9]{1,3}|[numkMGTPE]|[KMGTPE]i)?")


class ConfigSource(str, enum.Enum):
    CLASS = "FromClass"
    CLAIM = "FromClaim"


@frozen
class ClaimRef:
    """The claim the kubelet names: namespace, name and UID."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@frozen
class AllocatedDevice:
    """One allocation result: the request it serves, and the device by pool and name.

    On a device that allows multiple allocations (KEP-5075) the result is one share of it:
    ``share_id`` tells it from the others' shares, ``consumed_capacity`` (capacity -> quantity)
    is what this share takes. ``admin_access``: the result's ``adminAccess: true`` (monitoring;
    :mod:`.claim_config`)."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    consumed_capacity: tuple[tuple[str, str], ...] = ()
    admin_access: bool = False


@frozen
class ConfigEntry:
    """One opaque configuration entry for our driver: where it came from, whom it applies to, what it says."""

    source: ConfigSource
    requests: tuple[str, ...] = ()  # empty: every request of the claim
    parameters: Mapping[str, Any] = attrs.field(factory=dict)  # the opaque JSON object, decoded by the backend

    def applies_to(self, request: str) -> bool:
        return not self.requests or request in self.requests or request.partition("/")[0] in self.requests


@frozen
class AllocatedClaim:
    """What a claim asks of our driver on this node."""

    ref: ClaimRef
    results: tuple[AllocatedDevice, ...]
    configs: tuple[ConfigEntry, ...] = ()  # precedence order: the last applicable entry wins

    def configs_for(self, request: str) -> tuple[ConfigEntry, ...]:
        """The entries that apply to ``request``, lowest precedence first."""
        return tuple(c for c in self.configs if c.applies_to(request))


class _Claim:
    """Decoding one claim: errors name it and the field."""

    def __init__(self, ref: ClaimRef) -> None:
        self.ref = ref

    def error(self, message: str, path: str) -> InvalidRequest:
        return InvalidRequest(f"ResourceClaim {self.ref}: {message} @ $.{path}")

    def items(self, value: Sequence[T] | None, path: str, limit: int) -> Sequence[T]:
        if value is not None and len(value) > limit:
            raise self.error(f"has {len(value):,} entries, more than {limit}", path)
        return value or ()

    def name(self, value: str, path: str) -> str:
        if not value:
            raise self.error(f"must be a non-empty string, got {brief(value)}", path)
        if len(value) > MAX_NAME:
            raise self.error(f"is {len(value):,} characters long, more than {MAX_NAME}", path)
        return value

    def parameters(self, value: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        _check_depth(value, 1, lambda: self.error(f"nests deeper than {MAX_DEPTH} levels", path))
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > MAX_PARAMETERS:
            raise self.error(f"is {size:,} bytes as JSON, more than {MAX_PARAMETERS:,}", path)
        return value


def _check_depth(value: Any, depth: int, error: Any) -> None:
    if depth > MAX_DEPTH:
        raise error()
    if isinstance(value, Mapping):
        for item in value.values():
            _check_depth(item, depth + 1, error)
    elif isinstance(value, list):
        for item in value:
            _check_depth(item, depth + 1, error)


def allocated(claim: ResourceClaim, ref: ClaimRef, driver: str, pool: str) -> AllocatedClaim:
    """What ``claim`` asks of ``driver`` in ``pool``; InvalidRequest when it is no such claim or malformed."""
    c = _Claim(ref)
    metadata = claim.metadata
    uid = metadata.uid if metadata is not None else None
    if uid != ref.uid:
        raise InvalidRequest(f"ResourceClaim {ref.namespace}/{ref.name} has UID {brief(uid)}, not {ref.uid}: it was replaced")
    allocation = claim.status.allocation if claim.status is not None else None
    if metadata is not None and metadata.deletionTimestamp and not allocation:
        raise InvalidRequest(f"ResourceClaim {ref} is being deleted")
    if not allocation:
        raise InvalidRequest(f"ResourceClaim {ref} is not allocated")
    devices = allocation.devices or DeviceAllocationResult()
    out: list[AllocatedDevice] = []
    for i, result in enumerate(c.items(devices.results, "status.allocation.devices.results", MAX_RESULTS)):
        where = f"status.allocation.devices.results[{i}]"
        if result.driver != driver or result.pool != pool:
            continue  # another driver's, or another node's: not ours to judge
        share_id = result.shareID
        if share_id is not None and not _SHARE_ID.fullmatch(share_id):
            raise c.error(f"must be a UID (letters, digits and '-'), got {brief(share_id)}", f"{where}.shareID")
        consumed: Mapping[str, Any] = result.consumedCapacity or {}
        for key, value in consumed.items():
            if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
                raise c.error(f"must be a quantity, got {brief(value)}", f"{where}.consumedCapacity.{brief(key)[1:-1]}")
        out.append(
            AllocatedDevice(
                request=c.name(result.request, f"{where}.request"),
                pool=pool,
                device=c.name(result.device, f"{where}.device"),
                share_id=share_id,
                consumed_capacity=tuple((str(k), v) for k, v in consumed.items()),
                admin_access=bool(result.adminAccess),
            )
        )
    by_source: dict[ConfigSource, list[ConfigEntry]] = {ConfigSource.CLASS: [], ConfigSource.CLAIM: []}
    for i, entry in enumerate(c.items(devices.config, "status.allocation.devices.config", MAX_CONFIGS)):
        where = f"status.allocation.devices.config[{i}]"
        if entry.opaque is None or entry.opaque.driver != driver:
            continue  # another kind of configuration (none of ours), or another driver's
        try:
            source = ConfigSource(entry.source)
        except ValueError:
            raise c.error(f"must be FromClass or FromClaim, got {brief(entry.source)}", f"{where}.source") from None
        requests = tuple(
            c.name(r, f"{where}.requests[{j}]") for j, r in enumerate(c.items(entry.requests, f"{where}.requests", MAX_RESULTS))
        )
        parameters = c.parameters(entry.opaque.parameters, f"{where}.opaque.parameters")
        by_source[source].append(ConfigEntry(source=source, requests=requests, parameters=parameters))
    return AllocatedClaim(ref=ref, results=tuple(out), configs=(*by_source[ConfigSource.CLASS], *by_source[ConfigSource.CLAIM]))
