"""Front ends: the node's plugins, one per ``api`` a resource may name, behind one protocol.

A front end serves resources to the kubelet through one API (``device-plugin``, ``dra``, or one a
test or another package registers). What makes one:

- a :class:`FrontEndType`, registered under its ``api`` name with :func:`register`. It owns its
  per-resource settings (:attr:`~FrontEndType.settings`: a frozen attrs class whose fields are
  the keys a resource with this ``api`` may set beside ``name``, ``backend``, ``options`` and
  ``api``), which the configuration structures with its one converter and the type completes
  (:meth:`~FrontEndType.settle`: defaults that depend on the resource or its backend); it checks
  those resources (:meth:`~FrontEndType.check` when the file is read,
  :meth:`~FrontEndType.check_node` against the node's folders at start and on every reload); it
  says what the handover needs (:meth:`~FrontEndType.holding`: which devices of a resource its
  consumers still hold; :attr:`~FrontEndType.hold_cause`: the cause those are held with); it
  names the files in the state folder where an earlier run leaves it work
  (:attr:`~FrontEndType.state`, DRA: prepared claims), so that the node starts it, with no
  resources, while one exists; and it makes the running :class:`FrontEnd`
  (:meth:`~FrontEndType.create`). :class:`FrontEndTypeBase` gives the defaults of all but ``create``;
- a :class:`FrontEnd`: ``start(resources)``, ``reload(resources, recreated)``, ``stop()``.
  :class:`FrontEndBase` holds the parts every front end is made of; :func:`changes` is the reload
  diff (removed / added / changed) every front end applies.

A registered type is named ``"module:attribute"`` and loaded on first use; it is kept light (its
module imports only its settings), and imports its front end in ``create``, so a daemon never
loads a front end that no resource names: without ``api: dra`` the Kubernetes client is never
loaded. The :class:`~cdiplug.node.Node` composes whatever is registered, in registration order;
see ``docs/architecture.md`` for how to add one.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import attrs
from attrs import frozen

from cdiplug.backend import BackendPlugin
from cdiplug.errors import CdiplugError
from cdiplug.models.devices import DeviceSnapshot, HealthCause
from cdiplug.models.names import MAX_FILE_NAME
from cdiplug.models.resource import Api, ResourceConfig
from cdiplug.models.world import World
from cdiplug.telemetry.recorder import Recorder
from cdiplug.toolkit.supervisor import Supervisor

# The host's type: the node's BackendHost (cdiplug.host sits above this module, which the
# configuration imports; the front ends name it: FrontEndBase[BackendHost]).
H = TypeVar("H")
K = TypeVar("K")  # the Kubernetes client (cdiplug.kube, a layer above this one)

# The keys every resource has, whatever its api; the rest are its front end's settings.
CORE_KEYS = ("name", "backend", "options", "api")
# The one core setting that not every front end lets a file choose: the CDI kind of the spec the
# host writes for the resource, chosen only where a front end's consumers use that spec.
CDI_KIND = "cdi_kind"
MAX_SOCKET_PATH = 107  # bytes of sockaddr_un.sun_path, less its terminating NUL


@frozen
class ResourceProblem:
    """Why one resource cannot be served: ``message`` about its setting ``field``.

    ``field`` is a key of the resource (``options``, or one of its front end's settings) or a path below
    one (``options.count``); the configuration reports it as ``message @ $.resources[i].field
    (in FILE)``, and a setting the file left to its default as the resource's ``name``.
    """

    resource: str
    field: str
    message: str


class FrontEnd(Protocol):
    """One running front end; the node calls ``start`` once, then ``reload`` any number of times,
    then ``stop``, never two at a time. ``resources`` are those whose ``api`` names it."""

    async def start(self, resources: Sequence[ResourceConfig[object]]) -> None:
        """Serve ``resources``; a problem (a :class:`~cdiplug.errors.CdiplugError`) stops the start."""

    async def reload(self, resources: Sequence[ResourceConfig[object]], recreated: frozenset[str]) -> None:
        """Serve ``resources`` from now on (maybe none); ``recreated`` names those whose backend is
        new (the host replays its snapshot on ``attach``). A resource that cannot be served is
        logged and left off; the others still apply."""

    async def stop(self) -> None:
        """Stop serving; what running pods use (CDI specs, prepared devices) stays."""


@frozen
class FrontEndParts(Generic[H, K]):
    """What the node gives every front end it makes."""

    world: World
    host: H
    supervisor: Supervisor
    recorder: Recorder
    # The process's one Kubernetes client, made on first call (:class:`cdiplug.kube.factory.SharedClient`).
    kube: Callable[[], K]


# The latest snapshot of a resource (the host's), or None before its backend has reported.
Latest = Callable[[str], DeviceSnapshot | None]


class FrontEndType(Protocol):
    """What is registered for one ``api``: its settings, its checks, its part in the handover and its front end."""

    # The frozen attrs class of its per-resource settings; its fields are the keys a resource may
    # set. ResourceConfig.settings holds one (None when built by hand: the front end's defaults).
    settings: type[Any]
    # Its consumers use the CDI spec the host writes per resource (whose kind a file may choose:
    # ``cdi_kind``); otherwise that spec is written for ``cdiplug cdi generate`` only.
    host_specs: bool
    # It can offer devices that overlap (partitions drawing on shared counters); a backend offers
    # whole devices only to a front end that cannot (ResourceConfig.overlapping_devices).
    overlapping_devices: bool
    # The cause devices its consumers still hold are held with while a resource leaves it (the
    # front end a resource goes to serves them Unhealthy with that cause); None: it takes part in
    # no handover.
    hold_cause: HealthCause | None
    # Files in the instance's state folder where an earlier run may leave work only this front end can
    # finish: while one exists the node starts it even when no resource names it.
    state: tuple[str, ...]

    def settle(self, settings: Any, resource: str, plugin: BackendPlugin[Any]) -> Any:
        """``settings`` as read from the file, with the defaults that depend on the resource or its backend filled in."""
        ...

    def check(self, resources: Sequence[ResourceConfig[object]]) -> Iterable[ResourceProblem]:
        """Problems of ``resources`` (all those naming this api) found when the file is read."""
        ...

    def check_node(self, resources: Sequence[ResourceConfig[object]], world: World) -> Iterable[ResourceProblem]:
        """Problems that need the node's folders (socket paths), found at start and every reload."""
        ...

    async def holding(
        self, resources: Sequence[ResourceConfig[object]], world: World, latest: Latest, *, at_start: bool
    ) -> Mapping[str, frozenset[str] | None]:
        """Which devices of ``resources`` (each as this front end served it) its consumers still
        hold, by resource: None where that is not known yet (which devices a claim names, before
        the backend has reported). Raises :class:`~cdiplug.errors.CdiplugError` when it cannot
        tell (the kubelet does not answer). ``at_start``: the daemon is starting, and asks for
        each resource of another api whether an earlier run served it through this one."""
        ...

    def owned_names(self, resource: ResourceConfig[object]) -> Iterable[tuple[str, str]]:
        """What serving ``resource`` names after it on the node besides the resource itself, as
        (kind, name) that only one cdiplug instance on a node may serve (:mod:`cdiplug.host.owners`):
        the DRA driver, whose sockets and folders carry its name."""
        ...

    def consumers(self, resource: ResourceConfig[object]) -> str:
        """Who holds devices of ``resource`` through this front end, for messages: ``device-plugin pods``."""
        ...

    def holds(self, resource: ResourceConfig[object]) -> str:
        """How this front end serves the devices held for another's consumers, for messages: ``advertised Unhealthy``."""
        ...

    def create(self, parts: FrontEndParts[Any, Any]) -> FrontEnd:
        """The front end, not started."""
        ...


@frozen
class NoSettings:
    """The settings of a front end that reads none."""


class FrontEndTypeBase:
    """Defaults for a :class:`FrontEndType`: no settings, no checks, no part in the handover."""

    settings: type[Any] = NoSettings
    host_specs = False
    overlapping_devices = False
    hold_cause: HealthCause | None = None
    state: tuple[str, ...] = ()

    def settle(self, settings: Any, resource: str, plugin: BackendPlugin[Any]) -> Any:
        return settings

    def check(self, resources: Sequence[ResourceConfig[object]]) -> Iterable[ResourceProblem]:
        return ()

    def check_node(self, resources: Sequence[ResourceConfig[object]], world: World) -> Iterable[ResourceProblem]:
        return ()

    async def holding(
        self, resources: Sequence[ResourceConfig[object]], world: World, latest: Latest, *, at_start: bool
    ) -> Mapping[str, frozenset[str] | None]:
        return {r.name: frozenset() for r in resources}

    def owned_names(self, resource: ResourceConfig[object]) -> Iterable[tuple[str, str]]:
        return ()

    def consumers(self, resource: ResourceConfig[object]) -> str:
        return f"consumers of {resource.api}"

    def holds(self, resource: ResourceConfig[object]) -> str:
        return f"served Unhealthy through {resource.api}"


class FrontEndBase(Generic[H]):
    """The parts every front end is made of: the node's world, host, supervisor and recorder; one
    lock so that start, reload and stop never overlap; whether it was stopped."""

    def __init__(self, parts: FrontEndParts[H, Any]) -> None:
        self.world = parts.world
        self.host: H = parts.host
        self.supervisor = parts.supervisor
        self.recorder = parts.recorder
        self._lock = asyncio.Lock()
        self._stopped = False


# -- reload ----------------------------------------------------------------------------------------


@frozen
class Changes:
    """What a reload asks of a front end, in the order of the new configuration."""

    removed: tuple[str, ...]  # stop these: gone from the configuration, or to start afresh
    added: tuple[ResourceConfig[object], ...]  # start these: new, or started afresh
    changed: tuple[ResourceConfig[object], ...]  # update these in place: new configuration or new backend

    def gone(self, name: str) -> bool:
        """``name`` is removed and not started again (its metrics go with it)."""
        return name in self.removed and all(r.name != name for r in self.added)


def _never(old: ResourceConfig[object], new: ResourceConfig[object]) -> bool:
    return False


def changes(
    running: Mapping[str, ResourceConfig[object]],
    resources: Sequence[ResourceConfig[object]],
    recreated: frozenset[str],
    *,
    restart: Callable[[ResourceConfig[object], ResourceConfig[object]], bool] = _never,
) -> Changes:
    """The reload diff of a front end serving ``running`` (name -> configuration) that is to serve
    ``resources``; ``restart(old, new)`` says when a change cannot be made in place (a DRA driver
    renamed): that resource is removed and added. Unchanged resources with the same backend appear
    nowhere: they are not touched."""
    wanted = {r.name: r for r in resources}
    removed = [n for n, old in running.items() if n not in wanted or restart(old, wanted[n])]
    added = [r for r in resources if r.name not in running or r.name in removed]
    changed = [
        r for r in resources if r.name in running and r.name not in removed and (r.name in recreated or running[r.name] != r)
    ]
    return Changes(tuple(removed), tuple(added), tuple(changed))


# -- paths -----------------------------------------------------------------------------------------


def socket_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a unix socket (too long an address, too long a name), or None."""
    size = len(str(path).encode())
    if size > MAX_SOCKET_PATH:
        return f"socket path {str(path)[:120]!r} is {size} bytes; a unix socket path is at most {MAX_SOCKET_PATH}"
    if len(path.name.encode()) > MAX_FILE_NAME:
        return f"socket file name is longer than {MAX_FILE_NAME} bytes"
    return None


# -- the registry ----------------------------------------------------------------------------------


@frozen
class FrontEndRegistration:
    """One registered api: its name and its type (or where it is)."""

    api: str
    target: str | FrontEndType  # "module:attribute", loaded on first use, or the object itself


_registry: dict[str, FrontEndRegistration] = {}
_loaded: dict[str, FrontEndType] = {}


def register(api: str, front_end: str | FrontEndType) -> None:
    """Serve resources with ``api: <api>`` through ``front_end`` (or ``"module:attribute"`` naming
    it, imported on first use)."""
    if not api or not isinstance(api, str):
        raise ValueError(f"an api is named by a non-empty string, got {api!r}")
    api = str(api)  # an Api member as its name
    if api in _registry:
        raise ValueError(f"api {api!r} is already registered")
    if isinstance(front_end, str) and ":" not in front_end:
        raise ValueError(f"{front_end!r} is not 'module:attribute'")
    if not isinstance(front_end, str):
        _check_settings(api, front_end.settings)
    _registry[api] = FrontEndRegistration(api, front_end)


def _check_settings(api: str, settings: type[Any]) -> None:
    if not attrs.has(settings):
        raise ValueError(f"the settings of api {api!r} are not an attrs class: {settings!r}")
    if clash := {a.name for a in attrs.fields(settings)} & {*CORE_KEYS, CDI_KIND}:
        raise ValueError(f"the settings of api {api!r} name keys every resource has: {sorted(clash)}")


def unregister(api: str) -> None:
    """Forget ``api`` (tests registering their own); a running node keeps what it made."""
    _registry.pop(api, None)
    _loaded.pop(api, None)


def registered() -> Mapping[str, FrontEndRegistration]:
    """Every registered api, in registration order (the order in which the node starts them)."""
    return dict(_registry)


def setting_names(api: str) -> list[str]:
    """The keys a resource of ``api`` may set beside the core ones, ``cdi_kind`` first where it may."""
    kind = front_end_type(api)
    return ([CDI_KIND] if kind.host_specs else []) + [a.name for a in attrs.fields(kind.settings)]


def owners(setting: str) -> list[str]:
    """The apis whose resources may set ``setting`` (loads every registered type)."""
    return [api for api in _registry if setting in setting_names(api)]


def front_end_type(api: str) -> FrontEndType:
    """The front end registered for ``api``, imported now if it was registered by name."""
    loaded = _loaded.get(api)
    if loaded is not None:
        return loaded
    registration = _registry.get(api)
    if registration is None:
        raise CdiplugError(f"no front end is registered for api {api!r} (registered: {', '.join(_registry) or 'none'})")
    target = registration.target
    if isinstance(target, str):
        module, _, attribute = target.partition(":")
        try:
            target = getattr(importlib.import_module(module), attribute)
            _check_settings(api, target.settings)
        except (ImportError, AttributeError, ValueError) as exc:
            raise CdiplugError(f"the front end of api {api!r} ({registration.target}) cannot be loaded: {exc}") from exc
    _loaded[api] = target
    return target


register(Api.DEVICE_PLUGIN, "cdiplug.deviceplugin.settings:FRONT_END")
register(Api.DRA, "cdiplug.dra.settings:FRONT_END")
