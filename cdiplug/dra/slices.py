"""ResourceSlices from snapshots: pure functions from a resource's devices to slice bodies.

What one driver publishes for one node (``docs/architecture.md``, "Contract: DRA"):

- one pool named after the node, spread over slices of at most 128 devices (64 when any device of
  the pool carries a taint: the API server's limit for tainted slices); every slice carries the
  pool's generation and ``resourceSliceCount``;
- device name = the device ID when it is a DNS label, else a deterministic mapping
  (:func:`cdiplug.models.names.dns_label_for`); attribute ``id`` always holds the original ID;
- the backend's typed attributes (string, int, bool, version) under names the API accepts
  (:func:`attribute_name`), its quantities as capacity; at most 32 of both together per device;
- sharing (KEP-5075): a device the backend marks ``shared`` carries ``allowMultipleAllocations``
  and its capacities' ``requestPolicy``, so the scheduler packs several claims onto it;
- partitions (KEP-4815): the pool's counter sets (a whole device's slices and memory) go in
  slices of their own (``sharedCounters``, no devices: the v1 rule), at most
  :data:`MAX_COUNTER_SETS` each, after the device slices; partitions name what they consume
  (``consumesCounters``) and, as tainted devices do, fill slices of at most 64;
- taints named per cause (NVIDIA's pattern, README "Device taints"): an unhealthy device carries
  one taint ``cdiplug.dev/<cause>=<code>`` (``cdiplug.dev/unhealthy=true`` when its backend named
  no cause), effect ``NoSchedule``: the scheduler allocates it to no new claim, claims holding it
  keep it (``NoExecute`` where the cause asks for eviction: pods holding it are evicted); a healthy device with an informational cause carries its taint with effect ``None``;
  a healthy device without one carries none, so a recovered device loses its taint. Where the
  API server drops device taints (the ``DRADeviceTaints`` gate is off) an unhealthy device is
  withdrawn from the slice instead. The publisher decides which (:class:`UnhealthyPolicy`) by
  reading back what the server kept.

Bodies are plain JSON-shaped dicts (``resource.k8s.io/v1``): the publisher sends them as they are.
Nothing here does I/O.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from attrs import frozen

from cdiplug.models.devices import UNHEALTHY_CAUSE, AttributeValue, Device, DeviceSnapshot, Version
from cdiplug.models.names import dns_label_for, is_dns_subdomain
from cdiplug.models.sharing import NOT_SHARED, NOTHING_SHARED, RequestPolicy

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_TAINTED = 64  # also when any device consumes counters
MAX_COUNTER_SETS = 8  # per slice
MAX_ATTRIBUTES = 32  # attributes and capacities together
MAX_STRING = 64
MAX_IDENTIFIER = 32
TAINT_DOMAIN = "cdiplug.dev"
UNHEALTHY_TAINT_KEY = f"{TAINT_DOMAIN}/{UNHEALTHY_CAUSE.name}"
ID_ATTRIBUTE = "id"

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Semantic versions as the API server checks them (semver 2.0.0, no leading "v").
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-((0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(\+([0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*))?"
)


class UnhealthyPolicy(str, enum.Enum):
    """What an unhealthy device becomes in a slice."""

    TAINT = "taint"
    WITHDRAW = "withdraw"


@frozen
class OwnerNode:
    """The Node object that owns our slices (garbage-collected with it)."""

    name: str
    uid: str


def attribute_name(name: str) -> str | None:
    """``name`` as the API accepts it: a C identifier of at most 32 characters (in the driver's
    domain), or ``<domain>/<identifier>``; other characters become ``_``. None when nothing is left."""
    domain, sep, ident = name.rpartition("/")
    if sep and not is_dns_subdomain(domain):
        return None
    ident = re.sub(r"[^A-Za-z0-9_]", "_", ident)
    if ident and ident[0].isdigit():
        ident = "_" + ident
    ident = ident[:MAX_IDENTIFIER]
    if not _C_IDENTIFIER.fullmatch(ident):
        return None
    return f"{domain}/{ident}" if sep else ident


def attribute_value(value: AttributeValue) -> dict[str, Any] | None:
    """The typed DRA attribute for one value, or None when the API would refuse it."""
    if isinstance(value, bool):  # before int: bool is an int in Python
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value} if -(2**63) <= value < 2**63 else None
    if isinstance(value, Version):
        text = value.value.removeprefix("v")
        if _SEMVER.fullmatch(text) and len(text) <= MAX_STRING:
            return {"version": text}
        return {"string": value.value} if len(value.value) <= MAX_STRING else None
    return {"string": value} if len(value) <= MAX_STRING else None


def device_attributes(device: Device) -> dict[str, dict[str, Any]]:
    """The device's attributes as the API takes them; ``id`` first and always there."""
    out: dict[str, dict[str, Any]] = {ID_ATTRIBUTE: {"string": device.id[:MAX_STRING]}}
    for key, value in device.attributes:
        name = attribute_name(key)
        typed = attribute_value(value)
        if name is None or typed is None or name in out:
            continue
        out[name] = typed
    return out


def request_policy(policy: RequestPolicy) -> dict[str, Any]:
    """A capacity's ``requestPolicy`` as the API takes it."""
    out: dict[str, Any] = {}
    if policy.default is not None:
        out["default"] = policy.default
    if policy.valid_values:
        out["validValues"] = list(policy.valid_values)
    elif policy.min is not None:
        valid_range = {"min": policy.min}
        if policy.max is not None:
            valid_range["max"] = policy.max
        if policy.step is not None:
            valid_range["step"] = policy.step
        out["validRange"] = valid_range
    return out


def device_capacity(device: Device) -> dict[str, dict[str, Any]]:
    sharing = device.sharing or NOT_SHARED
    policies = dict(sharing.capacity_policies) if sharing.shared else {}
    out: dict[str, dict[str, Any]] = {}
    for key, quantity in device.capacity:
        name = attribute_name(key)
        if name is not None and name not in out:
            out[name] = {"value": quantity}
            policy = policies.get(key)
            if policy is not None and (body := request_policy(policy)):
                out[name]["requestPolicy"] = body
    return out


def counters_body(counters: Iterable[tuple[str, str]]) -> dict[str, dict[str, str]]:
    return {name: {"value": value} for name, value in counters}


def device_taint(device: Device) -> dict[str, str] | None:
    """The device's taint: ``cdiplug.dev/<cause>=<code>``, ``NoSchedule`` while Unhealthy
    (``NoExecute`` when its cause asks for eviction), ``None`` (informational) on a Healthy device
    with a cause; None for a Healthy device without one."""
    cause = device.cause
    if cause is None:
        return None
    effect = "None" if device.healthy else "NoExecute" if cause.evict else "NoSchedule"
    return {"key": f"{TAINT_DOMAIN}/{cause.name}", "value": cause.code, "effect": effect}


def device_body(device: Device) -> dict[str, Any]:
    attributes = device_attributes(device)
    capacity = device_capacity(device)
    # At most 32 attributes and capacities together: the ID first, then the backend's order.
    room = MAX_ATTRIBUTES - len(capacity)
    if len(attributes) > room:
        attributes = dict(list(attributes.items())[: max(room, 1)])
        capacity = dict(list(capacity.items())[: MAX_ATTRIBUTES - len(attributes)])
    body: dict[str, Any] = {"name": dns_label_for(device.id), "attributes": attributes}
    if capacity:
        body["capacity"] = capacity
    sharing = device.sharing or NOT_SHARED
    if sharing.shared:
        body["allowMultipleAllocations"] = True
    if sharing.consumes_counters:
        body["consumesCounters"] = [
            {"counterSet": c.counter_set, "counters": counters_body(c.counters)} for c in sharing.consumes_counters
        ]
    taint = device_taint(device)
    if taint is not None:
        body["taints"] = [taint]
    return body


@frozen
class SliceSpec:
    """One slice to publish: its index in the pool and its devices, or its counter sets
    (generation filled in later)."""

    index: int
    devices: tuple[Mapping[str, Any], ...]
    shared_counters: tuple[Mapping[str, Any], ...] = ()


def pool_devices(snapshot: DeviceSnapshot | None, policy: UnhealthyPolicy) -> list[dict[str, Any]]:
    """The device bodies of the pool, sorted by name (stable slices for stable snapshots)."""
    if snapshot is None:
        return []
    bodies = []
    for device in snapshot.devices:
        if not device.healthy and policy is UnhealthyPolicy.WITHDRAW:
            continue
        bodies.append(device_body(device))
    return sorted(bodies, key=lambda b: str(b["name"]))


def pool_counters(snapshot: DeviceSnapshot | None) -> list[dict[str, Any]]:
    """The counter sets of the pool, sorted by name (empty for a pool without partitions)."""
    sets = (snapshot.sharing or NOTHING_SHARED).counter_sets if snapshot is not None else ()
    return sorted(({"name": c.name, "counters": counters_body(c.counters)} for c in sets), key=lambda b: str(b["name"]))


def split(devices: Sequence[Mapping[str, Any]], counter_sets: Sequence[Mapping[str, Any]] = ()) -> list[SliceSpec]:
    """Devices in slices of at most 128 (64 when any is tainted or consumes counters), then the
    counter sets in slices of their own (at most 8 each); one empty slice for no devices.

    An empty pool is still published (one slice without devices): it tells the scheduler that
    this node has none, rather than leaving it waiting for slices that never come.
    """
    small = any("taints" in d or "consumesCounters" in d for d in devices)
    size = MAX_DEVICES_TAINTED if small else MAX_DEVICES
    chunks = [tuple(devices[i : i + size]) for i in range(0, len(devices), size)] or [()]
    specs = [SliceSpec(i, chunk) for i, chunk in enumerate(chunks)]
    for i in range(0, len(counter_sets), MAX_COUNTER_SETS):
        specs.append(SliceSpec(len(specs), (), tuple(counter_sets[i : i + MAX_COUNTER_SETS])))
    return specs


def slice_name(node: str, driver: str, index: int) -> str:
    """``<node>-<driver>-<index>``, shortened with a hash when it would exceed 253 characters."""
    name = f"{node}-{driver}-{index}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node}\0{driver}".encode()).hexdigest()[:12]
    return f"{node[:200]}-{digest}-{index}"


def slice_body(
    spec: SliceSpec, *, driver: str, node: str, generation: int, count: int, owner: OwnerNode | None
) -> dict[str, Any]:
    """The whole ResourceSlice object for one :class:`SliceSpec`."""
    metadata: dict[str, Any] = {"name": slice_name(node, driver, spec.index)}
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": owner.name, "uid": owner.uid, "controller": True}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **(
                {"sharedCounters": [dict(c) for c in spec.shared_counters]}
                if spec.shared_counters
                else {"devices": [dict(d) for d in spec.devices]}
            ),
        },
    }


def names_to_ids(devices: Iterable[Device]) -> dict[str, str]:
    """Slice device name -> device ID, for reading allocations back."""
    return {dns_label_for(d.id): d.id for d in devices}
