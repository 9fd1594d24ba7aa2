"""What every gRPC edge (device plugin, DRA) shares: lenient handler tables and the status codes.

grpc's default deserializer raises on a request it cannot parse (a ``string`` field that is not
valid UTF-8, say), and the caller then sees an opaque INTERNAL. :func:`lenient` deserializers
answer an :class:`Undecodable` instead, whose :attr:`~Undecodable.reason` names the message, its
size and the first field that is not valid UTF-8 (found by walking the wire format), so the RPC
can answer INVALID_ARGUMENT. :func:`add_lenient_service` builds a service's handler table from
:class:`Rpc` rows with such deserializers (what the generated ``add_*Servicer_to_server`` does,
but lenient).

:func:`status_for` is the one place a gRPC status code is chosen for one of our errors; the edges
abort with it (an edge that answers per item, as DRA's per-claim ``error`` strings, uses it only
for what fails the whole call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc
import grpc.aio
from attrs import frozen
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from cdiplug.errors import DeviceUnavailable, InvalidRequest, PreparationError
from cdiplug.toolkit.brief import brief


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code for an error raised behind an RPC (the only place codes are chosen)."""
    if isinstance(exc, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, (DeviceUnavailable, PreparationError)):  # DeviceInUse is a PreparationError
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL  # CdiError and anything else: our fault, not the caller's


@frozen
class Rpc:
    """One method of a service: its handler, its request type (parsed leniently) and how its
    answer is serialized (``SerializeToString`` of the response type, usually); ``stream`` for
    a unary-stream method."""

    handler: Callable[..., Any]
    request: type[Message]
    serialize: Callable[[Any], bytes]
    stream: bool = False


def add_lenient_service(server: grpc.aio.Server, service: str, rpcs: Mapping[str, Rpc]) -> None:
    """Serve ``service`` (its full name) on ``server`` with ``rpcs``, each request parsed by :func:`lenient`."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for name, rpc in rpcs.items():
        build = grpc.unary_stream_rpc_method_handler if rpc.stream else grpc.unary_unary_rpc_method_handler
        handlers[name] = build(rpc.handler, request_deserializer=lenient(rpc.request), response_serializer=rpc.serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


class Undecodable:
    """A request that protobuf refused to parse; the RPC answers INVALID_ARGUMENT with :attr:`reason`."""

    __slots__ = ("reason",)

    def __init__(self, message_type: type[Message], data: bytes) -> None:
        name = message_type.DESCRIPTOR.name
        found = _bad_string(message_type.DESCRIPTOR, data, "")
        self.reason = f"cannot parse {name} ({len(data):,} bytes): " + (found or "not a valid protobuf message")


def lenient(message_type: type[Message]) -> Callable[[bytes], Message | Undecodable]:
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


def _bad_string(descriptor: Any, data: bytes, where: str) -> str | None:
    # ``descriptor``: protobuf's Descriptor, the pure-Python or the upb one (they share no type).
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
    label: int = getattr(field, "label")  # noqa: B009 - deprecated, absent from newer stubs
    return label == FieldDescriptor.LABEL_REPEATED
