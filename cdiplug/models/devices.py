"""The device model: frozen value objects that flow between backends, the core and the gRPC edge.

A backend describes what it found as a :class:`DeviceSnapshot` per resource: every device with its
health, NUMA nodes and the container edits (device nodes, mounts, env) a container needs to use it,
plus edits common to the whole resource. The core diffs snapshots, the allocator turns requested
devices into a :class:`ContainerAllocation`, and only ``cdiplug.deviceplugin.server`` turns that into protobuf.
Nothing here does I/O.
"""

from __future__ import annotations

import enum
import operator
import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

import attrs
from attrs import field, frozen

from cdiplug.models.names import is_dns_label
from cdiplug.models.pairs import str_pairs
from cdiplug.models.sharing import DeviceSharing, PoolSharing, device_sharing, pool_sharing


class Health(str, enum.Enum):
    """Device health as the kubelet spells it."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


_CAUSE_CODE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _check_cause_name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not is_dns_label(value):
        raise ValueError(f"health cause {value!r}: expected lower-case letters, digits and '-', at most 63")


def _check_cause_code(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _CAUSE_CODE.fullmatch(value):
        raise ValueError(f"health cause code {value!r}: expected letters, digits, '-', '_' and '.', at most 63")


@frozen
class HealthCause:
    """Why a device is Unhealthy, as a backend names it: ``name`` (``xid``, ``link-down``) and a
    ``code`` (the XID number; ``true`` when there is nothing more to say).

    DRA publishes it as the device taint ``cdiplug.dev/<name>=<code>``; on a Healthy device a
    cause is informational (a taint with effect ``None``). Both parts are checked here so that
    what a backend sets is always a valid taint key and value. ``evict``: an Unhealthy device's
    taint is ``NoExecute`` rather than ``NoSchedule`` (pods holding it are evicted: a device that
    is gone, say).
    """

    name: str = field(validator=_check_cause_name)
    code: str = field(default="true", validator=_check_cause_code)
    evict: bool = False


UNHEALTHY_CAUSE = HealthCause("unhealthy")
"""The cause of an Unhealthy device whose backend names none (the taint ``cdiplug.dev/unhealthy``)."""


class AllocatePart(str, enum.Enum):
    """Which parts of an Allocate answer a resource sends (config key ``allocate``)."""

    CDI_CRI = "cdi-cri"  # ContainerAllocateResponse.cdi_devices
    DEVICE_SPECS = "device-specs"  # classic DeviceSpecs
    ENVVAR = "envvar"  # env vars
    CDI_ANNOTATIONS = "cdi-annotations"  # cdi.k8s.io/... annotations for older runtimes
    MOUNTS = "mounts"  # classic mounts


DEFAULT_ALLOCATE: frozenset[AllocatePart] = frozenset(AllocatePart) - {AllocatePart.CDI_ANNOTATIONS}


@frozen
class Version:
    """A semantic version attribute (DRA's ``version`` type: ``1.2.3``), apart from plain strings."""

    value: str

    def __str__(self) -> str:
        return self.value


AttributeValue = str | int | bool | Version


def _attribute_tuple(
    value: Mapping[str, AttributeValue] | Iterable[tuple[str, AttributeValue]],
) -> tuple[tuple[str, AttributeValue], ...]:
    if type(value) is tuple and all(
        type(p) is tuple and len(p) == 2 and type(p[0]) is str and isinstance(p[1], (str, int, bool, Version)) for p in value
    ):
        return value  # already what it would become: kept, not copied
    items = value.items() if isinstance(value, Mapping) else value
    out = []
    for k, v in items:
        if not isinstance(v, (str, int, bool, Version)):
            raise TypeError(f"attribute {k!r}: {type(v).__name__} is no attribute value (str, int, bool or Version)")
        out.append((str(k), v))
    return tuple(out)


MAX_NUMA_NODE = 2**31 - 1
"""The highest NUMA node number cdiplug accepts from a config or sysfs (the kernel's are far lower;
the kubelet's topology manager keeps them in an int)."""
# The attribute Kubernetes standardised for "devices on the same PCIe root" (KEP-5491).
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
# The standard attribute for a device's PCI address (``0000:3b:00.0``), what KubeVirt reads (KEP-5304).
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"


def _sorted_ints(value: Iterable[int]) -> tuple[int, ...]:
    if type(value) is tuple and len(value) < 2 and all(type(v) is int for v in value):
        return value  # () or one node, as most devices have: nothing to sort (attrs.evolve comes here too)
    return tuple(sorted({int(v) for v in value}))


@frozen
class DeviceNode:
    """A device node a container gets: ``path`` inside the container, ``host_path`` when it differs.

    ``permissions`` are cgroup permissions (``r``, ``w``, ``m``). ``type``/``major``/``minor`` are
    optional hints for CDI; runtimes read them from the host node when absent. ``file_mode``,
    ``uid`` and ``gid`` set the node's mode and owner in the container (CDI only).
    """

    path: str
    host_path: str | None = None
    permissions: str = "rw"
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None

    @property
    def source(self) -> str:
        return self.host_path or self.path


@frozen
class Mount:
    """A bind mount: ``host_path`` on the node to ``container_path`` in the container."""

    host_path: str
    container_path: str
    read_only: bool = True
    # converter=tuple[str, ...] is tuple() that mypy's attrs plugin can type (a bare tuple leaves the item type open)
    options: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    type: str | None = None


@frozen
class Hook:
    """An OCI hook (CDI only: the classic answer has no hooks)."""

    hook_name: str
    path: str
    args: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    env: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    timeout: int | None = None


@frozen
class ContainerEdits:
    """What a container needs to use a device: env, device nodes, mounts, hooks, extra groups."""

    env: tuple[tuple[str, str], ...] = field(default=(), converter=str_pairs)
    device_nodes: tuple[DeviceNode, ...] = field(default=(), converter=tuple[DeviceNode, ...])
    mounts: tuple[Mount, ...] = field(default=(), converter=tuple[Mount, ...])
    hooks: tuple[Hook, ...] = field(default=(), converter=tuple[Hook, ...])
    additional_gids: tuple[int, ...] = field(default=(), converter=tuple[int, ...])

    def is_empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts or self.hooks or self.additional_gids)

    def merge(self, other: ContainerEdits) -> ContainerEdits:
        """Both edits together; later env wins, duplicates (same node, same mount) are kept once."""
        return ContainerEdits.combine((self, other))

    @classmethod
    def combine(cls, edits: Iterable[ContainerEdits]) -> ContainerEdits:
        """All of ``edits`` together in one pass, as repeated :meth:`merge` would give them.

        Later env wins; of device nodes with the same path, mounts with the same container path,
        equal hooks and equal groups the first is kept.
        """
        edits = tuple(edits)
        return cls(
            env=dict(kv for e in edits for kv in e.env),
            device_nodes=_unique((n for e in edits for n in e.device_nodes), key=_node_path),
            mounts=_unique((m for e in edits for m in e.mounts), key=_container_path),
            hooks=tuple(dict.fromkeys(h for e in edits for h in e.hooks)),
            additional_gids=tuple(dict.fromkeys(g for e in edits for g in e.additional_gids)),
        )


def _node_path(node: DeviceNode) -> str:
    return node.path


def _container_path(mount: Mount) -> str:
    return mount.container_path


T = TypeVar("T")


def _unique(items: Iterable[T], key: Callable[[T], Hashable]) -> tuple[T, ...]:
    seen: dict[Hashable, T] = {}
    for item in items:
        seen.setdefault(key(item), item)
    return tuple(seen.values())


@frozen
class Device:
    """One device of a resource as a backend sees it.

    ``numa_nodes`` is empty when the topology is unknown (never a made-up node 0).
    ``prepare_group`` names the unit that preparation works on (an IOMMU group, say): devices with
    the same group are prepared together and one at a time. ``attributes`` describe the device
    (vendor, model, driver) for people, logs and DRA, which publishes them typed (string, int,
    bool, :class:`Version`) so that claims can select on them with CEL; they take part in
    equality, so a change there (a driver rebound) is a change of the device. ``capacity`` holds
    amounts as Kubernetes quantities (``memory: 80Gi``), published by DRA as device capacity.
    ``health_cause`` says why (optional; :attr:`cause` falls back to :data:`UNHEALTHY_CAUSE`).

    ``sharing``: how DRA shares the device between claims (a shared device, a partition:
    :class:`~cdiplug.models.sharing.DeviceSharing`); None for a device given whole, and always for
    the device-plugin API, which never reads it.
    """

    id: str
    health: Health = Health.HEALTHY
    numa_nodes: tuple[int, ...] = field(default=(), converter=_sorted_ints)
    edits: ContainerEdits = ContainerEdits()
    prepare_group: str | None = None
    attributes: tuple[tuple[str, AttributeValue], ...] = field(default=(), converter=_attribute_tuple)
    capacity: tuple[tuple[str, str], ...] = field(default=(), converter=str_pairs)
    health_cause: HealthCause | None = None
    sharing: DeviceSharing | None = field(default=None, converter=device_sharing)

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY

    @property
    def cause(self) -> HealthCause | None:
        """Why the device is Unhealthy (the generic cause when the backend named none); on a
        Healthy device the informational cause its backend set, else None."""
        if self.healthy:
            return self.health_cause
        return self.health_cause or UNHEALTHY_CAUSE

    def attribute(self, name: str, default: AttributeValue | None = None) -> AttributeValue | None:
        for key, value in self.attributes:
            if key == name:
                return value
        return default


_by_id = operator.attrgetter("id")


def _sorted_devices(devices: Iterable[Device]) -> tuple[Device, ...]:
    return tuple(sorted(devices, key=_by_id))


@frozen
class DeviceSnapshot:
    """Everything a backend knows about one resource at one moment.

    ``common_edits`` apply to any allocation of the resource (``/dev/vfio/vfio``,
    ``/dev/nvidiactl``). ``ids_env``, when set, names the env var that carries the comma-joined IDs
    of the allocated devices. ``skipped`` lists devices the backend found but will not advertise,
    with the reason (shown by ``cdiplug discover``), ``explained`` what each of the resource's
    selectors found (``groups[0].paths[1]``, ``matched /dev/snd/controlC0, ...``; shown there too).
    ``sharing``: what DRA shares among the devices (the counter sets of partitionable devices:
    :class:`~cdiplug.models.sharing.PoolSharing`); None for a pool without partitions.
    """

    resource: str
    devices: tuple[Device, ...] = field(default=(), converter=_sorted_devices)
    common_edits: ContainerEdits = ContainerEdits()
    ids_env: str | None = None
    skipped: tuple[tuple[str, str], ...] = field(default=(), converter=str_pairs, eq=False)
    explained: tuple[tuple[str, str], ...] = field(default=(), converter=str_pairs, eq=False)
    sharing: PoolSharing | None = field(default=None, converter=pool_sharing)
    _index: Mapping[str, Device] = field(init=False, repr=False, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        index = {d.id: d for d in self.devices}
        if len(index) != len(self.devices):
            dupes = sorted({d.id for d in self.devices if sum(e.id == d.id for e in self.devices) > 1})
            raise ValueError(f"resource {self.resource}: duplicate device IDs {', '.join(dupes)}")
        object.__setattr__(self, "_index", index)

    def get(self, device_id: str) -> Device | None:
        return self._index.get(device_id)

    @property
    def by_id(self) -> Mapping[str, Device]:
        """Every device by ID (the snapshot's own index: never change it)."""
        return self._index

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._index

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._index)

    def healthy_count(self) -> int:
        return sum(d.healthy for d in self.devices)

    def unhealthy_causes(self) -> dict[str, int]:
        """How many devices are Unhealthy, per cause name (``unhealthy`` when the backend named none)."""
        out: dict[str, int] = {}
        for d in self.devices:
            cause = d.cause
            if not d.healthy and cause is not None:
                out[cause.name] = out.get(cause.name, 0) + 1
        return out

    def with_devices(self, devices: Iterable[Device]) -> DeviceSnapshot:
        return attrs.evolve(self, devices=tuple(devices))


@frozen
class PreferredRequest:
    """One container's GetPreferredAllocation request, IDs as advertised."""

    available: tuple[str, ...] = field(converter=tuple[str, ...])
    must_include: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    size: int = 0


@frozen
class ContainerAllocation:
    """The answer for one container request, before it becomes a ContainerAllocateResponse."""

    device_ids: tuple[str, ...] = field(converter=tuple[str, ...])
    env: tuple[tuple[str, str], ...] = field(default=(), converter=str_pairs)
    device_specs: tuple[DeviceNode, ...] = field(default=(), converter=tuple[DeviceNode, ...])
    mounts: tuple[Mount, ...] = field(default=(), converter=tuple[Mount, ...])
    cdi_devices: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    annotations: tuple[tuple[str, str], ...] = field(default=(), converter=str_pairs)
