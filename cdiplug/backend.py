"""What a backend is: a small discovery protocol, optional abilities, and how backends are found.

A backend is created once for all the resources that name it (so "first resource that selects a
device wins" can be decided in one place). It publishes whole :class:`DeviceSnapshot` objects, one
per resource, to a :class:`SnapshotSink`: once at start, then again whenever anything changes. The
core diffs them; a backend never talks gRPC.

Optional abilities are separate protocols that a backend class subclasses (so ``mypy --strict``
compares its methods with them), looked up once per backend by :func:`abilities_of`. Its options
class may likewise subclass :class:`CheckedOptions` and :class:`SizedOptions`. Backends are found
through the ``cdiplug.backends`` entry point group, whose objects are :class:`BackendPlugin`
values. Backends import all of this from :mod:`cdiplug.sdk`; this module never imports them.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from attrs import frozen

from cdiplug.errors import BackendError, BackendInitError
from cdiplug.models.devices import Device, DeviceSnapshot, PreferredRequest
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World

O = TypeVar("O")  # noqa: E741 - a backend's options type
C = TypeVar("C")  # a backend's per-claim configuration type

ENTRY_POINT_GROUP = "cdiplug.backends"


class SnapshotSink(Protocol):
    """Where a backend sends its snapshots. Safe to call from the event loop only."""

    def publish(self, snapshot: DeviceSnapshot) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """Discovery and watching.

    ``run`` publishes a snapshot for every one of its resources promptly (an empty one when nothing
    is found), then a new one for a resource whenever its devices, health or topology change, and
    runs until cancelled. Blocking calls (sysfs, NVML) go through ``asyncio.to_thread``. It raises
    :class:`~cdiplug.errors.BackendError` only when it cannot go on at all.
    """

    async def run(self, sink: SnapshotSink) -> None: ...


@runtime_checkable
class Preparer(Protocol):
    """Makes devices ready for a container (bind to vfio-pci). Idempotent: ready devices are a no-op.

    The host calls it one preparation group at a time, never twice at once for one group. It
    returns the devices as they are once prepared, in the order given (a freshly bound function
    gains its ``/dev/vfio/devices/vfioN``): answers and CDI specs are built from them. It raises
    PreparationError (or DeviceInUse).
    """

    async def prepare(self, resource: str, devices: Sequence[Device]) -> Sequence[Device]: ...


@runtime_checkable
class Unpreparer(Protocol):
    """Undoes a preparation once no pod holds the device (PCI: give it back to its original driver).

    Front ends call it through the host when they know a device is free: the DRA front end from
    NodeUnprepareResources, the device-plugin front end when its :class:`ReleasePoller` says so.
    Idempotent: a device not prepared (or already given back) is a no-op. Raises PreparationError.
    """

    async def unprepare(self, resource: str, device_ids: Sequence[str]) -> None: ...


@runtime_checkable
class ReleasePoller(Protocol):
    """What the device-plugin front end asks to find devices to unprepare (that API never says).

    The front end asks every ``release_interval`` seconds (None: this resource never undoes
    anything); ``releasable`` names the devices this backend prepared and would undo now (past any
    grace period), also those an earlier run of the daemon prepared. Those no pod holds (the
    kubelet's PodResources API) are then unprepared through the host. A DRA-only backend needs
    only :class:`Unpreparer`: DRA says when a claim is done.
    """

    def release_interval(self, resource: str) -> float | None: ...

    async def releasable(self, resource: str) -> Sequence[str]: ...


@runtime_checkable
class PreferredAllocator(Protocol):
    """A backend's own choice for GetPreferredAllocation; None falls back to the core policy."""

    def preferred_allocation(
        self, resource: str, snapshot: DeviceSnapshot, request: PreferredRequest
    ) -> Sequence[str] | None: ...


@runtime_checkable
class PairwiseAffinity(Protocol):
    """How well two devices work together (NVLink, PCIe distance); higher is better, 0 is neutral.

    The core preferred-allocation policy adds it up over every pair in a candidate set.
    """

    def affinity(self, resource: str, a: Device, b: Device) -> float: ...


@runtime_checkable
class ModelLabels(Protocol):
    """What identifies the model of a resource's devices, for node labels (``cdiplug.dev/...``).

    ``model_labels`` maps label names (``product``, ``memory``) to values: an ``int`` (at least 0)
    for what node affinity compares with ``Gt``/``Lt``, a ``str`` otherwise (cdiplug makes it a
    valid label value). A backend without it gets the attributes every device shares.
    """

    def model_labels(self, resource: str, snapshot: DeviceSnapshot) -> Mapping[str, str | int]: ...


@runtime_checkable
class CheckedOptions(Protocol):
    """An options class that checks its values across fields once structured.

    ``problems`` yields ``(field, message)`` pairs, ``field`` relative to the options (``count``,
    ``selectors[0].model``); the config loader reports the first as ``message @
    $.resources[i].options.field``. Structuring itself (types, unknown keys) is the converter's.
    """

    __slots__ = ()

    def problems(self) -> Iterable[tuple[str, str]]: ...


@runtime_checkable
class SizedOptions(Protocol):
    """An options class that knows, before discovery, about how many devices it makes.

    ``device_estimate(resource)`` is ``(devices, longest device ID in bytes)``; the config loader
    refuses a resource whose ListAndWatch message could not fit (else one device with a short ID
    is assumed).
    """

    __slots__ = ()

    def device_estimate(self, resource: str) -> tuple[int, int]: ...


@frozen
class Configured:
    """What a claim's configuration makes of one of its devices (:class:`ClaimConfigurable`).

    ``device`` is the device as the claim's CDI spec gives it (its edits shaped: an env overlay,
    device nodes left out). ``prepare``: whether the host prepares it (False: no VFIO bind) and,
    so, whether the claim's unprepare releases it. ``release``: whether the claim's unprepare
    undoes the preparation (False: PCI ``release: keep`` for this claim; the device stays
    prepared). ``common_edits``: whether the device needs the resource's common edits (PCI's
    ``/dev/vfio/vfio``); a claim gets them when one of its devices does.
    """

    device: Device
    prepare: bool = True
    release: bool = True
    common_edits: bool = True


@runtime_checkable
class ClaimConfigurable(Protocol[C]):
    """Typed, opaque per-claim configuration of a DRA claim (``spec.devices.config[].opaque``).

    ``claim_config_type(resource)`` is a frozen attrs class of parameters (every field with a
    default) that the DRA front end structures each entry's ``parameters`` into with the one
    converter, unknown keys forbidden; it may subclass :class:`CheckedOptions` for checks across
    fields. ``claim_config_kind(resource)`` is the ``kind`` the parameters must name beside
    ``apiVersion: cdiplug.dev/v1alpha1`` (as the reference drivers' ``GpuConfig``).
    ``configure`` shapes one device of a claim with the merged parameters; it is pure and fast
    (no I/O: it runs on every prepare) and raises :class:`~cdiplug.errors.InvalidRequest` when
    the configuration cannot apply to that device. ``admin_access`` (a default is given) shapes
    a device of an admin-access claim. A backend without this ability refuses every configuration
    entry naming its driver.
    """

    def claim_config_type(self, resource: str) -> type[C]: ...

    def claim_config_kind(self, resource: str) -> str: ...

    def configure(self, resource: str, device: Device, config: C) -> Configured: ...

    def admin_access(self, resource: str, device: Device) -> Configured:
        """An ``adminAccess`` (monitoring) device as its claim's spec gives it, after ``configure``.
        The core never prepares nor releases it whatever this says, and adds
        ``CDIPLUG_ADMIN_ACCESS=true``. By default the device as it is; a backend whose edits hand
        over exclusive control (PCI's VFIO group node) leaves them out."""
        return Configured(device, prepare=False, release=False)


async def run_tasks(owner: str, coros: Mapping[str, Coroutine[Any, Any, None]]) -> None:
    """Run a backend's own long-lived tasks (name -> coroutine) until one fails, and raise that
    failure: a :class:`~cdiplug.errors.BackendError` as it is, anything else as one naming
    ``owner`` and the task. Every task is cancelled and awaited on the way out (cancellation too)."""
    tasks = [asyncio.create_task(coro, name=name) for name, coro in coros.items()]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            failure = task.exception()
            if isinstance(failure, BackendError):
                raise failure
            if failure is not None:
                raise BackendError(f"{owner} task {task.get_name()} failed: {type(failure).__name__}: {failure}") from failure
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@frozen
class Abilities:
    """The optional abilities of one backend, found once when it is created."""

    preparer: Preparer | None = None
    unpreparer: Unpreparer | None = None
    release_poller: ReleasePoller | None = None
    preferred: PreferredAllocator | None = None
    affinity: PairwiseAffinity | None = None
    configurable: ClaimConfigurable[Any] | None = None
    model_labels: ModelLabels | None = None


def abilities_of(backend: Backend) -> Abilities:
    return Abilities(
        preparer=backend if isinstance(backend, Preparer) else None,
        unpreparer=backend if isinstance(backend, Unpreparer) else None,
        release_poller=backend if isinstance(backend, ReleasePoller) else None,
        preferred=backend if isinstance(backend, PreferredAllocator) else None,
        affinity=backend if isinstance(backend, PairwiseAffinity) else None,
        configurable=backend if isinstance(backend, ClaimConfigurable) else None,
        model_labels=backend if isinstance(backend, ModelLabels) else None,
    )


@frozen
class BackendPlugin(Generic[O]):
    """What a backend package exports under the ``cdiplug.backends`` entry point group.

    ``options_type`` is an attrs class the core structures each resource's ``options`` into (with
    the one converter of ``cdiplug.config``, unknown keys forbidden). ``create`` builds one backend
    for all the resources that name this plugin. ``default_cdi_kind``, when given, maps a resource
    name to the CDI kind used when the resource sets no ``cdi_kind`` (a backend whose vendor tools
    already write specs under the resource's name needs another kind); else the kind is the name.
    ``default_dra_driver`` likewise for the DRA front end's ``dra_driver`` (else
    ``<class>.<vendor>``); it must never give another vendor's driver name. ``clean_up``, when
    given, undoes at uninstall (``cdiplug cleanup``, once the instance's daemon has stopped) what
    the backend left on the node beyond the CDI folder (PCI: functions bound to vfio-pci go back to
    their original drivers), in the instance's world; it returns one line per thing undone and
    raises BackendError naming what it could not undo.

    Handles a backend needs beyond the :class:`World` (NVML, a udev monitor) are the plugin's
    business: a package exports a ready ``plugin`` and a function that makes one with fakes.
    """

    name: str
    options_type: type[O]
    create: Callable[[Sequence[ResourceConfig[O]], World], Backend]
    default_cdi_kind: Callable[[str], str] | None = None
    default_dra_driver: Callable[[str], str] | None = None
    clean_up: Callable[[World], Awaitable[Sequence[str]]] | None = None

    def cdi_kind_for(self, resource: str) -> str:
        return self.default_cdi_kind(resource) if self.default_cdi_kind else resource


# Plugins of different options types sit side by side here, so their options type is erased
# (Any): the core never looks at options, it only hands each plugin the ResourceConfigs whose
# options that plugin's own ``options_type`` structured.
class PluginRegistry(Mapping[str, BackendPlugin[Any]]):
    """Installed backend plugins by name, each imported only when first asked for.

    So a node without NVML never imports the NVIDIA backend unless a resource names it. A broken
    plugin fails loudly, naming its entry point (:class:`BackendInitError`; the config loader
    reports it at the resource's ``backend`` field).
    """

    def __init__(self, plugins: Mapping[str, BackendPlugin[Any]] | None = None) -> None:
        self._loaded: dict[str, BackendPlugin[Any]] = dict(plugins or {})
        self._entry_points = {} if plugins is not None else {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}

    def __getitem__(self, name: str) -> BackendPlugin[Any]:
        if name not in self._loaded:
            ep = self._entry_points[name]
            try:
                plugin = ep.load()
            except Exception as exc:  # a missing dependency, a syntax error: name the entry point
                raise BackendInitError(
                    f"backend {name!r} cannot be loaded from entry point {ep.value}: {type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(plugin, BackendPlugin):
                raise BackendInitError(f"entry point {ep.name} = {ep.value} is not a cdiplug.sdk.BackendPlugin")
            self._loaded[name] = plugin
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted({*self._loaded, *self._entry_points}))

    def __len__(self) -> int:
        return len({*self._loaded, *self._entry_points})

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._entry_points


class EntryPoint(Protocol):
    """What the registry needs of an entry point (``importlib.metadata.EntryPoint`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def value(self) -> str: ...

    def load(self) -> Any: ...


class _EntryPoint:
    """``name = module:attr`` of an entry_points.txt (a plain class: an attrs one costs start-up time)."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: str) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r})"

    def load(self) -> Any:
        module, _, attr = self.value.partition(":")
        obj: Any = importlib.import_module(module.strip())
        for part in attr.strip().split(".") if attr.strip() else ():
            obj = getattr(obj, part)
        return obj


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group``, as ``importlib.metadata.entry_points(group=...)`` finds them.

    Read straight from the ``entry_points.txt`` of each ``*.dist-info``/``*.egg-info`` folder on
    ``sys.path`` (the first distribution of a name wins). Kept, measured: importing
    ``importlib.metadata`` (email, zipfile, csv and 40 more modules) and its scan cost the daemon
    1.7 MiB of idle RSS (bench_daemon, three paired runs, 45.9 -> 47.6 MiB; the floor 39.1) and
    about 50 ms of start. A zip file on ``sys.path`` is left to ``importlib.metadata``.
    """
    found: list[EntryPoint] = []
    dists: set[str] = set()
    for entry in sys.path:
        folder = entry or "."
        if os.path.isfile(folder):
            from importlib.metadata import entry_points as metadata_entry_points

            return list(metadata_entry_points(group=group))
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            dist = name.rpartition(".")[0].partition("-")[0].lower().replace("-", "_").replace(".", "_")
            if dist in dists:
                continue
            dists.add(dist)
            try:
                with open(os.path.join(folder, name, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                continue
            for ep_name, value in _section(text, group):
                found.append(_EntryPoint(ep_name, value))
    return found


def _section(text: str, group: str) -> Iterator[tuple[str, str]]:
    """``name = value`` pairs of one ``[group]`` of an entry_points.txt (INI; extras dropped)."""
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == group and "=" in line:
            name, _, value = line.partition("=")
            yield name.strip(), value.partition("[")[0].strip()


def load_plugins() -> PluginRegistry:
    """Every installed backend plugin, found through the ``cdiplug.backends`` entry point group."""
    return PluginRegistry()
