"""cdiplug.config: named configurations (``configurations``), ``node_labels`` and ``register_when_empty``.

What a user writes for a mixed fleet: the flat file stays valid; a file of named configurations
gives ``default`` or the one named, and every one is checked wherever it is used, errors naming
the configuration's path; the ways such a file can be wrong.
"""

from __future__ import annotations

from typing import Any

import pytest

from cdiplug.config import parse_config
from cdiplug.errors import ConfigError

FPGA = {"name": "example.com/fpga", "backend": "fake"}


def named(**configurations: Any) -> dict[str, Any]:
    return {"configurations": configurations}


def error(data: Any, configuration: str | None = None) -> tuple[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "fleet.yaml", configuration=configuration)
    return info.value.message, info.value.path


def test_the_flat_file_stays_one_configuration() -> None:
    config = parse_config(
        {"resources": [FPGA]}, "flat.yaml", configuration="gpu-node"
    )  # a label on a flat file: nothing to choose
    assert (config.name, config.names, config.node_labels) == (None, (), False)
    assert parse_config({"resources": [FPGA], "node_labels": True}).node_labels
    assert not config.resources[0].settings.register_when_empty


def test_the_label_chooses_default_otherwise() -> None:
    data = {
        "node_labels": True,
        "configurations": {
            "default": {"resources": [{**FPGA, "options": {"count": 0}}]},
            "fast-fpga": {"resources": [{**FPGA, "register_when_empty": True}]},
            "quiet": {"resources": [FPGA], "node_labels": False},
        },
    }
    default = parse_config(data, "fleet.yaml")
    assert (default.name, default.names, default.node_labels) == ("default", ("default", "fast-fpga", "quiet"), True)
    fast = parse_config(data, "fleet.yaml", configuration="fast-fpga")
    assert fast.name == "fast-fpga" and fast.resources[0].settings.register_when_empty
    assert not parse_config(data, "fleet.yaml", configuration="quiet").node_labels  # its own setting wins


@pytest.mark.parametrize(
    ("data", "configuration", "message", "path"),
    [
        (named(default={"resources": [FPGA]}), "gpu", "no configuration named 'gpu' (the file has: default)", "$.configurations"),
        (named(gpu={"resources": [FPGA]}), "gpu", "a configuration named 'default' is needed (nodes without the label get it)", "$.configurations"),
        ({"resources": [FPGA], **named(default={"resources": [FPGA]})}, None, "give either 'resources' or 'configurations', not both (put these resources under configurations.default)", "$.resources"),
        (named(default={"resources": [FPGA]}, gpu={"resources": [{**FPGA, "options": {"count": "2"}}]}), None, "expected an integer, got str '2'", "$.configurations.gpu.resources[0].options.count"),
        (named(default={"resources": []}), None, "at least one resource is needed", "$.configurations.default.resources"),
        (named(default={"resources": [FPGA, FPGA]}), None, "resource 'example.com/fpga' is already defined at $.configurations.default.resources[0]", "$.configurations.default.resources[1].name"),
        ({"configurations": None}, None, "expected a mapping, got nothing (null)", "$.configurations"),
        ({"resources": [FPGA], "node_labels": "yes"}, None, "expected true or false, got str 'yes'", "$.node_labels"),
        ({"resources": [{**FPGA, "api": "dra", "register_when_empty": True}]}, None, "register_when_empty is a device-plugin setting; this resource has api: dra", "$.resources[0].register_when_empty"),
    ],
)  # fmt: skip
def test_what_can_be_wrong(data: Any, configuration: str | None, message: str, path: str) -> None:
    assert error(data, configuration) == (message, path)


def test_a_name_is_a_label_value() -> None:
    message, path = error(named(default={"resources": [FPGA]}, **{"gpu node": {"resources": [FPGA]}}))
    assert (
        message.startswith("configuration name 'gpu node': a configuration name is a label value") and path == "$.configurations"
    )
