"""The API objects a DRA driver's tests handle: claims as the scheduler leaves them, slices as published.

:func:`allocated_claim` builds the JSON object an :class:`~cdiplug.testing.ApiServerStandIn`
serves (``put_claim``); :func:`claim_ref` names it as the kubelet does in NodePrepareResources;
:func:`settled_slices` awaits the driver's slices in the stand-in reaching a state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from cdiplug.testing.apiserver import ApiServerStandIn
from cdiplug.testing.dra_kubelet import ClaimRef


def allocated_claim(
    uid: str,
    results: list[tuple[str, str]],
    *,
    driver: str,
    pool: str,
    name: str = "",
    namespace: str = "default",
) -> dict[str, Any]:
    """A claim allocated to ``results`` ((request, device) of ``driver`` in ``pool``).

    One result of another driver rides along, as on a claim two drivers serve: ours must leave it be.
    """
    requests = [{"name": r, "exactly": {"deviceClassName": driver}} for r, _ in results]
    ours = [{"request": r, "driver": driver, "pool": pool, "device": d} for r, d in results]
    theirs = [{"request": "other", "driver": "other.example.com", "pool": pool, "device": "x"}]
    return {
        "metadata": {"name": name or f"claim-{uid[:8]}", "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": requests}},
        "status": {"allocation": {"devices": {"results": ours + theirs}}},
    }


def claim_ref(obj: dict[str, Any]) -> ClaimRef:
    """The kubelet's reference to the claim ``obj``."""
    meta = obj["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


async def settled_slices(
    api: ApiServerStandIn, driver: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 10
) -> list[dict[str, Any]]:
    """``driver``'s slices once ``predicate`` holds for them (TimeoutError after ``timeout`` s)."""
    await asyncio.wait_for(api.wait_for(lambda: predicate(api.slices(spec__driver=driver))), timeout)
    return api.slices(spec__driver=driver)
