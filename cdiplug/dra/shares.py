"""Shares of devices that allow multiple allocations (KEP-5075), as one claim's preparation sees them.

A claim may hold a share of a device rather than the device (its allocation result carries a
``shareID`` and the ``consumedCapacity``); several claims, or several requests of one claim,
may then hold the same device. What that changes in a prepare:

- names: the share's CDI device is ``<claim uid>-<device>-<shareID>`` (:func:`entry_name`), so
  two shares never define one CDI device, within a claim or across claims;
- the container learns what its share consumed: the backend names an env variable per capacity
  (``DeviceSharing.capacity_env``: ``FAKE_GPU_MEMORY_0=30Gi``); two shares of one device in one claim
  give their amounts comma-joined, in the claim's order (:func:`with_consumed`);
- the device is prepared once however many shares of it the claim holds (:func:`unique`), and
  stays prepared while any claim holds a share (:func:`cdiplug.dra.rollback.undo` keeps a device
  another claim still names).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from cdiplug.dra.slices import attribute_name
from cdiplug.models.devices import ContainerEdits, Device
from cdiplug.models.sharing import NOT_SHARED


def entry_name(device: str, share_id: str | None) -> str:
    """The claim-local name of a device (its slice name) or of one share of it."""
    return device if share_id is None else f"{device}-{share_id}"


def unique(devices: Iterable[Device]) -> list[Device]:
    """Each device once (by ID), in first-seen order: what the host prepares."""
    return list({d.id: d for d in devices}.values())


def consumed_env(device: Device, consumed: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Env variable -> amount for what one share consumed (capacities the backend names no variable for: none)."""
    names = {attribute_name(cap): env for cap, env in (device.sharing or NOT_SHARED).capacity_env}
    return {names[cap]: amount for cap, amount in consumed if cap in names}


def with_consumed(entries: Sequence[tuple[str, Device, tuple[tuple[str, str], ...]]]) -> list[tuple[str, Device]]:
    """(name, prepared device, consumed capacity) -> (name, device with the share's env), in order."""
    joined: dict[str, list[str]] = {}
    for _, device, consumed in entries:
        for var, amount in consumed_env(device, consumed).items():
            joined.setdefault(var, []).append(amount)
    out = []
    for name, device, consumed in entries:
        env = {k: ",".join(joined[k]) for k in consumed_env(device, consumed)}
        out.append(
            (name, attrs.evolve(device, edits=device.edits.merge(ContainerEdits(env=tuple(env.items())))) if env else device)
        )
    return out
