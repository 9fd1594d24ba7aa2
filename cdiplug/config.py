"""Configuration: the YAML file of DESIGN.md, structured by one cattrs converter.

Unknown keys are errors, scalars are not coerced (``count: "2"`` is an error, not 2), and every
error names the field path and the file: ``expected int @ $.resources[1].options.count (in
/etc/cdiplug/config.yaml)``. Values that pass these checks but would break later are refused
here too: CDI spec file names over 255 bytes, more advertised devices (``count × replicas``) than
fit in one ListAndWatch message the kubelet accepts (4 MiB), and, in :func:`check_against`, which
needs the node's folders, socket paths longer than a unix socket address takes (107 bytes). Each backend's ``options`` are structured into the attrs class its
plugin declares, with the same converter, so backends get the same strictness and messages.
"""

from __future__ import annotations

import collections.abc
import copy
import enum
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
import cattrs.cols
import cattrs.gen
from attrs import field, frozen

from .backend import BackendPlugin, load_plugins
from .errors import BackendError, BackendNotFound, ConfigError, InputError
from .files import CONFIG_LIMIT, read_text
from .model import DEFAULT_ALLOCATE, AllocatePart
from .names import extended_resource_problem, is_dns_subdomain, kind_problem, spec_file_name
from .resource import Api, ResourceConfig, default_dra_driver
from .safeload import load_yaml
from .world import World

O = TypeVar("O")  # noqa: E741 - a backend's options type

converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _strict(kind: type | tuple[type, ...], label: str) -> Any:
    def hook(value: Any, _type: Any) -> Any:
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise ValueError(f"expected {label}, got a boolean")
        if not isinstance(value, kind):
            raise ValueError(f"expected {label}, got {_describe(value)}")
        return value

    return hook


def _is_list_type(t: Any) -> bool:
    origin = typing.get_origin(t)
    if origin is tuple:
        args = typing.get_args(t)
        return len(args) == 2 and args[1] is Ellipsis
    return origin in (list, collections.abc.Sequence)


def _list_hook(t: Any) -> Any:
    """Lists only: cattrs alone would take a string as a list of characters, a mapping as its keys."""
    if typing.get_origin(t) is tuple:
        inner = cattrs.cols.homogenous_tuple_structure_factory(t, converter)
    else:
        inner = cattrs.cols.list_structure_factory(t, converter)

    def hook(value: Any, type_: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, got {_describe(value)}")
        return inner(value, type_)

    return hook


def _attrs_hook(cl: type[object]) -> Any:
    """Mappings only, so that ``resources: [5]`` says so instead of cattrs' internal wording."""
    inner = cattrs.gen.make_dict_structure_fn(cl, converter)

    def hook(value: Any, type_: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a mapping, got {_describe(value)}")
        return inner(value, type_)

    return hook


converter.register_structure_hook_factory(_is_list_type, _list_hook)
converter.register_structure_hook_factory(attrs.has, _attrs_hook)


converter.register_structure_hook(int, _strict(int, "an integer"))
converter.register_structure_hook(str, _strict(str, "a string"))
converter.register_structure_hook(bool, _strict(bool, "true or false"))
converter.register_structure_hook(float, lambda v, t: float(_strict((int, float), "a number")(v, t)))
converter.register_structure_hook(Path, lambda v, t: Path(_strict(str, "a path")(v, t)))


def register_enum(cls: type[enum.Enum]) -> None:
    """Structure ``cls`` from its values only, naming them in the error (str enums need this:
    the strict ``str`` hook would otherwise take them)."""

    def hook(value: Any, _type: Any) -> enum.Enum:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"expected one of {allowed}, got {value!r}") from None

    converter.register_structure_hook(cls, hook)


register_enum(AllocatePart)
register_enum(Api)


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        unknown = ", ".join(repr(k) for k in sorted(exc.extra_fields))
        # A field named after a Python keyword (class_) is spelled without the underscore in
        # the file (options classes rename it so); say it as users write it.
        allowed = ", ".join((a.alias or a.name).rstrip("_") for a in attrs.fields(exc.cl)) if attrs.has(exc.cl) else ""
        return f"unknown key{'s' if len(exc.extra_fields) > 1 else ''} {unknown}" + (f" (allowed: {allowed})" if allowed else "")
    if isinstance(exc, ValueError) and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return cattrs.v.format_exception(exc, type_)


@frozen
class _RawResource:
    name: str
    backend: str
    options: dict[str, Any] = attrs.Factory(dict)
    cdi_kind: str | None = None
    allocate: tuple[AllocatePart, ...] | None = None
    replicas: int = 1
    api: Api = Api.DEVICE_PLUGIN
    dra_driver: str | None = None


@frozen
class _RawConfig:
    resources: tuple[_RawResource, ...]


@frozen
class Config:
    resources: tuple[ResourceConfig[object], ...]
    source: str = field(default="<built-in default>", eq=False)

    def by_name(self) -> Mapping[str, ResourceConfig[object]]:
        return {r.name: r for r in self.resources}


DEFAULT_CONFIG_YAML = """\
# The built-in default: two fake FPGAs, no hardware needed.
resources:
  - name: example.com/fpga
    backend: fake
    options: {count: 2}
"""

# The same, already loaded: `cdiplug serve` without --config does not import yaml at all
# (test_config checks the two stay equal).
DEFAULT_CONFIG: Mapping[str, Any] = {"resources": [{"name": "example.com/fpga", "backend": "fake", "options": {"count": 2}}]}


def _errors(exc: Exception, path: str, source: str) -> ConfigError:
    """The first problem cattrs found, as a ConfigError; the others are appended to the message."""
    first, *rest = cattrs.transform_error(exc, path=path, format_exception=_format_exception)
    message, _, where = first.rpartition(" @ ")
    err = ConfigError(message or first, where or path, source)
    if rest:
        err.args = ("; ".join([str(err), *rest]),)
    return err


def structure_options(options_type: type[O], raw: Mapping[str, Any], path: str, source: str) -> O:
    """Structure a backend's options mapping; errors carry ``path`` (``$.resources[1].options``).

    After structuring, an options class may check values across fields: a ``problems()`` method
    yields ``(field, message)`` pairs, reported as ``message @ path.field``.
    """
    try:
        options = converter.structure(dict(raw), options_type)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise _errors(exc, path, source) from exc
    for name, problem in getattr(options, "problems", lambda: ())():
        raise ConfigError(problem, f"{path}.{name}", source)
    return options


def parse_config(data: Any, source: str = "<config>", plugins: Mapping[str, BackendPlugin[Any]] | None = None) -> Config:
    """Turn already-loaded YAML data into a checked :class:`Config`."""
    if not isinstance(data, Mapping):
        raise ConfigError("the configuration must be a mapping with a 'resources' list", "$", source)
    try:
        raw = converter.structure(data, _RawConfig)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise _errors(exc, "$", source) from exc
    if not raw.resources:
        raise ConfigError("at least one resource is needed", "$.resources", source)
    plugins = load_plugins() if plugins is None else plugins

    resources: list[ResourceConfig[object]] = []
    seen_names: dict[str, int] = {}
    seen_kinds: dict[str, int] = {}
    seen_drivers: dict[str, int] = {}
    for i, r in enumerate(raw.resources):
        at = f"$.resources[{i}]"
        problem = extended_resource_problem(r.name)
        if problem:
            raise ConfigError(problem, f"{at}.name", source)
        if r.name in seen_names:
            raise ConfigError(
                f"resource {r.name!r} is already defined at $.resources[{seen_names[r.name]}]", f"{at}.name", source
            )
        seen_names[r.name] = i
        if r.replicas < 1:
            raise ConfigError(f"replicas must be at least 1, got {r.replicas}", f"{at}.replicas", source)
        if r.replicas > MAX_REPLICAS:
            raise ConfigError(f"replicas must be at most {MAX_REPLICAS:,}, got {r.replicas:,}", f"{at}.replicas", source)
        if r.allocate is not None and not r.allocate:
            raise ConfigError("allocate must name at least one part", f"{at}.allocate", source)
        if r.backend not in plugins:
            known = ", ".join(sorted(plugins)) or "none installed"
            raise BackendNotFound(f"unknown backend {r.backend!r} (known: {known})", f"{at}.backend", source)
        try:
            plugin = plugins[r.backend]
        except BackendError as exc:  # installed, but its package cannot be imported
            raise BackendNotFound(str(exc), f"{at}.backend", source) from exc
        kind = r.cdi_kind or plugin.cdi_kind_for(r.name)
        problem = kind_problem(kind)
        if not problem and spec_file_name(kind).startswith("cdiplug-claim-"):
            # That file name is the DRA front end's per-claim spec, which it removes at will.
            problem = f"CDI kind {kind!r} would be written to {spec_file_name(kind)}, a name kept for DRA's per-claim specs"
        if problem:
            raise ConfigError(problem, f"{at}.cdi_kind" if r.cdi_kind else f"{at}.name", source)
        if len(spec_file_name(kind).encode()) > MAX_FILE_NAME:
            raise ConfigError(
                f"the CDI spec file name for kind {kind[:80]!r} would be longer than {MAX_FILE_NAME} bytes",
                f"{at}.cdi_kind" if r.cdi_kind else f"{at}.name",
                source,
            )
        if kind in seen_kinds:
            raise ConfigError(f"CDI kind {kind!r} is already used by $.resources[{seen_kinds[kind]}]", f"{at}.cdi_kind", source)
        seen_kinds[kind] = i
        driver = ""
        if r.dra_driver is not None and r.api is not Api.DRA:
            raise ConfigError("dra_driver applies only with api: dra", f"{at}.dra_driver", source)
        if r.api is Api.DRA:
            driver = r.dra_driver or plugin.dra_driver_for(r.name)
            problem = dra_driver_problem(driver)
            if problem:
                raise ConfigError(problem, f"{at}.dra_driver" if r.dra_driver else f"{at}.name", source)
            if driver in seen_drivers:
                raise ConfigError(
                    f"DRA driver {driver!r} is already used by $.resources[{seen_drivers[driver]}]", f"{at}.dra_driver", source
                )
            seen_drivers[driver] = i
        options = structure_options(plugin.options_type, r.options, f"{at}.options", source)
        problem = list_and_watch_problem(r.name, options, r.replicas)
        if problem:
            raise ConfigError(problem, f"{at}.replicas" if r.replicas > 1 else f"{at}.options", source)
        resources.append(
            ResourceConfig(
                name=r.name,
                backend=r.backend,
                options=options,
                cdi_kind=kind,
                allocate=frozenset(r.allocate) if r.allocate is not None else DEFAULT_ALLOCATE,
                replicas=r.replicas,
                api=r.api,
                dra_driver=driver or default_dra_driver(r.name),
            )
        )
    return Config(resources=tuple(resources), source=source)


def load_config(path: Path | str | None = None, plugins: Mapping[str, BackendPlugin[Any]] | None = None) -> Config:
    """Read and check the config file, or the built-in default when ``path`` is None.

    The file is read bounded (a regular file of at most :data:`~cdiplug.files.CONFIG_LIMIT`
    bytes) and parsed with the bounds of ``cdiplug.safeload``; every problem is a ConfigError.
    """
    if path is None:
        return parse_config(copy.deepcopy(DEFAULT_CONFIG), "<built-in default>", plugins)
    source = str(path)
    try:
        text = read_text(path, CONFIG_LIMIT, "configuration")
        data = load_yaml(text or "", source)
    except ConfigError:
        raise
    except InputError as exc:
        raise ConfigError(exc.message, exc.path, exc.source) from exc
    return parse_config(data, source, plugins)


# -- limits of the kubelet and the kernel ---------------------------------------------------------

MAX_SOCKET_PATH = 107  # bytes of sockaddr_un.sun_path, less its terminating NUL
MAX_FILE_NAME = 255  # bytes of one file name (NAME_MAX)
KUBELET_MAX_MESSAGE = 4 << 20  # the kubelet's gRPC receive limit, ListAndWatch included
LIST_AND_WATCH_BUDGET = KUBELET_MAX_MESSAGE * 9 // 10  # a margin for what the estimate leaves out
MAX_REPLICAS = 65536
# The temporary name a ResourceServer binds before renaming it: ".cdiplug-<pid>-<n>.sock".
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

    An options class that knows its device count says so through ``device_estimate(resource)``
    (``(devices, longest ID in bytes)``); otherwise one device with a short ID is assumed, so
    ``replicas`` alone is still checked.
    """
    estimate = getattr(options, "device_estimate", None)
    devices, id_length = estimate(resource) if estimate is not None else (1, 1)
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


def check_against(config: Config, world: World) -> None:
    """Checks that need the node's folders: every socket path fits a unix socket address.

    Run by the daemon at start (a ConfigError: exit 2) and on every reload (refused, the old
    configuration kept). Reported as ``message @ $.resources[i].name (in FILE)``.
    """
    for i, r in enumerate(config.resources):
        at = f"$.resources[{i}]"
        if r.api is Api.DRA:
            paths = [
                (world.plugins_registry_dir / f"{r.dra_driver}-reg.sock", f"{at}.dra_driver"),
                (world.plugins_dir / r.dra_driver / "dra.sock", f"{at}.dra_driver"),
            ]
        else:
            socket = world.kubelet_dir / r.socket_name
            paths = [(socket, f"{at}.name")]
            temp = len(str(world.kubelet_dir).encode()) + 1 + _TEMP_SOCKET_NAME
            if temp > MAX_SOCKET_PATH:
                raise ConfigError(
                    f"the kubelet folder {str(world.kubelet_dir)[:120]!r} is too long for unix sockets in it "
                    f"({temp} bytes with cdiplug's temporary socket name; at most {MAX_SOCKET_PATH})",
                    f"{at}.name",
                    config.source,
                )
        for path, where in paths:
            size = len(str(path).encode())
            if size > MAX_SOCKET_PATH:
                raise ConfigError(
                    f"socket path {str(path)[:120]!r} is {size} bytes; a unix socket path is at most {MAX_SOCKET_PATH}",
                    where,
                    config.source,
                )
            if len(path.name.encode()) > MAX_FILE_NAME:
                raise ConfigError(f"socket file name is longer than {MAX_FILE_NAME} bytes", where, config.source)


def dra_driver_problem(driver: str) -> str | None:
    """Why ``driver`` cannot name a DRA driver (a DNS subdomain of at most 63 characters), or None."""
    if len(driver) > 63 or not is_dns_subdomain(driver):
        return f"DRA driver name {driver[:80]!r} must be a DNS subdomain (lower case, digits, '-', '.') of at most 63 characters"
    return None
