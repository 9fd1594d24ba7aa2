"""The device-plugin front end's part of the configuration: its settings, its checks, its part in a handover.

Light on purpose (it imports neither gRPC nor the front end): the configuration loads it to
structure a resource's settings, the node to ask which devices device-plugin pods still hold,
and only :meth:`DevicePluginApi.create` imports the front end (:mod:`.frontend`).

Settings of a resource with ``api: device-plugin`` (besides ``cdi_kind``, the kind of the spec
the host writes, which this front end's pods use): ``allocate`` (which parts of the answer to
send), ``replicas`` (each device advertised N times), ``register_when_empty``. Checked when the
file is read: ``replicas`` from 1 to 65,536, a non-empty ``allocate``, and every resource's
devices fitting one ListAndWatch message the kubelet accepts (4 MiB); at start and every reload,
the socket paths in the kubelet folder (107 bytes, cdiplug's temporary names included).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

from cdiplug.backend import SizedOptions
from cdiplug.frontend import MAX_SOCKET_PATH, FrontEndParts, FrontEndTypeBase, Latest, ResourceProblem, socket_problem
from cdiplug.models.devices import DEFAULT_ALLOCATE, AllocatePart, HealthCause
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World

if TYPE_CHECKING:
    from cdiplug.deviceplugin.frontend import DevicePluginFrontEnd


@frozen
class DevicePluginSettings:
    """The per-resource settings of ``api: device-plugin``."""

    allocate: frozenset[AllocatePart] = DEFAULT_ALLOCATE
    replicas: int = 1
    register_when_empty: bool = False  # register even while no device is found

    def sends(self, part: AllocatePart) -> bool:
        return part in self.allocate


DEFAULTS = DevicePluginSettings()


def settings_of(resource: ResourceConfig[object]) -> DevicePluginSettings:
    """The device-plugin settings of ``resource`` (the defaults when it was built without)."""
    return resource.settings if isinstance(resource.settings, DevicePluginSettings) else DEFAULTS


KUBELET_MAX_MESSAGE = 4 << 20  # the kubelet's gRPC receive limit, ListAndWatch included
LIST_AND_WATCH_BUDGET = KUBELET_MAX_MESSAGE * 9 // 10  # a margin for what the estimate leaves out
MAX_REPLICAS = 65536
# What UnixServer binds before renaming it into place, ".cdiplug-<hash>-<random>/s" (28 bytes),
# with a margin: the old ".cdiplug-<pid>-<n>.sock" was 30.
_TEMP_SOCKET_NAME = len(".cdiplug-4194304-99999999.sock")


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def list_and_watch_size(devices: int, id_length: int, numa_nodes: int = 1) -> int:
    """An upper bound of the ListAndWatch message for ``devices`` entries with IDs of at most
    ``id_length`` bytes, each on at most ``numa_nodes`` NUMA nodes (protobuf wire sizes)."""
    node = 1 + 1 + 1 + 5  # nodes entry: tag, length, NUMANode{ID: tag + varint of up to 2^31}
    topology = 1 + 1 + numa_nodes * node if numa_nodes else 0
    device = 1 + _varint_size(id_length) + id_length + 2 + len("Unhealthy") + topology
    return devices * (1 + _varint_size(device) + device)


def list_and_watch_problem(resource: str, options: Any, replicas: int) -> str | None:
    """Why the devices of ``resource`` cannot fit in one ListAndWatch message, or None.

    An options class that knows its device count says so (:class:`~cdiplug.backend.SizedOptions`:
    ``device_estimate(resource)`` is ``(devices, longest ID in bytes)``); otherwise one device with
    a short ID is assumed, so ``replicas`` alone is still checked.
    """
    devices, id_length = options.device_estimate(resource) if isinstance(options, SizedOptions) else (1, 1)
    if replicas > 1:
        id_length += len("::") + len(str(replicas - 1))
    size = list_and_watch_size(devices * replicas, id_length)
    if size <= LIST_AND_WATCH_BUDGET:
        return None
    what = f"{devices:,} devices × {replicas:,} replicas" if replicas > 1 else f"{devices:,} devices"
    return (
        f"{what} would make a ListAndWatch message of up to {size / (1 << 20):.1f} MiB; "
        f"the kubelet accepts {KUBELET_MAX_MESSAGE >> 20} MiB (cdiplug allows {LIST_AND_WATCH_BUDGET / (1 << 20):.1f})"
    )


def _problem(rc: ResourceConfig[object]) -> ResourceProblem | None:
    s = settings_of(rc)
    if s.replicas < 1:
        return ResourceProblem(rc.name, "replicas", f"replicas must be at least 1, got {s.replicas}")
    if s.replicas > MAX_REPLICAS:
        return ResourceProblem(rc.name, "replicas", f"replicas must be at most {MAX_REPLICAS:,}, got {s.replicas:,}")
    if not s.allocate:
        return ResourceProblem(rc.name, "allocate", "allocate must name at least one part")
    problem = list_and_watch_problem(rc.name, rc.options, s.replicas)
    if problem:
        return ResourceProblem(rc.name, "replicas" if s.replicas > 1 else "options", problem)
    return None


# What device-plugin pods hold is held with this cause while a resource leaves the device plugin
# (DRA publishes those devices tainted cdiplug.dev/device-plugin-pod=true:NoSchedule).
HELD = HealthCause("device-plugin-pod")


class DevicePluginApi(FrontEndTypeBase):
    """``api: device-plugin``: its settings, checks and part in a handover; its front end (:data:`FRONT_END`)."""

    settings = DevicePluginSettings
    host_specs = True
    hold_cause = HELD

    def check(self, resources: Sequence[ResourceConfig[object]]) -> Iterator[ResourceProblem]:
        for rc in resources:
            if (problem := _problem(rc)) is not None:
                yield problem

    def check_node(self, resources: Sequence[ResourceConfig[object]], world: World) -> Iterator[ResourceProblem]:
        temp = len(str(world.kubelet_dir).encode()) + 1 + _TEMP_SOCKET_NAME
        for rc in resources:
            if temp > MAX_SOCKET_PATH:
                yield ResourceProblem(
                    rc.name,
                    "name",
                    f"the kubelet folder {str(world.kubelet_dir)[:120]!r} is too long for unix sockets in it "
                    f"({temp} bytes with cdiplug's temporary socket name; at most {MAX_SOCKET_PATH})",
                )
            elif (problem := socket_problem(world.kubelet_dir / rc.socket_name)) is not None:
                yield ResourceProblem(rc.name, "name", problem)

    async def holding(
        self, resources: Sequence[ResourceConfig[object]], world: World, latest: Latest, *, at_start: bool
    ) -> Mapping[str, frozenset[str] | None]:
        """The devices of each resource that device-plugin pods hold (the kubelet's PodResources)."""
        from cdiplug.wire.pod_resources import list_allocated  # the stubs cost start-up time: only when asked

        allocated = await list_allocated(world.pod_resources_socket)
        return {rc.name: allocated.underlying(rc.name) for rc in resources}

    def consumers(self, resource: ResourceConfig[object]) -> str:
        return "device-plugin pods"

    def holds(self, resource: ResourceConfig[object]) -> str:
        return "advertised Unhealthy to the kubelet"

    def create(self, parts: FrontEndParts[Any, Any]) -> DevicePluginFrontEnd:
        from cdiplug.deviceplugin.frontend import DevicePluginFrontEnd  # loaded only when a resource names it

        return DevicePluginFrontEnd(parts)


FRONT_END = DevicePluginApi()
