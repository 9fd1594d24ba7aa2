"""CDI annotations (``cdiplug.cdi.annotations``): keys ``cdi.k8s.io/<plugin>_<id>`` valid by the
63-character rules of the reference library's ``annotations.Key``, deterministic and distinct;
values the comma-joined qualified names. Pure functions."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdiplug.cdi.annotations import MAX_NAME_LENGTH, PREFIX, annotation_key, annotations, key_name
from cdiplug.errors import CdiNameError

# What the reference library (and Kubernetes annotation keys) accept after the prefix.
KEY_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")


def test_valid_keys_are_what_the_reference_library_makes() -> None:
    assert annotation_key("example.com-fpga", "fpga-0") == "cdi.k8s.io/example.com-fpga_fpga-0"
    # The reference maps '/' to '_' and keeps the rest.
    assert key_name("vendor.gpu", "a/b") == "vendor.gpu_a_b"


@pytest.mark.parametrize(
    "device_id",
    ["0000:3b:00.1", "GPU-" + "8f1c2a3b" * 8, "x" * 70, "-leading", "trailing-", "a b", "ü", "a:b/c.d"],
)
def test_bad_or_long_ids_are_mapped_within_the_rules(device_id: str) -> None:
    name = key_name("example.com-fpga", device_id)
    assert len(name) <= MAX_NAME_LENGTH
    assert KEY_NAME.fullmatch(name), name
    assert key_name("example.com-fpga", device_id) == name


def test_mapped_keys_differ_for_different_ids() -> None:
    a = key_name("p", "0000:3b:00.1")
    b = key_name("p", "0000_3b_00.1")  # valid, used as is
    c = key_name("p", "0000:3b:00:1")
    assert len({a, b, c}) == 3
    long_a, long_b = key_name("p", "x" * 80 + "1"), key_name("p", "x" * 80 + "2")
    assert long_a != long_b


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=120))
def test_any_plugin_and_id_give_a_valid_key(plugin: str, device_id: str) -> None:
    name = key_name(plugin, device_id)
    assert len(name) <= MAX_NAME_LENGTH and KEY_NAME.fullmatch(name)


def test_annotations_value() -> None:
    names = ["example.com/fpga=fpga-0", "example.com/fpga=fpga-1"]
    assert annotations("example.com-fpga", "fpga-0", names) == {
        PREFIX + "example.com-fpga_fpga-0": "example.com/fpga=fpga-0,example.com/fpga=fpga-1"
    }


@pytest.mark.parametrize(
    ("plugin", "device_id", "names"),
    [("", "x", ["a.com/b=c"]), ("p", "", ["a.com/b=c"]), ("p", "x", []), ("p", "x", ["fpga-0"]), ("p", "x", ["a.com/b=c,d"])],
)
def test_bad_input_is_refused(plugin: str, device_id: str, names: list[str]) -> None:
    with pytest.raises(CdiNameError):
        annotations(plugin, device_id, names)
