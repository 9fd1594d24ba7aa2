"""A ResourceClaim as the DRA front end reads it: the allocation results for our driver on this node.

:func:`allocated` turns the claim object (a JSON-shaped dict from the API server) into frozen
:class:`AllocatedDevice` values: the results whose ``driver`` is ours and whose ``pool`` is this
node's, in the claim's order. A claim that is not the one the kubelet named (another UID: deleted
and created again) or that is not allocated is an :class:`~cdiplug.errors.InvalidRequest`.

Pure: no I/O; Kubernetes objects end here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from ..errors import InvalidRequest


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
    """One allocation result: the request it serves, and the device by pool and name."""

    request: str
    pool: str
    device: str


def allocated(claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str) -> tuple[AllocatedDevice, ...]:
    """The devices of ``driver`` in ``pool`` allocated to ``claim``; InvalidRequest when it is no such claim."""
    metadata = claim.get("metadata") or {}
    uid = metadata.get("uid")
    if uid != ref.uid:
        raise InvalidRequest(f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid}: it was replaced")
    if metadata.get("deletionTimestamp") and not (claim.get("status") or {}).get("allocation"):
        raise InvalidRequest(f"ResourceClaim {ref} is being deleted")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise InvalidRequest(f"ResourceClaim {ref} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    out: list[AllocatedDevice] = []
    for result in results:
        if not isinstance(result, Mapping):
            continue
        if result.get("driver") != driver or result.get("pool") != pool:
            continue
        device, request = result.get("device"), result.get("request")
        if not isinstance(device, str) or not isinstance(request, str):
            raise InvalidRequest(f"ResourceClaim {ref}: an allocation result lacks its device or request")
        out.append(AllocatedDevice(request=request, pool=pool, device=device))
    return tuple(out)
