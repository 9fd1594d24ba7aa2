"""CDI names (``cdiplug.models.names``): kinds, device names, qualified names, the mapping of IDs that
are not valid names, and spec file names. Pure functions, checked against the CDI naming rules
with examples and hypothesis."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdiplug.errors import CdiNameError
from cdiplug.models.names import (
    cdi_device_name,
    check_kind,
    device_name_problem,
    kind_problem,
    parse_qualified_name,
    qualified_name,
    qualified_name_problem,
    spec_file_name,
)

DEVICE_RULE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@pytest.mark.parametrize(
    "kind",
    ["example.com/fpga", "nvidia.com/gpu", "ab/cd", "vendor_1.x-y/class.v2", "Intel.com/QAT", "x-y.z/net_dev-1"],
)
def test_valid_kinds(kind: str) -> None:
    assert kind_problem(kind) is None
    assert check_kind(kind) == kind


@pytest.mark.parametrize(
    "kind",
    [
        "fpga",  # no vendor
        "example.com/",  # empty class
        "/fpga",  # empty vendor
        "example.com/fpga/x",  # two slashes
        "1example.com/fpga",  # vendor starts with a digit
        "example.com/1fpga",  # class starts with a digit
        "example.com-/fpga",  # vendor ends with '-'
        "example.com/fpga.",  # class ends with '.'
        "exa mple.com/fpga",  # space
        "example.com/fp:ga",  # ':' is for device names only
        "example.com/../x",
        "a/fpga",  # one character: valid CDI, but podman 4.3 panics on it
        "example.com/x",
    ],
)
def test_invalid_kinds(kind: str) -> None:
    assert kind_problem(kind)
    with pytest.raises(CdiNameError, match=re.escape(repr(kind))):
        check_kind(kind)


@pytest.mark.parametrize("name", ["fpga-0", "0000:3b:00.1", "GPU-8f1c2a3b-aaaa", "a", "7", "x_y.z:w-1"])
def test_valid_device_names_are_kept(name: str) -> None:
    assert device_name_problem(name) is None
    assert cdi_device_name(name) == name


@pytest.mark.parametrize("name", ["", "-a", "a-", ":a", "a:", ".", "..", "a/b", "../etc", "a b", "ä", "a\n"])
def test_invalid_device_names(name: str) -> None:
    assert device_name_problem(name)


@pytest.mark.parametrize("device_id", ["..", ".", "../../etc/passwd", "/", "a/b", "", " ", "-x-", "é", "x\x00y", "a b"])
def test_bad_ids_map_to_safe_valid_names(device_id: str) -> None:
    name = cdi_device_name(device_id)
    assert DEVICE_RULE.fullmatch(name), name
    assert "/" not in name and name not in (".", "..")
    assert cdi_device_name(device_id) == name  # deterministic


def test_mapping_keeps_the_readable_part() -> None:
    assert cdi_device_name("pci/0000:3b:00.1").startswith("pci_0000:3b:00.1-")


def test_similar_bad_ids_do_not_collide() -> None:
    ids = ["a/b", "a b", "a\tb", "a_b/", "/a_b", "a//b", "a%b"]
    names = [cdi_device_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert "a_b" not in names  # a mapped name never equals the valid ID it resembles


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_id_maps_to_a_valid_name(device_id: str) -> None:
    name = cdi_device_name(device_id)
    assert DEVICE_RULE.fullmatch(name)
    assert "/" not in name and name != ".."
    assert cdi_device_name(device_id) == name


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=12), unique=True, min_size=2, max_size=30))
def test_distinct_ids_get_distinct_names(ids: list[str]) -> None:
    assert len({cdi_device_name(i) for i in ids}) == len(ids)


def test_qualified_names() -> None:
    assert qualified_name("example.com/fpga", "fpga-0") == "example.com/fpga=fpga-0"
    assert parse_qualified_name("example.com/fpga=0000:3b:00.1") == ("example.com/fpga", "0000:3b:00.1")
    assert qualified_name_problem("example.com/fpga") is not None
    assert qualified_name_problem("example.com/fpga=") is not None
    with pytest.raises(CdiNameError):
        qualified_name("example.com/fpga", "../x")
    with pytest.raises(CdiNameError):
        qualified_name("fpga", "fpga-0")
    with pytest.raises(CdiNameError):
        parse_qualified_name("example.com/fpga=a/b")


def test_spec_file_names() -> None:
    assert spec_file_name("example.com/fpga") == "cdiplug-example.com-fpga.json"
    assert spec_file_name("nvidia.com/gpu") == "cdiplug-nvidia.com-gpu.json"
    for bad in ("../x/y", "a/../b", "a/b/c", "/etc", "a/"):
        with pytest.raises(CdiNameError):
            spec_file_name(bad)
