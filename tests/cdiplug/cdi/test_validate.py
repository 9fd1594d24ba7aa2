"""Strict spec validation (``cdiplug.cdi.validate``) on spec files in a temporary folder: every
check the reference library makes, one problem per message with the file and the JSON path, and
agreement with the official schema on what the schema does check."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cdiplug.cdi.validate import check_document, check_file

GOOD: dict[str, Any] = {
    "cdiVersion": "0.5.0",
    "kind": "example.com/fpga",
    "devices": [
        {
            "name": "fpga-0",
            "containerEdits": {
                "env": ["A=1"],
                "deviceNodes": [{"path": "/dev/f0", "hostPath": "/srv/f0", "type": "c", "permissions": "rw"}],
            },
        },
        {
            "name": "fpga-1",
            "containerEdits": {
                "mounts": [{"hostPath": "/srv/x", "containerPath": "/x", "options": ["ro", "bind"]}],
                "hooks": [{"hookName": "createContainer", "path": "/bin/true"}],
            },
        },
    ],
    "containerEdits": {"env": ["COMMON=1"]},
}


def bad(change: str, value: Any) -> dict[str, Any]:
    """GOOD with one change, given as a dotted path (list indexes as numbers); None deletes."""
    doc = copy.deepcopy(GOOD)
    *parents, last = [int(p) if p.isdigit() else p for p in change.split(".")]
    target: Any = doc
    for p in parents:
        target = target[p]
    if value is None:
        del target[last]
    else:
        target[last] = value
    return doc


def test_good_spec_has_no_problems(tmp_path: Path, schema_errors) -> None:
    path = tmp_path / "good.json"
    path.write_text(json.dumps(GOOD))
    assert check_file(path) == []
    assert schema_errors(GOOD) == []


CASES = [
    (
        "unknown field",
        bad("devices.0.containerEdits.devicenodes", []),
        "$.devices[0].containerEdits.devicenodes",
        "unknown field",
    ),
    ("unknown top-level field", bad("containerSpec", {}), "$.containerSpec", "unknown field"),
    ("missing kind", bad("kind", None), "$", "missing required field 'kind'"),
    ("wrong type", bad("devices.0.containerEdits.env", "A=1"), "$.devices[0].containerEdits.env", "expected an array"),
    (
        "uid out of range",
        bad("devices.0.containerEdits.deviceNodes.0.uid", -1),
        "$.devices[0].containerEdits.deviceNodes[0].uid",
        "out of range",
    ),
    (
        "boolean is not a number",
        bad("devices.0.containerEdits.deviceNodes.0.major", True),
        "$.devices[0].containerEdits.deviceNodes[0].major",
        "expected an integer",
    ),
    ("env item not a string", bad("containerEdits.env", [1]), "$.containerEdits.env[0]", "expected a string"),
    ("unknown version", bad("cdiVersion", "0.9.0"), "$.cdiVersion", "unknown cdiVersion"),
    ("version too low", bad("cdiVersion", "0.4.0"), "$.cdiVersion", "needs 0.5.0"),
    ("bad kind", bad("kind", "example.com/1fpga"), "$.kind", "class '1fpga'"),
    ("kind without vendor", bad("kind", "fpga"), "$.kind", "vendor/class"),
    ("bad device name", bad("devices.0.name", "fpga/0"), "$.devices[0].name", "CDI device name"),
    ("duplicate device name", bad("devices.1.name", "fpga-0"), "$.devices[1].name", "already used"),
    ("no devices", bad("devices", []), "$.devices", "at least one device"),
    ("empty edits", bad("devices.1.containerEdits", {"env": []}), "$.devices[1].containerEdits", "empty container edits"),
    ("bad env", bad("containerEdits.env", ["=x"]), "$.containerEdits.env[0]", "NAME=value"),
    (
        "bad node type",
        bad("devices.0.containerEdits.deviceNodes.0.type", "x"),
        "$.devices[0].containerEdits.deviceNodes[0].type",
        "invalid device node type",
    ),
    (
        "bad permissions",
        bad("devices.0.containerEdits.deviceNodes.0.permissions", "rwx"),
        "$.devices[0].containerEdits.deviceNodes[0].permissions",
        "invalid permissions",
    ),
    (
        "empty node path",
        bad("devices.0.containerEdits.deviceNodes.0.path", ""),
        "$.devices[0].containerEdits.deviceNodes[0].path",
        "needs a path",
    ),
    (
        "relative node path",
        bad("devices.0.containerEdits.deviceNodes.0.path", "dev/f0"),
        "$.devices[0].containerEdits.deviceNodes[0].path",
        "not absolute",
    ),
    (
        "negative minor",
        bad("devices.0.containerEdits.deviceNodes.0.minor", -1),
        "$.devices[0].containerEdits.deviceNodes[0].minor",
        "negative",
    ),
    (
        "empty mount path",
        bad("devices.1.containerEdits.mounts.0.containerPath", ""),
        "$.devices[1].containerEdits.mounts[0].containerPath",
        "needs a containerPath",
    ),
    (
        "bad hook name",
        bad("devices.1.containerEdits.hooks.0.hookName", "preStart"),
        "$.devices[1].containerEdits.hooks[0].hookName",
        "invalid hook name",
    ),
    ("hook env", bad("devices.1.containerEdits.hooks.0.env", ["X"]), "$.devices[1].containerEdits.hooks[0].env[0]", "NAME=value"),
    (
        "closID",
        {**bad("containerEdits.intelRdt", {"closID": "a/b"}), "cdiVersion": "0.7.0"},
        "$.containerEdits.intelRdt.closID",
        "not a valid file name",
    ),
    (
        "annotation key",
        {**bad("annotations", {"bad key!": "x"}), "cdiVersion": "0.6.0"},
        "$.annotations.bad key!",
        "annotation key",
    ),
    (
        "annotation name over 63",
        {**bad("annotations", {"cdi.k8s.io/" + "a" * 64: "x"}), "cdiVersion": "0.6.0"},
        "$.annotations.cdi.k8s.io/" + "a" * 64,
        "1-63 letters",
    ),
    (
        "annotation prefix",
        {**bad("devices.0.annotations", {"Cdi.io/a": "x"}), "cdiVersion": "0.6.0"},
        "$.devices[0].annotations.Cdi.io/a",
        "DNS subdomain",
    ),
]


@pytest.mark.parametrize(("what", "doc", "path", "message"), CASES, ids=[c[0] for c in CASES])
def test_each_problem_is_named_with_its_path(tmp_path: Path, what: str, doc: dict, path: str, message: str) -> None:
    file = tmp_path / "spec.json"
    file.write_text(json.dumps(doc))
    problems = check_file(file)
    assert [(p.path, message in p.message) for p in problems] == [(path, True)], problems
    assert str(problems[0]).endswith(f" @ {path} (in {file})")


def test_version_problem_only_when_the_rest_is_right() -> None:
    doc = bad("cdiVersion", "0.6.0")  # higher than needed is fine
    assert check_document(doc) == []


def test_net_devices_need_names_and_no_duplicates() -> None:
    doc = bad(
        "devices.0.containerEdits.netDevices",
        [{"hostInterfaceName": "eth1", "name": "n0"}, {"hostInterfaceName": "eth1", "name": ""}],
    )
    doc["cdiVersion"] = "1.1.0"
    messages = sorted((p.path, p.message.split(" ")[0]) for p in check_document(doc))
    assert messages == [
        ("$.devices[0].containerEdits.netDevices[1].hostInterfaceName", "hostInterfaceName"),
        ("$.devices[0].containerEdits.netDevices[1].name", "a"),
    ]


def test_several_problems_several_messages(tmp_path: Path) -> None:
    doc = bad("kind", "fpga")
    doc["devices"][0]["name"] = "-x"
    doc["devices"][1]["containerEdits"]["hooks"][0]["hookName"] = "nope"
    doc["surprise"] = 1
    file = tmp_path / "many.json"
    file.write_text(json.dumps(doc))
    paths = sorted(p.path for p in check_file(file))
    assert paths == sorted(["$.kind", "$.devices[0].name", "$.devices[1].containerEdits.hooks[0].hookName", "$.surprise"])


def test_unreadable_and_unparsable_files(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "dup.json").write_text('{"kind": "a", "kind": "b"}')
    (tmp_path / "dup.yaml").write_text("kind: a\nkind: b\n")
    (tmp_path / "list.json").write_text("[]")
    assert "not valid JSON" in check_file(tmp_path / "broken.json")[0].message
    assert "duplicate key 'kind'" in check_file(tmp_path / "dup.json")[0].message
    assert "duplicate key 'kind'" in check_file(tmp_path / "dup.yaml")[0].message
    assert "expected an object" in check_file(tmp_path / "list.json")[0].message
    assert "cannot read" in check_file(tmp_path / "missing.json")[0].message


def test_yaml_specs(tmp_path: Path) -> None:
    file = tmp_path / "spec.yaml"
    file.write_text("cdiVersion: 0.3.0\nkind: example.com/fpga\ndevices:\n- name: d0\n  containerEdits:\n    env: [A=1]\n")
    assert check_file(file) == []


def test_schema_and_validator_agree_where_the_schema_checks(schema_errors) -> None:
    for doc in (
        bad("kind", None),
        bad("devices.0.containerEdits.deviceNodes.0.uid", -1),
        bad("devices.1.containerEdits.mounts.0.hostPath", None),
    ):
        assert schema_errors(doc) and check_document(doc)
