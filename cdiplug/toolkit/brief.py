"""Short renderings of values that came from outside, for error messages and logs.

A request, a file or a sysfs tree may hold values of any size: a 1 MiB device ID, 10,000 unknown
IDs. A message that quotes them whole can exceed gRPC's metadata limit (the caller then sees
RESOURCE_EXHAUSTED instead of our error) or make a log line of megabytes. Everything that quotes a
value we were given goes through here:

- :func:`brief` cuts one value to :data:`VALUE_LIMIT` characters of its ``repr`` with a marker
  saying how long it was;
- :func:`format_ids` names at most :data:`SHOWN_IDS` IDs of a list, each cut, and counts the rest
  (``'a', 'b', 'c', … and 9,990 more``).

Pure functions at the bottom of the layers; they never raise on any input.
"""

from __future__ import annotations

from collections.abc import Iterable

VALUE_LIMIT = 64  # characters of one quoted value
SHOWN_IDS = 3  # IDs named in one message; the rest are counted


def brief(value: object, limit: int = VALUE_LIMIT) -> str:
    """``repr(value)`` cut to about ``limit`` characters: ``'abc…' (1,048,576 chars)``.

    Strings and bytes are cut before ``repr`` so a huge value is never rendered whole.
    """
    if isinstance(value, (str, bytes, bytearray)):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value):,} {'chars' if isinstance(value, str) else 'bytes'})"
    try:
        text = repr(value)
    except Exception as exc:  # a hostile __repr__ must not turn one error into another
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} chars)"


def format_ids(ids: Iterable[str], shown: int = SHOWN_IDS, limit: int = VALUE_LIMIT) -> str:
    """At most ``shown`` IDs, each :func:`brief`, in order, without repeats; the rest counted."""
    unique = list(dict.fromkeys(ids))
    text = ", ".join(brief(i, limit) for i in unique[:shown])
    rest = len(unique) - shown
    if rest > 0:
        text += f", … and {rest:,} more"
    return text
