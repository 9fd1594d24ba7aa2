"""``release: restore``: which functions cdiplug bound may go back to their original driver now.

The device-plugin front end asks the kubelet's PodResources API which devices pods hold and
releases the rest of what :func:`releasable` names through the host, which calls the backend's
``unprepare`` (a restore). A function bound less than ``release_grace`` seconds ago is left alone:
the kubelet records an allocation only after our Allocate answer, so a fresh bind would otherwise
look unheld. The bound records live in the journal, so functions an earlier run of the daemon
bound are released too.
"""

from __future__ import annotations

from collections.abc import Mapping

from .journal import BoundRecord


def releasable(records: Mapping[str, BoundRecord], resource: str, grace: float, now: float) -> list[str]:
    """The addresses bound for ``resource`` at least ``grace`` seconds before ``now``, sorted."""
    return sorted(a for a, r in records.items() if r.resource == resource and now - r.bound_at >= grace)
