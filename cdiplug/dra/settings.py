"""The DRA front end's part of the configuration: its settings, its checks, its part in a handover.

Light on purpose (it imports neither gRPC nor the Kubernetes client): the configuration loads it
to structure a resource's settings, the node to ask which devices claims still hold, and only
:meth:`DraApi.create` imports the front end (:mod:`.frontend`).

Settings of a resource with ``api: dra``: ``dra_driver`` (default ``<class>.<vendor>`` of the
name, or the backend's own default) and ``device_metadata`` (write KEP-5304 device metadata files,
:mod:`.metadata`). Checked when the file is read: driver names (DNS subdomains of at most 63
characters, one per resource); at start and every reload, the driver's two socket paths (107
bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from attrs import frozen

from cdiplug.backend import BackendPlugin
from cdiplug.frontend import FrontEndParts, FrontEndTypeBase, Latest, ResourceProblem, socket_problem
from cdiplug.models.devices import HealthCause
from cdiplug.models.instance import DRA_DRIVER
from cdiplug.models.names import dns_label_for, is_dns_subdomain
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World

if TYPE_CHECKING:
    from cdiplug.dra.frontend import DraFrontEnd

CHECKPOINT = "dra-claims.json"  # the claims the drivers prepared, in the state folder (.checkpoint)


def default_dra_driver(resource: str) -> str:
    """``example.com/fpga`` -> ``fpga.example.com`` (``<class>.<vendor>``)."""
    vendor, _, cls = resource.partition("/")
    return f"{cls.lower()}.{vendor}"


@frozen
class DraSettings:
    """The per-resource settings of ``api: dra``; ``dra_driver`` is filled in by the loader."""

    # the driver's name (default: <class>.<vendor> of the resource name, or the backend's own default)
    dra_driver: str = attrs.field(default="", metadata={"example": "fpga.example.com"})
    device_metadata: bool = False  # write KEP-5304 device metadata files (cdiplug.dra.metadata)


def settings_of(resource: ResourceConfig[object]) -> DraSettings:
    """The DRA settings of ``resource``: its own, or, for a resource built without them or served by
    another front end, the defaults as DRA would serve it (the driver named after the resource)."""
    settings = resource.settings
    if isinstance(settings, DraSettings) and settings.dra_driver:
        return settings
    base = settings if isinstance(settings, DraSettings) else DraSettings()
    return attrs.evolve(base, dra_driver=default_dra_driver(resource.name))


def driver_of(resource: ResourceConfig[object]) -> str:
    """The DRA driver serving ``resource``."""
    return settings_of(resource).dra_driver


def socket_paths(world: World, driver: str) -> tuple[Path, Path]:
    """The driver's ``dra.sock`` and its registration socket on this node.

    With ``world.pod_uid`` they are ``<driver>/dra-<uid>.sock`` and ``<driver>-<uid>-reg.sock``:
    the kubelet (1.33+) keeps every registered socket of a driver and calls whichever is there,
    so the old and the new pod of a rolling update serve side by side and a pod's stop removes
    only its own pair.
    """
    suffix = f"-{world.pod_uid}" if world.pod_uid else ""
    return (
        world.plugins_dir / driver / f"dra{suffix}.sock",
        world.plugins_registry_dir / f"{driver}{suffix}-reg.sock",
    )


def dra_driver_problem(driver: str) -> str | None:
    """Why ``driver`` cannot name a DRA driver (a DNS subdomain of at most 63 characters), or None."""
    if len(driver) > 63 or not is_dns_subdomain(driver):
        return f"DRA driver name {driver[:80]!r} must be a DNS subdomain (lower case, digits, '-', '.') of at most 63 characters"
    return None


# What running pods use through claims of a driver is held with this cause while its resource
# leaves DRA (the device plugin advertises those devices Unhealthy).
CLAIMED = HealthCause("dra-claim")


class DraApi(FrontEndTypeBase):
    """``api: dra``: its settings, checks and part in a handover; its front end (:data:`FRONT_END`)."""

    settings = DraSettings
    overlapping_devices = True
    hold_cause = CLAIMED
    # The claims a driver prepared, which the kubelet unprepares through it even after its
    # resource left DRA.
    state = (CHECKPOINT,)

    def settle(self, settings: DraSettings, resource: str, plugin: BackendPlugin[Any]) -> DraSettings:
        if settings.dra_driver:
            return settings
        driver = plugin.default_dra_driver(resource) if plugin.default_dra_driver else default_dra_driver(resource)
        return attrs.evolve(settings, dra_driver=driver)

    def check(self, resources: Sequence[ResourceConfig[object]]) -> Iterator[ResourceProblem]:
        seen: dict[str, str] = {}
        for rc in resources:
            driver = driver_of(rc)
            if (problem := dra_driver_problem(driver)) is not None:
                yield ResourceProblem(rc.name, "dra_driver", problem)
            elif driver in seen:
                yield ResourceProblem(rc.name, "dra_driver", f"DRA driver {driver!r} is already used by {seen[driver]}")
            seen.setdefault(driver, rc.name)

    def owned_names(self, resource: ResourceConfig[object]) -> Iterable[tuple[str, str]]:
        return ((DRA_DRIVER, driver_of(resource)),)

    def check_node(self, resources: Sequence[ResourceConfig[object]], world: World) -> Iterator[ResourceProblem]:
        for rc in resources:
            for path in socket_paths(world, driver_of(rc)):
                if (problem := socket_problem(path)) is not None:
                    yield ResourceProblem(rc.name, "dra_driver", problem)
                    break

    async def holding(
        self, resources: Sequence[ResourceConfig[object]], world: World, latest: Latest, *, at_start: bool
    ) -> Mapping[str, frozenset[str] | None]:
        """The devices of each resource that running pods use through claims of its driver
        (PodResources' dynamic resources, ``<node>/<device>`` in the driver's pool); None while
        some are but the backend has not reported, so which is not known. At start, with no
        checkpoint, no claim of ours can be prepared: nothing is asked."""
        if at_start and not (world.own_state_dir / CHECKPOINT).exists():
            return {rc.name: frozenset() for rc in resources}
        from cdiplug.wire.pod_resources import list_allocated  # the stubs cost start-up time: only when asked

        allocated = await list_allocated(world.pod_resources_socket)
        pool = f"{world.node_name}/"
        held: dict[str, frozenset[str] | None] = {}
        for rc in resources:
            claimed = {c for c in allocated.of_driver(driver_of(rc)) if c.startswith(pool)}
            snapshot = latest(rc.name) if claimed else None
            if not claimed:
                held[rc.name] = frozenset()
            elif snapshot is None:
                held[rc.name] = None
            else:
                held[rc.name] = frozenset(d.id for d in snapshot.devices if pool + dns_label_for(d.id) in claimed)
        return held

    def consumers(self, resource: ResourceConfig[object]) -> str:
        return f"pods through {driver_of(resource)} claims"

    def holds(self, resource: ResourceConfig[object]) -> str:
        return "published to DRA tainted NoSchedule"

    def create(self, parts: FrontEndParts[Any, Any]) -> DraFrontEnd:
        from cdiplug.dra.frontend import DraFrontEnd  # loaded only when a resource names it, or claims are left

        return DraFrontEnd(parts)


FRONT_END = DraApi()
