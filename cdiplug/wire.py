"""Requests that protobuf refuses to parse, turned into a value a gRPC edge can answer.

grpc's default deserializer raises on a request it cannot parse (a ``string`` field that is not
valid UTF-8, say), and the caller then sees an opaque INTERNAL. :func:`lenient` deserializers
answer an :class:`Undecodable` instead, whose :attr:`~Undecodable.reason` names the message, its
size and the first field that is not valid UTF-8 (found by walking the wire format), so the RPC
can answer INVALID_ARGUMENT. Used by every gRPC edge (device plugin, DRA); no gRPC here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from .brief import brief


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
