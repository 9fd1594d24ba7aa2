"""Checks a CDI spec file as strictly as the reference library does (``cdiplug cdi validate``).

The official JSON schema is loose (see ``shared/cdi-schema/README.md``): it lets unknown fields
through, does not check names, the ``cdiVersion`` value, or whether the version can express the
content. The reference Go library (``pkg/cdi``, ``api/producer``) refuses all of those when a
runtime loads the file, so a spec that passes here loads there. Checked:

- the document parses (JSON, or YAML for ``.yaml`` files), no duplicate keys;
- no unknown fields anywhere, every field of the right JSON type and range;
- ``cdiVersion`` a released version, and at least the version the content needs;
- the kind and every device name by the CDI name rules; device names unique; at least one device;
- every device has non-empty container edits;
- env entries ``NAME=value``; device node paths, types (``b c u p``), permissions (``r w m``),
  non-negative numbers; mounts with both paths; hook names the OCI hook points and a path;
  ``intelRdt.closID`` a file name; net devices named and unique; annotation keys valid.

Every problem is reported, one :class:`Problem` each, with the file and the JSON path.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from cdiplug.cdi import spec as cdispec
from cdiplug.cdi import version as cdiversion
from cdiplug.cdi.annotations import is_valid_name
from cdiplug.errors import CdiError
from cdiplug.models.names import device_name_problem, is_dns_subdomain, kind_problem

HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
DEVICE_NODE_TYPES = ("b", "c", "u", "p")
UINT32_MAX = 2**32 - 1
INT64_MAX = 2**63 - 1


@frozen
class Problem:
    file: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.message} @ {self.path} (in {self.file})"


# The JSON type of every field: "str", "bool", "uint32", "int64", "strs" (list of strings),
# "uint32s", "map" (string to string), or a class of cdiplug.cdi.spec / a list of one ([cls]).
_FIELDS: dict[type, dict[str, Any]] = {
    cdispec.CdiSpec: {
        "cdiVersion": "str",
        "kind": "str",
        "annotations": "map",
        "devices": [cdispec.CdiDevice],
        "containerEdits": cdispec.CdiContainerEdits,
    },
    cdispec.CdiDevice: {"name": "str", "annotations": "map", "containerEdits": cdispec.CdiContainerEdits},
    cdispec.CdiContainerEdits: {
        "env": "strs",
        "deviceNodes": [cdispec.CdiDeviceNode],
        "netDevices": [cdispec.CdiNetDevice],
        "hooks": [cdispec.CdiHook],
        "mounts": [cdispec.CdiMount],
        "intelRdt": cdispec.CdiIntelRdt,
        "additionalGids": "uint32s",
    },
    cdispec.CdiDeviceNode: {
        "path": "str",
        "hostPath": "str",
        "type": "str",
        "major": "int64",
        "minor": "int64",
        "fileMode": "uint32",
        "permissions": "str",
        "uid": "uint32",
        "gid": "uint32",
    },
    cdispec.CdiMount: {"hostPath": "str", "containerPath": "str", "options": "strs", "type": "str"},
    cdispec.CdiHook: {"hookName": "str", "path": "str", "args": "strs", "env": "strs", "timeout": "uint32"},
    cdispec.CdiIntelRdt: {
        "closID": "str",
        "l3CacheSchema": "str",
        "memBwSchema": "str",
        "schemata": "strs",
        "enableMonitoring": "bool",
    },
    cdispec.CdiNetDevice: {"hostInterfaceName": "str", "name": "str"},
}
_REQUIRED: dict[type, tuple[str, ...]] = {
    cdispec.CdiSpec: ("cdiVersion", "kind", "devices"),
    cdispec.CdiDevice: ("name", "containerEdits"),
    cdispec.CdiDeviceNode: ("path",),
    cdispec.CdiMount: ("hostPath", "containerPath"),
    cdispec.CdiHook: ("hookName", "path"),
    cdispec.CdiNetDevice: ("hostInterfaceName", "name"),
}
for _cls, _table in _FIELDS.items():  # the tables must follow the model's JSON keys exactly
    assert set(_table) == set(cdispec.json_keys(_cls)), _cls


class _Checker:
    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []
        self.type_errors = False

    def problem(self, path: str, message: str) -> None:
        self.found.append((path, message))

    # --- structure and types ------------------------------------------------------------------

    def obj(self, value: Any, cls: type, path: str) -> None:
        if not isinstance(value, Mapping):
            self.type_error(path, f"expected an object, got {_json_type(value)}")
            return
        table = _FIELDS[cls]
        for key in _REQUIRED.get(cls, ()):
            if key not in value:
                self.type_error(path, f"missing required field {key!r}")
        for key, item in value.items():
            if key not in table:
                # Not a type error: the checks of meaning below read only known fields.
                self.problem(f"{path}.{key}", f"unknown field {key!r} (known: {', '.join(table)})")
                continue
            self.typed(item, table[key], f"{path}.{key}")

    def typed(self, value: Any, kind: Any, path: str) -> None:
        if isinstance(kind, list):
            if not isinstance(value, list):
                self.type_error(path, f"expected an array, got {_json_type(value)}")
                return
            for i, item in enumerate(value):
                self.obj(item, kind[0], f"{path}[{i}]")
        elif isinstance(kind, type):
            self.obj(value, kind, path)
        elif kind == "str":
            if not isinstance(value, str):
                self.type_error(path, f"expected a string, got {_json_type(value)}")
        elif kind == "bool":
            if not isinstance(value, bool):
                self.type_error(path, f"expected true or false, got {_json_type(value)}")
        elif kind in ("uint32", "int64"):
            self.integer(value, kind, path)
        elif kind in ("strs", "uint32s"):
            if not isinstance(value, list):
                self.type_error(path, f"expected an array, got {_json_type(value)}")
                return
            for i, item in enumerate(value):
                self.typed(item, kind[:-1], f"{path}[{i}]")
        elif kind == "map":
            if not isinstance(value, Mapping):
                self.type_error(path, f"expected an object of strings, got {_json_type(value)}")
                return
            for key, item in value.items():
                if not isinstance(item, str):
                    self.type_error(f"{path}.{key}", f"expected a string, got {_json_type(item)}")

    def integer(self, value: Any, kind: str, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.type_error(path, f"expected an integer, got {_json_type(value)}")
            return
        high = UINT32_MAX if kind == "uint32" else INT64_MAX
        low = 0 if kind == "uint32" else -INT64_MAX - 1
        if not low <= value <= high:
            self.type_error(path, f"{value} is out of range for {kind}")

    def type_error(self, path: str, message: str) -> None:
        self.type_errors = True
        self.problem(path, message)

    # --- meaning (on a document whose types are right) ------------------------------------------

    def spec(self, raw: Mapping[str, Any], model: cdispec.CdiSpec | None = None) -> None:
        kind = raw["kind"]
        problem = kind_problem(kind)
        if problem:
            self.problem("$.kind", problem)
        self.annotations(raw.get("annotations", {}), "$.annotations")
        self.edits(raw.get("containerEdits", {}), "$.containerEdits")
        devices = raw["devices"]
        if not devices:
            self.problem("$.devices", "a spec needs at least one device")
        seen: dict[str, int] = {}
        for i, dev in enumerate(devices):
            at = f"$.devices[{i}]"
            name = dev["name"]
            problem = device_name_problem(name)
            if problem:
                self.problem(f"{at}.name", problem)
            if name in seen:
                self.problem(f"{at}.name", f"device name {name!r} is already used by $.devices[{seen[name]}]")
            seen.setdefault(name, i)
            self.annotations(dev.get("annotations", {}), f"{at}.annotations")
            edits = dev["containerEdits"]
            if not any(edits.get(k) for k in _FIELDS[cdispec.CdiContainerEdits]):
                self.problem(f"{at}.containerEdits", f"device {name!r} has empty container edits")
            self.edits(edits, f"{at}.containerEdits")
        self.version(raw, model)

    def version(self, raw: Mapping[str, Any], model: cdispec.CdiSpec | None = None) -> None:
        """``model``: the spec ``raw`` was made from, when there is one (no need to structure it again)."""
        declared = raw["cdiVersion"]
        if not cdiversion.is_known(declared):
            self.problem("$.cdiVersion", f"unknown cdiVersion {declared!r} (known: {', '.join(cdiversion.KNOWN_VERSIONS)})")
            return
        if model is None:
            try:
                model = cdispec.from_dict(_known_only(raw, cdispec.CdiSpec))
            except CdiError as exc:  # types were checked above; this guards a gap between the two
                self.problem("$", str(exc))
                return
        needs = [(v, why) for v, why in cdiversion.requirements(model) if cdiversion.parse(v) > cdiversion.parse(declared)]
        if needs:
            highest = max((v for v, _ in needs), key=cdiversion.parse)
            reasons = "; ".join(f"{why} needs {v}" for v, why in needs)
            self.problem("$.cdiVersion", f"cdiVersion {declared} is too low for the content, which needs {highest}: {reasons}")

    def edits(self, edits: Mapping[str, Any], path: str) -> None:
        self.env(edits.get("env", []), f"{path}.env")
        for i, node in enumerate(edits.get("deviceNodes", [])):
            at = f"{path}.deviceNodes[{i}]"
            if not node["path"]:
                self.problem(f"{at}.path", "a device node needs a path")
            elif not node["path"].startswith("/"):
                self.problem(f"{at}.path", f"device node path {node['path']!r} is not absolute")
            node_type = node.get("type", "")
            if node_type and node_type not in DEVICE_NODE_TYPES:
                self.problem(f"{at}.type", f"invalid device node type {node_type!r} (one of {', '.join(DEVICE_NODE_TYPES)})")
            perms = node.get("permissions", "")
            if perms != "none" and set(perms) - set("rwm"):
                self.problem(f"{at}.permissions", f"invalid permissions {perms!r} (letters of 'rwm', or 'none')")
            for key in ("major", "minor"):
                if node.get(key, 0) < 0:
                    self.problem(f"{at}.{key}", f"a device number is never negative, got {node[key]}")
        for i, mount in enumerate(edits.get("mounts", [])):
            for key in ("hostPath", "containerPath"):
                if not mount[key]:
                    self.problem(f"{path}.mounts[{i}].{key}", f"a mount needs a {key}")
        for i, hook in enumerate(edits.get("hooks", [])):
            at = f"{path}.hooks[{i}]"
            if hook["hookName"] not in HOOK_NAMES:
                self.problem(f"{at}.hookName", f"invalid hook name {hook['hookName']!r} (one of {', '.join(HOOK_NAMES)})")
            if not hook["path"]:
                self.problem(f"{at}.path", "a hook needs a path")
            self.env(hook.get("env", []), f"{at}.env")
        rdt = edits.get("intelRdt")
        if rdt is not None:
            clos = rdt.get("closID", "")
            if clos != "/" and (len(clos) >= 4096 or clos in (".", "..") or "/" in clos or "\n" in clos):
                self.problem(f"{path}.intelRdt.closID", f"closID {clos!r} is not a valid file name")
        hosts: dict[str, int] = {}
        names: dict[str, int] = {}
        for i, net in enumerate(edits.get("netDevices", [])):
            at = f"{path}.netDevices[{i}]"
            for key, seen in (("hostInterfaceName", hosts), ("name", names)):
                value = net[key]
                if not value:
                    self.problem(f"{at}.{key}", f"a net device needs a {key}")
                elif value in seen:
                    self.problem(f"{at}.{key}", f"{key} {value!r} is already used by {path}.netDevices[{seen[value]}]")
                seen.setdefault(value, i)

    def env(self, env: list[str], path: str) -> None:
        for i, entry in enumerate(env):
            if entry.find("=") <= 0:
                self.problem(f"{path}[{i}]", f"invalid environment variable {entry!r} (must be NAME=value)")

    def annotations(self, annotations: Mapping[str, str], path: str) -> None:
        total = 0
        for key, value in annotations.items():
            total += len(key) + len(value)
            prefix, sep, name = key.rpartition("/")
            if not is_valid_name(name):
                self.problem(
                    f"{path}.{key}",
                    f"annotation key {key!r}: the name part must be 1-63 letters, digits, '-', '_', '.', starting and ending with a letter or digit",
                )
            if sep and not is_dns_subdomain(prefix):
                self.problem(f"{path}.{key}", f"annotation key {key!r}: the prefix must be a lower-case DNS subdomain")
        if total > 256 * 1024:
            self.problem(path, "annotations are larger than 256 KiB in total")


def _known_only(value: Any, kind: Any) -> Any:
    """``value`` without the unknown fields (already reported), for structuring into the model."""
    if isinstance(kind, list):
        return [_known_only(v, kind[0]) for v in value]
    if isinstance(kind, type):
        table = _FIELDS[kind]
        return {k: _known_only(v, table[k]) for k, v in value.items() if k in table}
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "an array"
    return "an object"


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_document(text: str, yaml_format: bool = False) -> Any:
    """Parse a spec file's text; raises CdiError (with the line) when it is not JSON/YAML."""
    if yaml_format:
        import yaml  # only for .yaml specs: the daemon checks its own JSON without it

        try:
            return yaml.load(text, Loader=_strict_loader())
        except yaml.YAMLError as exc:
            raise CdiError(f"not valid YAML: {exc}") from exc
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise CdiError(str(exc)) from exc
    except ValueError as exc:
        raise CdiError(f"not valid JSON: {exc}") from exc


@functools.cache
def _strict_loader() -> Any:
    """A SafeLoader that refuses duplicate keys, as the reference library's strict unmarshal does."""
    import yaml

    class _StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            keys = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in keys:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                keys.add(key)
            return super().construct_mapping(node, deep)

    return _StrictLoader


def check_document(data: Any, file: str = "<spec>", model: cdispec.CdiSpec | None = None) -> list[Problem]:
    """Every problem of an already-parsed spec document (``model``: the spec it was made from)."""
    checker = _Checker()
    checker.obj(data, cdispec.CdiSpec, "$")
    if not checker.type_errors:
        checker.spec(data, model)
    return [Problem(file, path, message) for path, message in checker.found]


def check_spec(spec: cdispec.CdiSpec, file: str = "<spec>") -> list[Problem]:
    """Every problem of a spec we built (its JSON form checked, its versions from the spec itself)."""
    return check_document(cdispec.to_dict(spec), file, spec)


def check_file(path: Path | str) -> list[Problem]:
    """Every problem of the spec file at ``path`` (``.yaml``/``.yml`` read as YAML, others as JSON)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem(str(path), "$", f"cannot read: {getattr(exc, 'strerror', None) or exc}")]
    try:
        data = load_document(text, yaml_format=path.suffix in (".yaml", ".yml"))
    except CdiError as exc:
        return [Problem(str(path), "$", str(exc))]
    return check_document(data, str(path))
