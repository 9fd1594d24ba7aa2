"""The device-plugin API's messages, built from the model: protobuf at this edge only.

:func:`device_message`, :func:`list_message`, :func:`allocation_message` and
:func:`allocate_response` build the protobuf of one device, a whole list, one container's answer
and an Allocate's answer. :class:`ListCache` keeps the list's serialized wire form so that a
health change costs work only where devices changed: kept because ``bench/bench_scale.py`` shows
it (building and serializing 4,096 devices afresh takes about 20 ms of the 50 ms a health change
may take there; the cache, under 1 ms); :func:`serialize_passthrough` is the gRPC serializer that
sends those bytes as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.models.devices import ContainerAllocation, Device, DeviceSnapshot, Health


def device_message(device: Device) -> pb.Device:
    """One advertised device; no topology field when the NUMA nodes are unknown."""
    if device.numa_nodes:
        return pb.Device(
            ID=device.id,
            health=device.health.value,
            topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in device.numa_nodes]),
        )
    return pb.Device(ID=device.id, health=device.health.value)


def list_message(snapshot: DeviceSnapshot) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[device_message(d) for d in snapshot.devices])


class ListCache:
    """The serialized ListAndWatchResponse of a snapshot, rebuilt only where devices changed.

    The response is ``repeated Device devices = 1``, so its wire form is each device's field 1
    entry (tag, length, the ``pb.Device`` bytes) one after another. Entries are kept by device
    ID with the health and NUMA nodes they were built from; a new list costs a lookup per device
    and one ``bytes.join``, and protobuf is built only for devices whose entry changed
    (:attr:`built` counts them). The whole message is still built once per change, shared by
    every stream.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Health, tuple[int, ...], bytes]] = {}
        self.built = 0

    def serialize(self, snapshot: DeviceSnapshot) -> bytes:
        old = self._entries
        new: dict[str, tuple[Health, tuple[int, ...], bytes]] = {}
        for device in snapshot.devices:
            health = device.health
            entry = old.get(device.id)
            if entry is None or entry[0] is not health or entry[1] != device.numa_nodes:
                entry = (health, device.numa_nodes, _entry(device_message(device).SerializeToString()))
                self.built += 1
            new[device.id] = entry
        self._entries = new
        return b"".join([e[2] for e in new.values()])


def _entry(data: bytes) -> bytes:
    """Field 1, length-delimited: tag 0x0a, the length as a varint, the bytes."""
    size = len(data)
    head = bytearray(b"\x0a")
    while size > 0x7F:
        head.append(size & 0x7F | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + data


def serialize_passthrough(message: Any) -> bytes:
    """The serializer of ListAndWatch: what :class:`ListCache` serialized passes as it is."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def allocation_message(a: ContainerAllocation) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(a.env),
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only) for m in a.mounts],
        devices=[pb.DeviceSpec(container_path=d.path, host_path=d.source, permissions=d.permissions) for d in a.device_specs],
        annotations=dict(a.annotations),
        cdi_devices=[pb.CDIDevice(name=n) for n in a.cdi_devices],
    )


def allocate_response(answers: Sequence[ContainerAllocation]) -> pb.AllocateResponse:
    return pb.AllocateResponse(container_responses=[allocation_message(a) for a in answers])
