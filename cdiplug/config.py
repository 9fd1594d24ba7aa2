"""Configuration: the YAML file of ``docs/architecture.md``, structured by the one strict converter (:mod:`cdiplug.toolkit.strict`).

Unknown keys are errors, scalars are not coerced (``count: "2"`` is an error, not 2), and every
error names the field path and the file: ``expected int @ $.resources[1].options.count (in
/etc/cdiplug/config.yaml)``. Values that pass these checks but would break later are refused
here too: CDI spec file names over 255 bytes here; what only one front end cares about (the
device plugin's ListAndWatch size, the DRA driver name) by that front end's ``check``, and, in
:func:`check_against`, which needs the node's folders, by its ``check_node`` (socket paths).
``api`` names any registered front end (:mod:`cdiplug.frontend`); a resource's keys beside
``name``, ``backend``, ``options``, ``api`` (and ``cdi_kind``, where its front end uses the host's
spec) are that front end's settings, structured into the attrs class it registered and completed
by it; a setting of another front end than the resource's (``replicas`` under ``api: dra``) is an
error naming both. Each backend's ``options`` are structured into the attrs class its plugin
declares, with the same converter, so backends and front ends get the same strictness and messages.

Top level: ``resources`` (one configuration for every node) and ``node_labels`` (device labels
on the node, :mod:`cdiplug.kube.node_labels`; off unless true), or ``configurations``, a
mapping of names to ``{resources, node_labels}`` (``node_labels`` at the top level is then their
default): a node gets the one its label ``cdiplug.dev/config`` names, ``default`` without it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NewType, TypeVar

import attrs
import cattrs
import cattrs.cols
import cattrs.gen
from attrs import field, frozen

from cdiplug.backend import BackendPlugin, CheckedOptions, load_plugins
from cdiplug.errors import BackendError, BackendNotFound, ConfigError, InputError
from cdiplug.frontend import CDI_KIND, CORE_KEYS, ResourceProblem, front_end_type, owners, registered, setting_names
from cdiplug.models.names import extended_resource_problem, is_label_value, spec_file_problem
from cdiplug.models.resource import Api, ResourceConfig
from cdiplug.models.world import World
from cdiplug.toolkit.files import CONFIG_LIMIT, read_text
from cdiplug.toolkit.safeload import load_yaml
from cdiplug.toolkit.strict import config_error, converter, describe

CONFIG_LABEL = "cdiplug.dev/config"  # the node label choosing a named configuration

O = TypeVar("O")  # noqa: E741 - a backend's options type


def kubernetes_object_problem(data: Mapping[str, Any]) -> str | None:
    """Why ``data`` is a Kubernetes object rather than a configuration (a ConfigMap passed as the file)."""
    kind = data.get("kind")
    if not isinstance(kind, str) or "apiVersion" not in data:
        return None
    if kind == "ConfigMap":
        held = data.get("data")
        names = ", ".join(repr(k) for k in held) if isinstance(held, Mapping) and held else "none"
        return (
            "this is a Kubernetes ConfigMap, not a cdiplug configuration: pass the file it holds, its data's "
            f"'config.yaml' (it holds: {names}), as in kubectl get configmap NAME -o jsonpath='{{.data.config\\.yaml}}'"
        )
    return f"this is a Kubernetes {kind}, not a cdiplug configuration (a mapping with a 'resources' list)"


# The api key: the name of any front end registered when the file is read.
ApiName = NewType("ApiName", str)


def _api_hook(value: Any, _type: Any) -> str:
    names = registered()
    if not isinstance(value, str) or value not in names:
        allowed = ", ".join(repr(n) for n in names)
        raise ValueError(f"expected one of {allowed}, got {describe(value) if not isinstance(value, str) else repr(value)}")
    try:
        return Api(value)  # the built-in ones as members: `r.api is Api.DRA` keeps working
    except ValueError:
        return value


converter.register_structure_hook(ApiName, _api_hook)


@frozen
class _RawResource:
    # The extended resource name (vendor/class, as the kubelet validates it); one entry per name.
    name: str = field(metadata={"example": "example.com/fpga"})
    # The backend that finds the devices: fake, pci, nvidia, or any other installed one.
    backend: str = field(metadata={"example": "fake"})
    # The backend's own options (its section below); unknown keys are errors.
    options: dict[str, Any] = field(factory=dict, metadata={"example": {"count": 4}})
    api: ApiName = field(
        default=ApiName(Api.DEVICE_PLUGIN),
        metadata={"doc": "The front end serving the resource; its settings are more keys.", "example": "dra"},
    )
    # The CDI kind of the spec the host writes for the resource (default: the name, or the
    # backend's choice); set only where the front end's consumers use that spec. None: not given.
    cdi_kind: str | None = field(default=None, metadata={"example": "example.com/fpga-spec"})
    # Every other key: its front end's settings (documented with them, not as a key of its own).
    settings: dict[str, Any] = field(factory=dict, metadata={"internal": True})

    def given(self) -> list[str]:
        return ([CDI_KIND] if self.cdi_kind is not None else []) + list(self.settings)


_RESOURCE_KEYS = (*CORE_KEYS, CDI_KIND)
_raw_resource = cattrs.gen.make_dict_structure_fn(_RawResource, converter, settings=cattrs.override(omit=True))


def _raw_resource_hook(value: Any, type_: Any) -> _RawResource:
    """The resource's own keys structured, the others kept for its front end's settings."""
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping, got {describe(value)}")
    raw = _raw_resource({k: v for k, v in value.items() if k in _RESOURCE_KEYS}, type_)
    return attrs.evolve(raw, settings={k: v for k, v in value.items() if k not in _RESOURCE_KEYS})


converter.register_structure_hook(_RawResource, _raw_resource_hook)


@frozen
class _RawNamed:
    resources: tuple[_RawResource, ...]  # the resources of the nodes with this configuration
    node_labels: bool | None = None  # write device labels on these nodes (default: the top-level node_labels)


@frozen
class _RawConfig:
    # The resources every node serves (or give configurations instead).
    resources: tuple[_RawResource, ...] | None = None
    # Write device labels on the node (cdiplug.dev/...); the default of every named configuration.
    node_labels: bool | None = None
    # Named configurations: a node gets the one its label cdiplug.dev/config names, "default" without it.
    configurations: dict[str, _RawNamed] | None = None


DEFAULT_NAME = "default"  # the named configuration a node without the cdiplug.dev/config label gets


@frozen
class Config:
    """One node's configuration. ``name`` is the named configuration it is (None: a file without
    ``configurations``); ``names`` every name the file has; ``path`` where its keys are in the file."""

    resources: tuple[ResourceConfig[object], ...]
    source: str = field(default="<built-in default>", eq=False)
    node_labels: bool = False
    name: str | None = None
    names: tuple[str, ...] = field(default=(), eq=False)
    path: str = field(default="$", eq=False)

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


def structure_options(options_type: type[O], raw: Mapping[str, Any], path: str, source: str) -> O:
    """Structure a backend's options mapping; errors carry ``path`` (``$.resources[1].options``).

    After structuring, an options class may check values across fields (it subclasses
    :class:`~cdiplug.backend.CheckedOptions`): its ``(field, message)`` pairs are reported as
    ``message @ path.field``.
    """
    try:
        options = converter.structure(dict(raw), options_type)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise config_error(exc, path, source) from exc
    for name, problem in options.problems() if isinstance(options, CheckedOptions) else ():
        raise ConfigError(problem, f"{path}.{name}", source)
    return options


def parse_config(
    data: Any,
    source: str = "<config>",
    plugins: Mapping[str, BackendPlugin[Any]] | None = None,
    configuration: str | None = None,
) -> Config:
    """Turn already-loaded YAML data into a checked :class:`Config`.

    A file with ``configurations`` gives the one named ``configuration`` (:data:`DEFAULT_NAME`
    when None); every one of them is checked, so a mistake in any is found on every node.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("the configuration must be a mapping with a 'resources' list", "$", source)
    if (problem := kubernetes_object_problem(data)) is not None:
        raise ConfigError(problem, "$", source)
    for key, expected in (("resources", "a list"), ("configurations", "a mapping")):
        if key in data and data[key] is None:  # None in the raw class means "not in the file"
            raise ConfigError(f"expected {expected}, got nothing (null)", f"$.{key}", source)
    try:
        raw = converter.structure(data, _RawConfig)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise config_error(exc, "$", source) from exc
    plugins = load_plugins() if plugins is None else plugins
    default_labels = bool(raw.node_labels)
    if raw.configurations is None:
        if raw.resources is None:
            raise ConfigError("required field missing", "$.resources", source)
        return _parse_resources(raw.resources, "$", source, plugins, node_labels=default_labels)
    if raw.resources is not None:
        raise ConfigError(
            "give either 'resources' or 'configurations', not both (put these resources under configurations.default)",
            "$.resources",
            source,
        )
    names = tuple(raw.configurations)
    if DEFAULT_NAME not in raw.configurations:
        raise ConfigError(
            f"a configuration named {DEFAULT_NAME!r} is needed (nodes without the label get it)", "$.configurations", source
        )
    configs: dict[str, Config] = {}
    for name, named in raw.configurations.items():
        problem = label_value_problem(name)
        if problem:
            raise ConfigError(f"configuration name {name!r}: {problem}", "$.configurations", source)
        labels = default_labels if named.node_labels is None else named.node_labels
        configs[name] = _parse_resources(
            named.resources, f"$.configurations.{name}", source, plugins, node_labels=labels, name=name, names=names
        )
    wanted = DEFAULT_NAME if configuration is None else configuration
    if wanted not in configs:
        raise ConfigError(
            f"no configuration named {wanted!r} (the file has: {', '.join(names)})",
            "$.configurations",
            source,
        )
    return configs[wanted]


def label_value_problem(name: str) -> str | None:
    """Why ``name`` cannot be a label value (the node label chooses a configuration by it)."""
    if not is_label_value(name):
        return "a configuration name is a label value: at most 63 letters, digits, '-', '_' or '.', a letter or digit at each end"
    return None


def _parse_resources(
    raw_resources: Sequence[_RawResource],
    base: str,
    source: str,
    plugins: Mapping[str, BackendPlugin[Any]],
    *,
    node_labels: bool,
    name: str | None = None,
    names: tuple[str, ...] = (),
) -> Config:
    if not raw_resources:
        raise ConfigError("at least one resource is needed", f"{base}.resources", source)
    resources: list[ResourceConfig[object]] = []
    given: dict[str, list[str]] = {}
    seen_names: dict[str, int] = {}
    seen_kinds: dict[str, int] = {}
    for i, r in enumerate(raw_resources):
        at = f"{base}.resources[{i}]"
        problem = extended_resource_problem(r.name)
        if problem:
            raise ConfigError(problem, f"{at}.name", source)
        if r.name in seen_names:
            raise ConfigError(
                f"resource {r.name!r} is already defined at {base}.resources[{seen_names[r.name]}]", f"{at}.name", source
            )
        seen_names[r.name] = i
        given[r.name] = r.given()
        _check_keys(r, at, source)
        if r.backend not in plugins:
            known = ", ".join(sorted(plugins)) or "none installed"
            raise BackendNotFound(f"unknown backend {r.backend!r} (known: {known})", f"{at}.backend", source)
        try:
            plugin = plugins[r.backend]
        except BackendError as exc:  # installed, but its package cannot be imported
            raise BackendNotFound(str(exc), f"{at}.backend", source) from exc
        # Every resource has a CDI kind (`cdiplug cdi generate` writes its spec, whatever its api);
        # only a front end whose consumers use that spec lets the file choose it.
        kind = r.cdi_kind or plugin.cdi_kind_for(r.name)
        if problem := spec_file_problem(kind):
            raise ConfigError(problem, f"{at}.cdi_kind" if r.cdi_kind else f"{at}.name", source)
        if kind in seen_kinds:
            raise ConfigError(
                f"CDI kind {kind!r} is already used by {base}.resources[{seen_kinds[kind]}]", f"{at}.cdi_kind", source
            )
        seen_kinds[kind] = i
        options = structure_options(plugin.options_type, r.options, f"{at}.options", source)
        front_end = front_end_type(r.api)
        settings = structure_options(front_end.settings, r.settings, at, source)
        resources.append(
            ResourceConfig(
                name=r.name,
                backend=r.backend,
                options=options,
                cdi_kind=kind,
                api=r.api,
                settings=front_end.settle(settings, r.name, plugin),
                overlapping_devices=front_end.overlapping_devices,
            )
        )
    config = Config(resources=tuple(resources), source=source, node_labels=node_labels, name=name, names=names, path=base)
    _raise_first(config, [p for api, group in by_api(config).items() for p in front_end_type(api).check(group)], given)
    return config


def _check_keys(r: _RawResource, at: str, source: str) -> None:
    """Every key of ``r`` is one its front end reads; one another front end reads is said so."""
    allowed = setting_names(r.api)
    for key in r.given():
        if key in allowed:
            continue
        if apis := owners(key):
            raise ConfigError(f"{key} is a {' or '.join(apis)} setting; this resource has api: {r.api}", f"{at}.{key}", source)
        raise ConfigError(f"unknown key {key!r} (allowed: {', '.join([*CORE_KEYS, *allowed])})", at, source)


def by_api(config: Config) -> dict[str, list[ResourceConfig[object]]]:
    """The resources of ``config`` by the api serving them, in registration order."""
    return {api: group for api in registered() if (group := [r for r in config.resources if r.api == api])}


def _raise_first(config: Config, problems: Sequence[ResourceProblem], given: Mapping[str, Sequence[str]] | None = None) -> None:
    """The first of the front ends' ``problems`` (in the file's order) as a ConfigError.

    With ``given`` (the settings each resource set in the file), a problem with a setting left to
    its default is reported at the resource's name, where that default comes from.
    """
    if not problems:
        return
    index = {r.name: i for i, r in enumerate(config.resources)}
    first = min(problems, key=lambda p: index[p.resource])
    setting = first.field.partition(".")[0]
    field = first.field
    if given is not None and setting not in (*CORE_KEYS, "options") and setting not in given[first.resource]:
        field = "name"
    raise ConfigError(first.message, f"{config.path}.resources[{index[first.resource]}].{field}", config.source)


def load_config(
    path: Path | str | None = None, plugins: Mapping[str, BackendPlugin[Any]] | None = None, configuration: str | None = None
) -> Config:
    """Read and check the config file, or the built-in default when ``path`` is None.

    The file is read bounded (a regular file of at most :data:`~cdiplug.toolkit.files.CONFIG_LIMIT`
    bytes) and parsed with the bounds of ``cdiplug.toolkit.safeload``; every problem is a ConfigError.
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
    return parse_config(data, source, plugins, configuration)


def check_against(config: Config, world: World) -> None:
    """The front ends' checks that need the node's folders (every socket path fits a unix socket
    address), run by the daemon at start (a ConfigError: exit 2) and on every reload (refused, the
    old configuration kept). Reported as ``message @ $.resources[i].name (in FILE)``.
    """
    _raise_first(config, [p for api, group in by_api(config).items() for p in front_end_type(api).check_node(group, world)])
