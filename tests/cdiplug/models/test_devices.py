"""The device model (cdiplug.models.devices): value semantics, conversions, indexing and edit merging.

Pure values, no I/O: what backends, the allocator and the CDI writer rely on.
"""

from __future__ import annotations

import attrs
import pytest

from cdiplug.models.devices import (
    DEFAULT_ALLOCATE,
    AllocatePart,
    ContainerAllocation,
    ContainerEdits,
    Device,
    DeviceNode,
    DeviceSnapshot,
    Health,
    Hook,
    Mount,
    PreferredRequest,
)


def test_health_and_parts_spell_as_the_wire_and_config_do():
    assert [h.value for h in Health] == ["Healthy", "Unhealthy"]
    assert {p.value for p in AllocatePart} == {"cdi-cri", "device-specs", "envvar", "cdi-annotations", "mounts"}
    assert DEFAULT_ALLOCATE == frozenset(AllocatePart) - {AllocatePart.CDI_ANNOTATIONS}


def test_device_defaults_and_numa_normalised():
    d = Device("x", numa_nodes=[3, 1, 3])
    assert d.numa_nodes == (1, 3)
    assert Device("y").numa_nodes == ()  # unknown stays unknown, never a made-up 0
    assert d.healthy and not Device("z", health=Health.UNHEALTHY).healthy
    assert d.prepare_group is None and d.edits.is_empty()


def test_device_attributes_take_part_in_equality():
    a = Device("x", attributes={"driver": "ixgbevf"})
    assert a.attribute("driver") == "ixgbevf" and a.attribute("nope", "-") == "-"
    assert a == Device("x", attributes=[("driver", "ixgbevf")])
    assert a != Device("x", attributes={"driver": "vfio-pci"})
    assert hash(a) == hash(Device("x", attributes={"driver": "ixgbevf"}))


def test_values_are_frozen():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Device("x").id = "y"  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        DeviceSnapshot("a/b").devices = ()  # type: ignore[misc]


def test_edits_convert_env_and_sequences():
    e = ContainerEdits(env={"A": 1}, device_nodes=[DeviceNode("/dev/a")], mounts=[Mount("/h", "/c", options=["ro"])])
    assert e.env == (("A", "1"),)
    assert isinstance(e.device_nodes, tuple) and e.mounts[0].options == ("ro",)
    assert not e.is_empty() and ContainerEdits().is_empty()
    assert ContainerEdits(additional_gids=[5]).is_empty() is False
    assert ContainerEdits(hooks=[Hook("createContainer", "/bin/true", args=["true"])]).hooks[0].args == ("true",)


def test_device_node_source():
    assert DeviceNode("/dev/vfio/3").source == "/dev/vfio/3"
    assert DeviceNode("/dev/vfio/3", host_path="/host/dev/vfio/3").source == "/host/dev/vfio/3"
    assert DeviceNode("/dev/x").permissions == "rw"


def test_merge_later_env_wins_and_duplicates_kept_once():
    hook = Hook("createContainer", "/bin/hook")
    a = ContainerEdits(
        env={"A": "1", "B": "1"},
        device_nodes=[DeviceNode("/dev/vfio/vfio"), DeviceNode("/dev/vfio/1")],
        mounts=[Mount("/h1", "/c")],
        hooks=[hook],
        additional_gids=[10, 11],
    )
    b = ContainerEdits(
        env={"B": "2", "C": "2"},
        device_nodes=[DeviceNode("/dev/vfio/vfio", permissions="r"), DeviceNode("/dev/vfio/2")],
        mounts=[Mount("/h2", "/c"), Mount("/h3", "/d")],
        hooks=[hook],
        additional_gids=[11, 12],
    )
    m = a.merge(b)
    assert dict(m.env) == {"A": "1", "B": "2", "C": "2"}
    assert [(n.path, n.permissions) for n in m.device_nodes] == [
        ("/dev/vfio/vfio", "rw"),
        ("/dev/vfio/1", "rw"),
        ("/dev/vfio/2", "rw"),
    ]
    assert [(x.host_path, x.container_path) for x in m.mounts] == [("/h1", "/c"), ("/h3", "/d")]
    assert m.hooks == (hook,) and m.additional_gids == (10, 11, 12)


def test_combine_is_merge_repeated_in_one_pass():
    a = ContainerEdits(env={"A": "1"}, device_nodes=[DeviceNode("/dev/x")], additional_gids=[5])
    b = ContainerEdits(env={"A": "2"}, device_nodes=[DeviceNode("/dev/x", permissions="r"), DeviceNode("/dev/y")])
    c = ContainerEdits(env={"B": "3"}, mounts=[Mount("/h", "/c"), Mount("/h2", "/c")], additional_gids=[5, 6])
    combined = ContainerEdits.combine([a, b, c])
    assert combined == a.merge(b).merge(c)
    assert dict(combined.env) == {"A": "2", "B": "3"}
    assert [(n.path, n.permissions) for n in combined.device_nodes] == [("/dev/x", "rw"), ("/dev/y", "rw")]
    assert [m.host_path for m in combined.mounts] == ["/h"] and combined.additional_gids == (5, 6)
    assert ContainerEdits.combine([]) == ContainerEdits()


def test_snapshot_sorts_indexes_and_refuses_duplicates():
    s = DeviceSnapshot("example.com/fpga", [Device("b"), Device("a", health=Health.UNHEALTHY), Device("c")])
    assert s.ids == ("a", "b", "c")
    assert s.get("b") == Device("b") and s.get("zz") is None
    assert "a" in s and "zz" not in s
    assert s.healthy_count() == 2
    with pytest.raises(ValueError, match="example.com/fpga: duplicate device IDs a, b"):
        DeviceSnapshot("example.com/fpga", [Device("a"), Device("b"), Device("a"), Device("b"), Device("c")])


def test_snapshot_equality_ignores_skipped_and_order():
    a = DeviceSnapshot("r/x", [Device("1"), Device("2")], skipped={"0000:00:01.0": "no driver"})
    b = DeviceSnapshot("r/x", [Device("2"), Device("1")])
    assert a == b and hash(a) == hash(b)
    assert a.skipped == (("0000:00:01.0", "no driver"),)
    assert a != DeviceSnapshot("r/x", [Device("1"), Device("2", health=Health.UNHEALTHY)])
    assert a != attrs.evolve(b, ids_env="X")


def test_with_devices_keeps_the_rest():
    s = DeviceSnapshot("r/x", [Device("1")], common_edits=ContainerEdits(env={"K": "v"}), ids_env="IDS")
    t = s.with_devices([Device("9"), Device("8")])
    assert t.ids == ("8", "9") and t.common_edits == s.common_edits and t.ids_env == "IDS"
    assert t.get("8") is not None and s.get("8") is None


def test_requests_and_answers_convert_to_tuples():
    r = PreferredRequest(["a", "b"], ["a"], 2)
    assert r.available == ("a", "b") and r.must_include == ("a",)
    assert PreferredRequest(["a"]).must_include == () and PreferredRequest(["a"]).size == 0
    c = ContainerAllocation(["a"], env={"X": "1"}, annotations={"k": "v"})
    assert c.device_ids == ("a",) and c.env == (("X", "1"),) and c.annotations == (("k", "v"),)
    assert c.device_specs == c.mounts == c.cdi_devices == ()
