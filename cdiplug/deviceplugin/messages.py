"""The device-plugin API's messages, built from the model: protobuf at this edge only.

:func:`device_message`, :func:`list_message` and :func:`allocation_message` build the protobuf of
one device, a whole list and one container's answer. :class:`ListCache` and :class:`AnswerCache`
keep their serialized wire form so that a change costs work only where devices (or answers)
changed; :func:`serialize_passthrough` is the gRPC serializer that sends such bytes as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api import deviceplugin_v1beta1_pb2 as pb
from ..model import ContainerAllocation, Device, DeviceSnapshot, Health


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


class AnswerCache:
    """Serialized ``ContainerAllocateResponse`` entries of the allocator's answers, by answer.

    The allocator hands out the same :class:`ContainerAllocation` object for a repeated request
    (per snapshot); its entry in an ``AllocateResponse`` (field 1, as for the list) is built once.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._entries: dict[int, tuple[ContainerAllocation, bytes]] = {}
        self._limit = limit
        self.built = 0

    def serialize(self, answers: Sequence[ContainerAllocation]) -> bytes:
        parts = []
        for answer in answers:
            entry = self._entries.get(id(answer))
            if entry is None or entry[0] is not answer:
                if len(self._entries) >= self._limit:
                    self._entries.clear()
                entry = self._entries[id(answer)] = (answer, _entry(allocation_message(answer).SerializeToString()))
                self.built += 1
            parts.append(entry[1])
        return b"".join(parts)


def serialize_passthrough(message: Any) -> bytes:
    """The serializer of ListAndWatch and Allocate: what :class:`ListCache` or :class:`AnswerCache`
    serialized passes as it is."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def allocation_message(a: ContainerAllocation) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(a.env),
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only) for m in a.mounts],
        devices=[pb.DeviceSpec(container_path=d.path, host_path=d.source, permissions=d.permissions) for d in a.device_specs],
        annotations=dict(a.annotations),
        cdi_devices=[pb.CDIDevice(name=n) for n in a.cdi_devices],
    )
