"""Sharing: advertising each device several times (config ``replicas: N``).

With ``replicas: N > 1`` the kubelet sees every device N times, as ``<id>::<i>`` for i = 0..N-1
(the spelling NVIDIA's time-slicing uses), so N containers can each be given "one" device that is
really the same hardware. Every replica copies its device's health, NUMA nodes, edits and
preparation group. With N == 1 nothing changes: IDs are the backend's own.

This module only renames; the allocator maps replica IDs back to the backend's devices (through
its own table built from :func:`expand`, which is exact), and preparation, CDI names and env
always use the underlying device. :func:`underlying` parses an ID and is for callers that know
replicas are on: a backend ID that itself ends in ``::<digits>`` is ambiguous to it.
"""

from __future__ import annotations

import re

import attrs

from cdiplug.models.devices import DeviceSnapshot

SEPARATOR = "::"
_REPLICA = re.compile(r"(?P<id>.+)::(?P<index>0|[1-9][0-9]*)", re.DOTALL)


def replica_id(device_id: str, index: int) -> str:
    """``replica_id("gpu-0", 2)`` -> ``"gpu-0::2"``."""
    return f"{device_id}{SEPARATOR}{index}"


def expand(snapshot: DeviceSnapshot, n: int) -> DeviceSnapshot:
    """The snapshot as advertised: every device ``n`` times, or ``snapshot`` itself when n == 1."""
    if n < 1:
        raise ValueError(f"replicas must be at least 1, got {n}")
    if n == 1:
        return snapshot
    return snapshot.with_devices(
        attrs.evolve(device, id=replica_id(device.id, i)) for device in snapshot.devices for i in range(n)
    )


def underlying(advertised_id: str) -> str:
    """The backend's device ID behind an advertised ID: ``gpu-0::2`` -> ``gpu-0``; others unchanged."""
    m = _REPLICA.fullmatch(advertised_id)
    return m.group("id") if m else advertised_id


def replica_index(advertised_id: str) -> int | None:
    """``gpu-0::2`` -> 2; None for an ID that is not a replica ID."""
    m = _REPLICA.fullmatch(advertised_id)
    return int(m.group("index")) if m else None
