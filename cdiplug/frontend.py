"""Front ends: the node's plugins, one per ``api`` a resource may name, behind one protocol.

A front end serves resources to the kubelet through one API (``device-plugin``, ``dra``, or one a
test or another package registers). What makes one:

- a :class:`FrontEndType`, registered under its ``api`` name with :func:`register`: it checks the
  resources of a configuration that name it (:meth:`~FrontEndType.check` when the file is read,
  :meth:`~FrontEndType.check_node` against the node's folders at start and on every reload) and
  makes the running :class:`FrontEnd` (:meth:`~FrontEndType.create`);
- the per-resource settings it reads (a subset of :data:`SETTINGS`), given at registration so that
  the configuration can refuse a setting the resource's front end does not use without loading
  any front end (``replicas is a device-plugin setting; this resource has api: dra``);
- the files in the state folder where an earlier run leaves it work (DRA: prepared claims), so
  that the node starts it, with no resources, while one exists;
- a :class:`FrontEnd`: ``start(resources)``, ``reload(resources, recreated)``, ``stop()``.
  :class:`FrontEndBase` holds the parts every front end is made of; :func:`changes` is the reload
  diff (removed / added / changed) every front end applies.

Registered front ends are loaded on first use (``"module:attribute"``), so a daemon never imports
one that no resource names: without ``api: dra`` the Kubernetes client is never loaded. The
:class:`~cdiplug.node.Node` composes whatever is registered, in registration order; see
``docs/architecture.md`` for how to add one.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from attrs import frozen

from cdiplug.errors import CdiplugError
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.telemetry.recorder import Recorder
from cdiplug.toolkit.supervisor import Supervisor

# The host's type: the node's BackendHost (cdiplug.host sits above this module, which the
# configuration imports; the front ends name it: FrontEndBase[BackendHost]).
H = TypeVar("H")

# The per-resource settings of the configuration beyond name, backend, options and api: each
# belongs to the front ends that registered it; a resource setting one its front end does not use
# is a configuration error.
SETTINGS = ("cdi_kind", "allocate", "replicas", "dra_driver", "device_metadata", "register_when_empty")

MAX_SOCKET_PATH = 107  # bytes of sockaddr_un.sun_path, less its terminating NUL
MAX_FILE_NAME = 255  # bytes of one file name (NAME_MAX)


@frozen
class Problem:
    """Why one resource cannot be served: ``message`` about its setting ``field``.

    ``field`` is a key of the resource (``replicas``, ``options``, ``dra_driver``) or a path below
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
class FrontEndParts(Generic[H]):
    """What the node gives every front end it makes."""

    world: World
    host: H
    supervisor: Supervisor
    recorder: Recorder


class FrontEndType(Protocol):
    """What is registered for one ``api``: its configuration checks and its front end."""

    def check(self, resources: Sequence[ResourceConfig[object]]) -> Iterable[Problem]:
        """Problems of ``resources`` (all those naming this api) found when the file is read."""
        ...

    def check_node(self, resources: Sequence[ResourceConfig[object]], world: World) -> Iterable[Problem]:
        """Problems that need the node's folders (socket paths), found at start and every reload."""
        ...

    def create(self, parts: FrontEndParts[Any]) -> FrontEnd:
        """The front end, not started."""
        ...


class FrontEndBase(Generic[H]):
    """The parts every front end is made of: the node's world, host, supervisor and recorder; one
    lock so that start, reload and stop never overlap; whether it was stopped."""

    def __init__(self, parts: FrontEndParts[H]) -> None:
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
class Registration:
    """One registered api: its name, the settings its front end reads, and where it is."""

    api: str
    settings: frozenset[str]
    target: str | FrontEndType  # "module:attribute", loaded on first use, or the object itself
    state: tuple[str, ...] = ()  # files in the state folder an earlier run leaves for it to finish


_registry: dict[str, Registration] = {}
_loaded: dict[str, FrontEndType] = {}


def register(api: str, front_end: str | FrontEndType, *, settings: Iterable[str] = (), state: Iterable[str] = ()) -> None:
    """Serve resources with ``api: <api>`` through ``front_end`` (or ``"module:attribute"`` naming
    it, imported on first use); ``settings`` are the per-resource settings (of :data:`SETTINGS`)
    it reads; ``state`` the files (in the state folder) where an earlier run may leave work only
    this front end can finish: while one exists the node starts it even when no resource names it."""
    claimed = frozenset(settings)
    if not api or not isinstance(api, str):
        raise ValueError(f"an api is named by a non-empty string, got {api!r}")
    if api in _registry:
        raise ValueError(f"api {api!r} is already registered")
    if unknown := claimed - set(SETTINGS):
        raise ValueError(f"unknown settings {sorted(unknown)} (known: {', '.join(SETTINGS)})")
    if isinstance(front_end, str) and ":" not in front_end:
        raise ValueError(f"{front_end!r} is not 'module:attribute'")
    _registry[api] = Registration(api, claimed, front_end, tuple(state))


def unregister(api: str) -> None:
    """Forget ``api`` (tests registering their own); a running node keeps what it made."""
    _registry.pop(api, None)
    _loaded.pop(api, None)


def registered() -> Mapping[str, Registration]:
    """Every registered api, in registration order (the order in which the node starts them)."""
    return dict(_registry)


def owners(setting: str) -> list[str]:
    """The apis whose front ends read ``setting``."""
    return [r.api for r in _registry.values() if setting in r.settings]


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
        except (ImportError, AttributeError) as exc:
            raise CdiplugError(f"the front end of api {api!r} ({registration.target}) cannot be loaded: {exc}") from exc
    _loaded[api] = target
    return target


register(
    "device-plugin",
    "cdiplug.deviceplugin.frontend:FRONT_END",
    settings=("cdi_kind", "allocate", "replicas", "register_when_empty"),
)
# dra-claims.json: the claims a driver prepared, which the kubelet unprepares through it even
# after its resource left DRA (cdiplug.dra.checkpoint.FILE_NAME).
register("dra", "cdiplug.dra.frontend:FRONT_END", settings=("dra_driver", "device_metadata"), state=("dra-claims.json",))
