"""cdiplug.toolkit.stateconv: the converter our state records are read with.

Covers: exact scalars (no number read as a string, no string as a list of characters, no word as
a bool); a lenient field takes its default for a value of the wrong kind or failing its check, and
is left out when written at its default; a missing field marked absent reads as the value given;
a checked field fails the record; unknown keys are ignored; every place found wrong is named in
one message.
"""

from __future__ import annotations

import enum

import attrs
import pytest
from attrs import frozen

from cdiplug.toolkit import stateconv


class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


@frozen
class Part:
    names: tuple[str, ...] = attrs.field(metadata=stateconv.absent([]))
    label: str
    colour: Colour = Colour.RED
    size: str = attrs.field(default="", metadata=stateconv.checked(lambda v: "/" not in v, "must be a file name"))
    shiny: bool = attrs.field(default=False, metadata=stateconv.lenient())
    note: str | None = attrs.field(default=None, metadata=stateconv.lenient(lambda v: v is None or len(v) <= 3))


@frozen
class Box:
    parts: tuple[Part, ...] = ()


CONV = stateconv.converter()


def test_lenient_fields_take_their_defaults_and_unknown_keys_are_ignored() -> None:
    got = stateconv.structure(CONV, {"label": "a", "shiny": "yes", "note": "long", "later": 1}, Part, "$")
    assert got == Part((), "a")
    assert stateconv.structure(CONV, {"label": "a", "shiny": True, "note": "ok"}, Part, "$") == Part(
        (), "a", shiny=True, note="ok"
    )


def test_every_wrong_place_is_named_with_exact_scalars() -> None:
    data = {"parts": [{"names": "ab", "label": 7, "colour": "green"}, "x", {"label": "b", "size": "../x"}]}
    with pytest.raises(ValueError) as caught:
        stateconv.structure(CONV, data, Box, "box")
    assert str(caught.value).split("; ") == [
        "box.parts[0].names must be a list of strings",
        "box.parts[0].label must be a string, got 7",
        "box.parts[0].colour must be red or blue, got 'green'",
        "box.parts[1] must be a mapping",
        "box.parts[2].size must be a file name",
    ]


def test_lenient_fields_at_their_defaults_are_not_written() -> None:
    written = CONV.unstructure(Part(("n",), "a"))
    assert stateconv.without_lenient_defaults(written, Part) == {"names": ["n"], "label": "a", "colour": "red", "size": ""}
