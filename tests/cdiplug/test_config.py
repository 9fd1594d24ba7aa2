"""Configuration (cdiplug.config): the YAML file of the README's "Configuration", read from real files in tmp_path.

Covers the built-in default, defaults of every key, and every kind of error with its exact
message, field path and file: wrong types, unknown keys, bad values, resource names as the
kubelet checks them, duplicate names and CDI kinds, replicas, allocate parts, bad YAML, missing
and unreadable files, backends that are unknown or cannot be imported, and options checks.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml
from attrs import frozen

from cdiplug import backend as backend_module
from cdiplug.backend import ENTRY_POINT_GROUP, BackendPlugin, PluginRegistry
from cdiplug.config import (
    DEFAULT_CONFIG,
    DEFAULT_CONFIG_YAML,
    Config,
    load_config,
    parse_config,
)
from cdiplug.errors import BackendNotFound, ConfigError
from cdiplug.host import group_by_backend
from cdiplug.models.devices import DEFAULT_ALLOCATE, AllocatePart
from cdiplug.models.resource import ResourceConfig


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_built_in_default():
    config = load_config(None)
    assert config.source == "<built-in default>"
    [r] = config.resources
    assert (r.name, r.backend, r.cdi_kind, r.settings.allocate, r.settings.replicas) == (
        "example.com/fpga",
        "fake",
        "example.com/fpga",
        DEFAULT_ALLOCATE,
        1,
    )
    assert (r.options.count, r.options.numa_nodes, r.options.health_file) == (2, (), None)
    assert "example.com/fpga" in DEFAULT_CONFIG_YAML


def test_full_file_and_defaults(tmp_path):
    path = write(
        tmp_path,
        """
resources:
  - name: example.com/fpga
    backend: fake
  - name: example.com/nic
    backend: fake
    options: {count: 4, numa_nodes: [0, 1], health_file: /run/h.yaml}
    cdi_kind: vendor.io/nic
    allocate: [cdi-cri, cdi-annotations]
    replicas: 3
""",
    )
    config = load_config(path)
    assert config.source == str(path)
    fpga, nic = config.resources
    assert (fpga.options.count, fpga.cdi_kind, fpga.settings.allocate, fpga.settings.replicas) == (
        2,
        "example.com/fpga",
        DEFAULT_ALLOCATE,
        1,
    )
    assert AllocatePart.CDI_ANNOTATIONS not in fpga.settings.allocate and fpga.settings.sends(AllocatePart.ENVVAR)
    assert (nic.options.count, nic.options.numa_nodes, nic.options.health_file) == (4, (0, 1), Path("/run/h.yaml"))
    assert (nic.cdi_kind, nic.settings.replicas) == ("vendor.io/nic", 3)
    assert nic.settings.allocate == {AllocatePart.CDI_CRI, AllocatePart.CDI_ANNOTATIONS}
    assert nic.socket_name == "example.com-nic.sock"
    assert config.by_name()["example.com/nic"] is nic
    assert group_by_backend(config.resources) == {"fake": (fpga, nic)}


def test_equal_configs_compare_equal_whatever_their_source():
    a = parse_config({"resources": [{"name": "ab.io/xy", "backend": "fake"}]}, "one.yaml")
    b = parse_config({"resources": [{"name": "ab.io/xy", "backend": "fake"}]}, "two.yaml")
    assert a == b and isinstance(a, Config)
    assert ResourceConfig("ab.io/xy", "fake", None).cdi_kind == "ab.io/xy"


R = "  - name: example.com/fpga\n    backend: fake\n"

ERRORS = [
    # (YAML, message, path)
    ("", "the configuration must be a mapping with a 'resources' list", "$"),
    ("- a\n", "the configuration must be a mapping with a 'resources' list", "$"),
    ("{}", "required field missing", "$.resources"),
    ("resources:\n", "expected a list, got nothing (null)", "$.resources"),
    ("resources: {a: 1}\n", "expected a list, got dict {'a': 1}", "$.resources"),
    ("resources: []\n", "at least one resource is needed", "$.resources"),
    ("resources: [5]\n", "expected a mapping, got int 5", "$.resources[0]"),
    ("resources:\n" + R + "other: 1\n", "unknown key 'other' (allowed: resources, node_labels, configurations)", "$"),
    ("resources:\n  - backend: fake\n", "required field missing", "$.resources[0].name"),
    ("resources:\n  - name: example.com/fpga\n", "required field missing", "$.resources[0].backend"),
    ("resources:\n  - {name: 5, backend: fake}\n", "expected a string, got int 5", "$.resources[0].name"),
    (
        "resources:\n" + R + "    replica: 2\n",
        "unknown key 'replica' (allowed: name, backend, options, api, cdi_kind, allocate, replicas, register_when_empty)",
        "$.resources[0]",
    ),
    (
        "resources:\n  - {name: fpga, backend: fake}\n",
        "resource name 'fpga' needs a domain prefix, as in example.com/fpga",
        "$.resources[0].name",
    ),
    (
        "resources:\n" + R + "  - {name: kubernetes.io/gpu, backend: fake}\n",
        "resource name 'kubernetes.io/gpu' is in the kubernetes.io domain, which is reserved for native resources",
        "$.resources[1].name",
    ),
    (
        "resources:\n  - {name: Example.com/fpga, backend: fake}\n",
        "resource name 'Example.com/fpga': prefix 'Example.com' is not a DNS-1123 subdomain (lower case, digits, '-', '.')",
        "$.resources[0].name",
    ),
    ("resources:\n" + R + R, "resource 'example.com/fpga' is already defined at $.resources[0]", "$.resources[1].name"),
    (
        "resources:\n" + R + "  - {name: example.com/other, backend: fake, cdi_kind: example.com/fpga}\n",
        "CDI kind 'example.com/fpga' is already used by $.resources[0]",
        "$.resources[1].cdi_kind",
    ),
    ("resources:\n" + R + "    cdi_kind: fpga\n", "CDI kind 'fpga' must be vendor/class", "$.resources[0].cdi_kind"),
    (
        # A fine resource name that is no CDI kind: reported at the name, the kind's source.
        "resources:\n  - {name: example.com/1fpga, backend: fake}\n",
        "CDI kind 'example.com/1fpga': class '1fpga' must start with a letter, end with a letter or digit, and hold only letters, digits, '_', '-', '.'",
        "$.resources[0].name",
    ),
    ("resources:\n" + R + "    replicas: 0\n", "replicas must be at least 1, got 0", "$.resources[0].replicas"),
    ("resources:\n" + R + "    replicas: -2\n", "replicas must be at least 1, got -2", "$.resources[0].replicas"),
    ("resources:\n" + R + "    replicas: '2'\n", "expected an integer, got str '2'", "$.resources[0].replicas"),
    ("resources:\n" + R + "    replicas: true\n", "expected an integer, got a boolean", "$.resources[0].replicas"),
    ("resources:\n" + R + "    replicas: 1.5\n", "expected an integer, got float 1.5", "$.resources[0].replicas"),
    ("resources:\n" + R + "    allocate: []\n", "allocate must name at least one part", "$.resources[0].allocate"),
    ("resources:\n" + R + "    allocate: envvar\n", "expected a list, got str 'envvar'", "$.resources[0].allocate"),
    (
        "resources:\n" + R + "    allocate: [envvar, cdi]\n",
        "expected one of 'cdi-cri', 'device-specs', 'envvar', 'cdi-annotations', 'mounts', got 'cdi'",
        "$.resources[0].allocate[1]",
    ),
    ("resources:\n  - {name: example.com/fpga, backend: nope}\n", "unknown backend 'nope' (known: ", "$.resources[0].backend"),
    ("resources:\n" + R + "    options: [1]\n", "expected a mapping", "$.resources[0].options"),
    ("resources:\n" + R + "    options: {count: 2.0}\n", "expected an integer, got float 2.0", "$.resources[0].options.count"),
    ("resources:\n" + R + "    options: {count: -1}\n", "must be between 0 and 65536, got -1", "$.resources[0].options.count"),
    (
        "resources:\n" + R + "    options: {counts: 1}\n",
        "unknown key 'counts' (allowed: count, numa_nodes, health_file, attributes, prepared_dir, shared, capacity, partitions)",
        "$.resources[0].options",
    ),
]


@pytest.mark.parametrize(("text", "message", "path"), ERRORS)
def test_every_error_names_its_field_and_file(tmp_path, text, message, path):
    file = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(file)
    err = info.value
    assert err.message.startswith(message) if message.endswith(": ") else err.message == message
    assert (err.path, err.source) == (path, str(file))
    assert str(err).startswith(f"{err.message} @ {path} (in {file})")


def test_unknown_backend_is_its_own_class_and_lists_the_known(tmp_path):
    with pytest.raises(BackendNotFound, match=r"unknown backend 'nope' \(known: .*fake"):
        load_config(write(tmp_path, "resources:\n  - {name: example.com/fpga, backend: nope}\n"))


def test_several_problems_are_all_reported(tmp_path):
    file = write(tmp_path, "resources:\n  - {name: 5, backend: 6}\n")
    with pytest.raises(ConfigError) as info:
        load_config(file)
    text = str(info.value)
    assert "expected a string, got int 5 @ $.resources[0].name" in text
    assert "expected a string, got int 6 @ $.resources[0].backend" in text


def test_bad_yaml_says_where(tmp_path):
    file = write(tmp_path, "resources:\n  - name: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert info.value.message.startswith("not valid YAML at line 3, column 1: ")
    assert (info.value.path, info.value.source) == ("$", str(file))


def test_missing_unreadable_and_binary_files(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(info.value) == f"cannot read configuration: No such file or directory @ $ (in {missing})"
    with pytest.raises(ConfigError, match="cannot read configuration: it is a folder, not a regular file"):
        load_config(tmp_path)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"resources:\n  - name: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 21 is 0xff, on line 2\) @ \$ \(in .*bin.yaml\)"):
        load_config(binary)


def test_a_backend_that_cannot_be_imported_is_reported_at_its_field(monkeypatch):
    broken = EntryPoint(name="broken", value="cdiplug_no_such_module:plugin", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr(backend_module, "entry_points", lambda group: [broken])
    with pytest.raises(BackendNotFound) as info:
        parse_config({"resources": [{"name": "ab.io/xy", "backend": "broken"}]}, "c.yaml", PluginRegistry())
    assert info.value.path == "$.resources[0].backend"
    assert "cdiplug_no_such_module:plugin" in info.value.message and "ModuleNotFoundError" in info.value.message


@frozen
class PairOptions:
    low: int = 0
    high: int = 1

    def problems(self):
        if self.low > self.high:
            yield "high", f"must not be below low ({self.low}), got {self.high}"


def test_options_cross_field_problems_name_the_field():
    plugins = {"pair": BackendPlugin(name="pair", options_type=PairOptions, create=lambda rs, w: None)}  # type: ignore[arg-type,return-value]
    data = {"resources": [{"name": "ab.io/xy", "backend": "pair", "options": {"low": 5, "high": 2}}]}
    with pytest.raises(ConfigError) as info:
        parse_config(data, "c.yaml", plugins)
    assert (info.value.message, info.value.path) == ("must not be below low (5), got 2", "$.resources[0].options.high")
    data["resources"][0]["options"] = {"low": 1}
    assert parse_config(data, "c.yaml", plugins).resources[0].options == PairOptions(1, 1)


def test_a_backend_may_choose_the_default_cdi_kind_and_cdi_kind_still_wins():
    plugins = {
        "own": BackendPlugin(
            name="own",
            options_type=PairOptions,
            create=lambda rs, w: None,  # type: ignore[arg-type,return-value]
            default_cdi_kind=lambda name: f"cdiplug.{name}",
        ),
    }
    config = parse_config(
        {
            "resources": [
                {"name": "nvidia.com/gpu", "backend": "own"},
                {"name": "nvidia.com/a10", "backend": "own", "cdi_kind": "example.com/a10"},
            ]
        },
        "c.yaml",
        plugins,
    )
    assert [r.cdi_kind for r in config.resources] == ["cdiplug.nvidia.com/gpu", "example.com/a10"]


def test_built_in_default_mapping_says_what_the_yaml_says():
    assert yaml.safe_load(DEFAULT_CONFIG_YAML) == DEFAULT_CONFIG


def test_default_serve_path_imports_nothing_it_does_not_need():
    """`cdiplug serve` without --config: no YAML, no JSON, no metrics, no DRA, no hardware
    libraries, no CDI spec building before Register (start-up time and memory)."""
    code = (
        "import sys, cdiplug.cli.serve, cdiplug.daemon; from cdiplug.config import load_config; load_config(None);"
        "heavy = ('yaml', 'json', 'prometheus_client', 'lightkube', 'pyroute2', 'pyudev', 'pynvml', 'cdiplug.dra',"
        " 'cdiplug.cdi.build', 'cdiplug.telemetry.metrics');"
        "bad = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in heavy));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
