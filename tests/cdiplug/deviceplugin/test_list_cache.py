"""cdiplug.deviceplugin.messages.ListCache: the ListAndWatch list built where devices changed only.

The serialized list must be exactly what protobuf makes of the whole message, and a change of
one device must build one device's entry, whatever the number of devices (counted, not timed).
"""

from __future__ import annotations

import attrs

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.deviceplugin.messages import ListCache, list_message
from cdiplug.models.devices import Device, DeviceSnapshot, Health


def snapshot(count: int, unhealthy: frozenset[int] = frozenset()) -> DeviceSnapshot:
    devices = [
        Device(f"d-{i}", Health.UNHEALTHY if i in unhealthy else Health.HEALTHY, numa_nodes=(i % 3,) if i % 5 else ())
        for i in range(count)
    ]
    return DeviceSnapshot(resource="example.com/d", devices=devices)


def test_bytes_equal_the_whole_message_serialized() -> None:
    for count in (0, 1, 7, 300):  # 300 devices: entries and lengths over 127 bytes in total
        snap = snapshot(count, frozenset({2, 5}))
        data = ListCache().serialize(snap)
        assert pb.ListAndWatchResponse.FromString(data) == list_message(snap)
        assert data == list_message(snap).SerializeToString()


def test_a_long_id_gets_a_multi_byte_length() -> None:
    snap = DeviceSnapshot(resource="example.com/d", devices=[Device("x" * 300, numa_nodes=(1,))])
    assert pb.ListAndWatchResponse.FromString(ListCache().serialize(snap)) == list_message(snap)


def test_a_health_change_builds_only_the_changed_entry() -> None:
    cache = ListCache()
    first = snapshot(4096)
    cache.serialize(first)
    assert cache.built == 4096
    one_down = first.with_devices(attrs.evolve(d, health=Health.UNHEALTHY) if d.id == "d-77" else d for d in first.devices)
    data = cache.serialize(one_down)
    assert cache.built == 4097
    assert pb.ListAndWatchResponse.FromString(data) == list_message(one_down)
    cache.serialize(first)  # back up: equal new objects are not rebuilt either
    assert cache.built == 4098


def test_removed_devices_are_forgotten_and_new_ones_built() -> None:
    cache = ListCache()
    cache.serialize(snapshot(10))
    data = cache.serialize(snapshot(5))
    assert cache.built == 10
    assert pb.ListAndWatchResponse.FromString(data) == list_message(snapshot(5))
    cache.serialize(snapshot(6))
    assert cache.built == 11
