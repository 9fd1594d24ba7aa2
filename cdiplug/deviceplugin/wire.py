"""Request deserializers for the DevicePlugin service that never fail: what protobuf refuses becomes
:class:`Undecodable`, which the RPC answers with INVALID_ARGUMENT naming the field.

grpc's own handling of a request that does not parse (a device ID that is not valid UTF-8 in a
``string`` field, a truncated message) is an INTERNAL status without a word. :func:`lenient` wraps
a message type's ``FromString``: the good path is that one call; only on failure is the wire
format walked (:func:`_bad_string`) to say which field, at which index, holds bytes that are not
UTF-8. :func:`add_servicer` registers the service with these deserializers. The boundary: bytes to
messages; status codes are ``cdiplug.deviceplugin.server``'s.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from ..api import deviceplugin_v1beta1_pb2 as pb
from ..api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from ..brief import brief


class Undecodable:
    """A request that protobuf refused to parse; the RPC answers INVALID_ARGUMENT with :attr:`reason`."""

    __slots__ = ("reason",)

    def __init__(self, message_type: type[Message], data: bytes) -> None:
        name = message_type.DESCRIPTOR.name
        found = _bad_string(message_type.DESCRIPTOR, data, "")
        self.reason = f"cannot parse {name} ({len(data):,} bytes): " + (found or "not a valid protobuf message")


def lenient(message_type: type[Message]) -> Any:
    """A request deserializer that answers :class:`Undecodable` instead of raising."""
    parse = message_type.FromString

    def deserialize(data: bytes) -> Message | Undecodable:
        try:
            return parse(data)
        except DecodeError:
            return Undecodable(message_type, data)

    return deserialize


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]  # IndexError past the end: a truncated message
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _bad_string(descriptor: Descriptor, data: bytes, where: str) -> str | None:
    """Where a string field of ``data`` is not valid UTF-8 (``field[i]``), walking the wire format."""
    counts: dict[int, int] = {}
    pos = 0
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            elif wire == 2:
                length, pos = _varint(data, pos)
                chunk, pos = data[pos : pos + length], pos + length
                field = descriptor.fields_by_number.get(number)
                if field is None:
                    continue
                index = counts[number] = counts.get(number, -1) + 1
                name = f"{where}{field.name}[{index}]" if _repeated(field) else f"{where}{field.name}"
                if field.type == FieldDescriptor.TYPE_STRING:
                    try:
                        chunk.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        return f"{name} is not valid UTF-8 ({exc.reason} at byte {exc.start}): {brief(chunk)}"
                elif field.type == FieldDescriptor.TYPE_MESSAGE:
                    found = _bad_string(field.message_type, chunk, name + ".")
                    if found:
                        return found
            else:
                return None
    except IndexError:
        return None
    return None


def _repeated(field: FieldDescriptor) -> bool:
    is_repeated = getattr(field, "is_repeated", None)  # protobuf >= 6.31; label is deprecated
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def add_servicer(servicer: pb_grpc.DevicePluginServicer, server: grpc.aio.Server) -> None:
    """``add_DevicePluginServicer_to_server`` with :func:`lenient` request deserializers."""
    handlers = {
        "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
            servicer.GetDevicePluginOptions,
            request_deserializer=lenient(pb.Empty),
            response_serializer=pb.DevicePluginOptions.SerializeToString,
        ),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            servicer.ListAndWatch,
            request_deserializer=lenient(pb.Empty),
            response_serializer=pb.ListAndWatchResponse.SerializeToString,
        ),
        "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
            servicer.GetPreferredAllocation,
            request_deserializer=lenient(pb.PreferredAllocationRequest),
            response_serializer=pb.PreferredAllocationResponse.SerializeToString,
        ),
        "Allocate": grpc.unary_unary_rpc_method_handler(
            servicer.Allocate,
            request_deserializer=lenient(pb.AllocateRequest),
            response_serializer=pb.AllocateResponse.SerializeToString,
        ),
        "PreStartContainer": grpc.unary_unary_rpc_method_handler(
            servicer.PreStartContainer,
            request_deserializer=lenient(pb.PreStartContainerRequest),
            response_serializer=pb.PreStartContainerResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


SERVICE = "v1beta1.DevicePlugin"
