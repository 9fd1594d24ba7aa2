"""Decoding our own state files with cattrs: strict where a value decides what is done, lenient elsewhere.

State is ours, written by this or another cdiplug (older, newer), and read back after a crash. A
record is a frozen attrs class; :func:`converter` makes the cattrs converter that reads it:

- unknown keys are ignored (a newer cdiplug may add some), missing ones with a default take it;
- scalars are exact: a string must be a string, a bool a bool, a list a list (no ``str(7)``, no
  ``bool("no")``, no string read as a list of characters); an enum names one of its values;
- a field marked :func:`lenient` (``attrs.field(default=…, metadata=lenient(check))``) takes its
  default when its value is of the wrong kind or fails ``check``, and is left out when written at
  its default (:func:`without_lenient_defaults`), so a record stays as an earlier cdiplug wrote it;
- a field marked :func:`absent` reads as the value given there when missing (for a field that
  cannot have a default: one before those with);
- a field marked :func:`checked` fails the record when its value fails the check.

:func:`structure` turns what cattrs found wrong into one message naming the place:
``claims['u1'].devices[0].pool must be a string, got 7``. Adding a field to a record is one edit:
the field, with its default and its mark.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory
from cattrs.gen import make_dict_structure_fn, override

from cdiplug.toolkit.brief import brief

T = TypeVar("T")

_LENIENT = "cdiplug.state.lenient"
_CHECKED = "cdiplug.state.checked"
_ABSENT = "cdiplug.state.absent"


def lenient(check: Callable[[Any], bool] = lambda value: True) -> dict[str, Any]:
    """Field metadata: a value of the wrong kind, or failing ``check``, reads as the field's default."""
    return {_LENIENT: check}


def absent(value: Any) -> dict[str, Any]:
    """Field metadata: a field without a default of its own (one before those with) reads as if the
    file had ``value`` (as JSON has it: ``[]``, not ``()``) when missing."""
    return {_ABSENT: value}


def checked(check: Callable[[Any], bool], why: str) -> dict[str, Any]:
    """Field metadata: a value failing ``check`` makes the record unusable, ``why`` saying what it must be."""
    return {_CHECKED: (check, why)}


def _exact(kind: type, name: str) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _: Any) -> Any:
        if type(value) is not kind:
            raise ValueError(f"must be {name}, got {brief(value)}")
        return value

    return hook


def _enum(value: Any, cl: type[enum.Enum]) -> enum.Enum:
    try:
        return cl(value)
    except ValueError:
        names = " or ".join(str(m.value) for m in cl)
        raise ValueError(f"must be {names}, got {brief(value)}") from None


def _string(value: Any, cl: type[Any]) -> Any:
    if issubclass(cl, enum.Enum):  # a string enum: its MRO finds str first
        return _enum(value, cl)
    if type(value) is not str:
        raise ValueError(f"must be a string, got {brief(value)}")
    return value


def _is_list_tuple(t: Any) -> bool:
    args = typing.get_args(t)
    return typing.get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis


def _is_optional_str(t: Any) -> bool:
    return bool(t == (str | None))  # typing.Optional[str] compares equal too


def _is_mapping(t: Any) -> bool:
    origin: Any = typing.get_origin(t)
    return origin in (Mapping, dict)


def converter() -> cattrs.Converter:
    """A converter for state records (see the module docstring)."""
    conv = cattrs.Converter(forbid_extra_keys=False, detailed_validation=True)
    conv.register_structure_hook(str, _string)
    conv.register_structure_hook(bool, _exact(bool, "true or false"))

    def optional_str(value: Any, _: Any) -> str | None:
        if value is not None and type(value) is not str:
            raise ValueError(f"must be a string or null, got {brief(value)}")
        return value

    conv.register_structure_hook_func(_is_optional_str, optional_str)

    def mapping(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping")
        return value

    conv.register_structure_hook_func(_is_mapping, mapping)

    conv.register_structure_hook(enum.Enum, _enum)

    def list_factory(cl: Any) -> Callable[[Any, Any], Any]:
        base = homogenous_tuple_structure_factory(cl, conv)
        kind = "a list of strings" if typing.get_args(cl)[0] is str else "a list"

        def hook(value: Any, _: Any) -> Any:
            if not isinstance(value, list):
                raise ValueError(f"must be {kind}")
            return base(value, _)

        return hook

    conv.register_structure_hook_factory(_is_list_tuple, list_factory)
    conv.register_structure_hook_factory(attrs.has, lambda cl: _record_hook(conv, cl))
    return conv


def _record_hook(conv: cattrs.Converter, cl: type[Any]) -> Callable[[Any, Any], Any]:
    attrs.resolve_types(cl)
    overrides = {}
    for a in attrs.fields(cl):
        if _LENIENT in a.metadata:
            overrides[a.name] = override(struct_hook=_lenient_hook(conv, a.type, a.default, a.metadata[_LENIENT]))
        elif _CHECKED in a.metadata:
            overrides[a.name] = override(struct_hook=_checked_hook(conv, a.type, *a.metadata[_CHECKED]))
    build = make_dict_structure_fn(cl, conv, **overrides)  # type: ignore[arg-type]
    missing = {a.name: a.metadata[_ABSENT] for a in attrs.fields(cl) if _ABSENT in a.metadata}

    def hook(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping")
        return build({**missing, **value} if missing else value, cl)

    return hook


def _lenient_hook(conv: cattrs.Converter, t: Any, default: Any, check: Callable[[Any], bool]) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _: Any) -> Any:
        try:
            got = conv.structure(value, t)
        except (ValueError, TypeError, cattrs.BaseValidationError):
            return default
        return got if check(got) else default

    return hook


def _checked_hook(conv: cattrs.Converter, t: Any, check: Callable[[Any], bool], why: str) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _: Any) -> Any:
        got = conv.structure(value, t)
        if not check(got):
            raise ValueError(why)
        return got

    return hook


def _why(exc: BaseException, _type: type | None) -> str:
    if isinstance(exc, KeyError):
        return "is missing"
    if isinstance(exc, ValueError) and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return cattrs.v.format_exception(exc, _type)


def structure(conv: cattrs.Converter, data: Any, cl: type[T], where: str) -> T:
    """``data`` as a ``cl``; ValueError naming every place found wrong, below ``where``."""
    try:
        return conv.structure(data, cl)
    except cattrs.BaseValidationError as exc:
        found = [e.rpartition(" @ ") for e in cattrs.transform_error(exc, path=where, format_exception=_why)]
        raise ValueError("; ".join(f"{path} {message}" for message, _, path in found)) from None
    except ValueError as exc:
        raise ValueError(f"{where} {exc}") from None


def without_lenient_defaults(data: dict[str, Any], cl: type[Any]) -> dict[str, Any]:
    """``data`` (an unstructured ``cl``) without its lenient fields that hold their defaults."""
    defaults = {a.name: a.default for a in attrs.fields(cl) if _LENIENT in a.metadata}
    return {k: v for k, v in data.items() if k not in defaults or _plain(v) != _plain(defaults[k])}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
