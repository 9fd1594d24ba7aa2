"""The strict converter of configuration files: one cattrs converter for every class a file is read into.

Unknown keys are errors, scalars are not coerced (``count: "2"`` is an error, not 2), a list is
only a list (never a string's characters or a mapping's keys), an enum is read from its values,
and a mapping is required where a class is: each error says so in words, and :func:`config_error`
makes the first of them a :class:`~cdiplug.errors.ConfigError` naming the field path and the
file (``expected an integer, got str '2' @ $.resources[1].options.count``). The configuration
(:mod:`cdiplug.config`), the front ends' settings and the backends' options all go through it.
"""

from __future__ import annotations

import collections.abc
import enum
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
import cattrs.cols
import cattrs.gen

from cdiplug.errors import ConfigError

converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)


def describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _strict(kind: type | tuple[type, ...], label: str) -> Any:
    def hook(value: Any, _type: Any) -> Any:
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise ValueError(f"expected {label}, got a boolean")
        if not isinstance(value, kind):
            raise ValueError(f"expected {label}, got {describe(value)}{number_hint(value) if label == 'a string' else ''}")
        return value

    return hook


def number_hint(value: Any) -> str:
    """Why a string field got a number: YAML reads an unquoted ``0x8086`` as 32902."""
    if type(value) is not int or value < 10:  # below 10, a hex ID and its number read alike
        return ""
    return f' (YAML reads an unquoted 0x{value:04x} as the number {value}: quote it, "0x{value:04x}")'


def _is_list_type(t: Any) -> bool:
    origin = typing.get_origin(t)
    if origin is tuple:
        args = typing.get_args(t)
        return len(args) == 2 and args[1] is Ellipsis
    return origin in (list, collections.abc.Sequence, frozenset)


def _list_hook(t: Any) -> Any:
    """Lists only: cattrs alone would take a string as a list of characters, a mapping as its keys.
    A frozenset is written as a list."""
    origin = typing.get_origin(t)
    if origin is tuple:
        inner = cattrs.cols.homogenous_tuple_structure_factory(t, converter)
    elif origin is frozenset:
        as_list_type: Any = list[typing.get_args(t)[0]]  # type: ignore[misc]
        as_list = cattrs.cols.list_structure_factory(as_list_type, converter)

        def inner(value: Any, type_: Any) -> Any:
            return frozenset(as_list(value, type_))

    else:
        inner = cattrs.cols.list_structure_factory(t, converter)

    def hook(value: Any, type_: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, got {describe(value)}")
        return inner(value, type_)

    return hook


def _attrs_hook(cl: type[object]) -> Any:
    """Mappings only, so that ``resources: [5]`` says so instead of cattrs' internal wording."""
    inner = cattrs.gen.make_dict_structure_fn(cl, converter)

    def hook(value: Any, type_: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a mapping, got {describe(value)}")
        return inner(value, type_)

    return hook


converter.register_structure_hook_factory(_is_list_type, _list_hook)
converter.register_structure_hook_factory(attrs.has, _attrs_hook)


def _enum_hook(cls: type[enum.Enum]) -> Any:
    """Every enum from its values only, naming them in the error."""

    def hook(value: Any, _type: Any) -> enum.Enum:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"expected one of {allowed}, got {value!r}") from None

    return hook


def _or_enum(hook: Any) -> Any:
    """``hook``, except for an enum of that base type (a str or int enum comes here: cattrs
    dispatches by class), which is structured from its values."""

    def structure(value: Any, type_: Any) -> Any:
        if isinstance(type_, type) and issubclass(type_, enum.Enum):
            return _enum_hook(type_)(value, type_)
        return hook(value, type_)

    return structure


converter.register_structure_hook(int, _or_enum(_strict(int, "an integer")))
converter.register_structure_hook(str, _or_enum(_strict(str, "a string")))
converter.register_structure_hook(bool, _strict(bool, "true or false"))
converter.register_structure_hook(float, lambda v, t: float(_strict((int, float), "a number")(v, t)))
converter.register_structure_hook(Path, lambda v, t: Path(_strict(str, "a path")(v, t)))


converter.register_structure_hook_factory(lambda t: isinstance(t, type) and issubclass(t, enum.Enum), _enum_hook)


def register_enum(cls: type[enum.Enum]) -> None:
    """Structure ``cls`` from its values only; every enum is, registered or not (kept for backends)."""
    converter.register_structure_hook(cls, _enum_hook(cls))


def format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        unknown = ", ".join(repr(k) for k in sorted(exc.extra_fields))
        # A field named after a Python keyword (class_) is spelled without the underscore in
        # the file (options classes rename it so); say it as users write it.
        allowed = ", ".join((a.alias or a.name).rstrip("_") for a in attrs.fields(exc.cl)) if attrs.has(exc.cl) else ""
        return f"unknown key{'s' if len(exc.extra_fields) > 1 else ''} {unknown}" + (f" (allowed: {allowed})" if allowed else "")
    if isinstance(exc, ValueError) and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return cattrs.v.format_exception(exc, type_)


def config_error(exc: Exception, path: str, source: str) -> ConfigError:
    """The first problem cattrs found, as a ConfigError; the others are appended to the message."""
    first, *rest = cattrs.transform_error(exc, path=path, format_exception=format_exception)
    message, _, where = first.rpartition(" @ ")
    err = ConfigError(message or first, where or path, source)
    if rest:
        err.args = ("; ".join([str(err), *rest]),)
    return err
