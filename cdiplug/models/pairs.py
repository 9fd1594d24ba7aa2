"""Name -> value pairs as the frozen values keep them: a tuple of ``(str, str)``, in the given order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def str_pairs(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """``value`` (a mapping or pairs) as a tuple of string pairs; one already so is kept, not copied."""
    if type(value) is tuple and all(type(p) is tuple and len(p) == 2 and type(p[0]) is str and type(p[1]) is str for p in value):
        return value  # already what it would become (attrs.evolve, a shared tuple): kept, not copied
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)
