"""Safe YAML and JSON loading of the files cdiplug is given, with bounds on what they may expand to.

``yaml.safe_load`` and ``json.loads`` refuse code, but not every way a small file can hurt:

- **aliases** ("billion laughs"): nine levels of ten aliases each are a few hundred bytes and a
  billion nodes to anything that walks the result. Anchors and aliases are allowed (config files
  use them to share options) as long as everything they repeat adds up to at most
  :data:`MAX_ALIAS_NODES` nodes; a recursive alias is refused;
- **nesting**: more than :data:`MAX_DEPTH` levels is refused before Python's recursion limit
  is reached (a ``RecursionError`` is no error message);
- **integers**: a literal of more than :data:`MAX_INT_DIGITS` characters is refused (Python
  refuses 4,300 digits with a ``ValueError`` the caller would not expect, and a smaller huge
  number is useless to us anyway);
- **duplicate keys**: PyYAML keeps the last of two equal keys of a mapping without a word; here
  the second is refused, naming both lines (a key merged in with ``<<`` may still be overridden);
- **tabs**: YAML allows no tab in indentation; the parser's own words for it ("found character
  '\\t' that cannot start any token") are said plainly.

Every problem is an :class:`~cdiplug.errors.InputError` naming the file and the line and column
(YAML) or the offset (JSON). The ``yaml`` module is imported on first use: it is slow to import
(about 19 ms of a start on a 2-core machine, 8 ms of it one regular expression its reader
compiles) and the daemon's start-up time is measured. So a YAML document that is plain JSON (the
Helm chart renders the configuration so) is read by the JSON reader wherever PyYAML would read it
the same; the rest goes to PyYAML (:func:`_as_json`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from cdiplug.errors import InputError

if TYPE_CHECKING:
    from yaml import SafeLoader as _LoaderBase
    from yaml.nodes import MappingNode, Node, ScalarNode
else:
    _LoaderBase = object  # the bounds go in front of a loader's classes (_loader_class)

MAX_DEPTH = 64
MAX_ALIAS_NODES = 10_000
MAX_INT_DIGITS = 64


def load_yaml(text: str, source: str, what: str = "YAML") -> Any:
    """One YAML document (None when empty), bounded as the module docstring says."""
    if (data := _as_json(text)) is not _NOT_JSON:
        return data
    import yaml

    loader = None
    try:
        loader = _loader_class()(text)  # the reader checks every character here already
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or str(exc)
        if mark is not None and _tab_at(text, mark.line, mark.column):  # a tab where indentation or a token goes
            problem = "a tab: tabs are not allowed in YAML indentation, indent with spaces"
        if "maximum nesting depth" in problem:  # libyaml's own bound (1,000), met while it scans ahead
            problem = f"nested more than {MAX_DEPTH} levels deep"
        raise InputError(f"not valid {what}{where}: {_short(problem)}", "$", source) from None
    except yaml.YAMLError as exc:
        raise InputError(f"not valid {what}: {_short(exc)}", "$", source) from None
    except RecursionError:  # only if MAX_DEPTH is set above what the stack takes
        raise InputError(f"not valid {what}: nested too deeply", "$", source) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_json(text: str, source: str, what: str = "JSON") -> Any:
    """One JSON document, bounded as the module docstring says."""
    import json  # not on the default serve path (YAML configuration and health files)

    try:
        data = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid {what} at line {exc.lineno}, column {exc.colno}: {exc.msg}", "$", source) from None
    except ValueError as exc:
        raise InputError(f"not valid {what}: {_short(exc)}", "$", source) from None
    except RecursionError:
        raise InputError(f"not valid {what}: nested more than {MAX_DEPTH} levels deep", "$", source) from None
    if _depth(data) > MAX_DEPTH:
        raise InputError(f"not valid {what}: nested more than {MAX_DEPTH} levels deep", "$", source)
    return data


_NOT_JSON = object()


class _NotAsYaml(ValueError):
    """JSON that PyYAML reads otherwise (or refuses): the YAML reader decides."""


def _as_json(text: str) -> Any:
    """``text`` read by the JSON reader when it is a JSON object that PyYAML reads the same, else
    ``_NOT_JSON``. JSON is YAML's flow style except where YAML 1.1 and PyYAML differ, so these go
    to the YAML reader, which gives its own data or its own error:

    - anything but ASCII, a DEL or a tab: PyYAML's reader refuses some characters that JSON takes
      inside strings, and a tab where it indents;
    - a ``\\u`` escape: PyYAML refuses an escaped surrogate pair, which JSON joins;
    - a float with an exponent (YAML 1.1 reads ``1e3`` as a string), ``NaN`` and ``Infinity``;
    - a duplicate key, an integer or a depth past the bounds, and anything the JSON reader
      refuses: the error is worded as for any other YAML file.
    """
    if not text.lstrip(" \r\n").startswith("{") or not text.isascii() or "\x7f" in text or "\t" in text or "\\u" in text:
        return _NOT_JSON
    import json

    try:
        data = json.loads(text, object_pairs_hook=_unique, parse_float=_plain_float, parse_int=_json_int, parse_constant=_refuse)
    except (ValueError, RecursionError):  # a JSONDecodeError is a ValueError
        return _NOT_JSON
    return data if _depth(data) <= MAX_DEPTH else _NOT_JSON


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) < len(pairs):
        raise _NotAsYaml("a duplicate key")
    return mapping


def _plain_float(text: str) -> float:
    if "e" in text or "E" in text:
        raise _NotAsYaml(text)
    return float(text)


def _refuse(text: str) -> Any:
    raise _NotAsYaml(text)


def _tab_at(text: str, line: int, column: int) -> bool:
    """Whether the parser stopped at a tab of ``text`` (or in the indentation before it)."""
    lines = text.splitlines()
    if not 0 <= line < len(lines):
        return False
    here = lines[line]
    return here[column : column + 1] == "\t" or "\t" in here[: len(here) - len(here.lstrip())]


def _short(value: object, limit: int = 200) -> str:
    """One line of at most ``limit`` characters (parser messages quote the input and span lines)."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _json_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text):,} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _depth(data: Any) -> int:
    """How deep lists and mappings nest in ``data`` (iteratively: no recursion to exhaust)."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest


class _Bounds(_LoaderBase):
    """The bounds on depth and integer size, and the alias check, over a safe loader's classes."""

    _depth = 0  # how deep compose_node is now (an instance's own once it first goes deeper)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        from yaml.composer import ComposerError

        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                start = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", start)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Node) -> Any:
        _check_aliases(node)
        return super().construct_document(node)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        _check_unique_keys(node)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        from yaml.constructor import ConstructorError

        if len(str(node.value)) > MAX_INT_DIGITS:
            message = f"integer of {len(node.value):,} characters (at most {MAX_INT_DIGITS})"
            raise ConstructorError(None, None, message, node.start_mark)
        return super().construct_yaml_int(node)


@functools.cache
def _loader_class() -> type:
    import yaml

    loader: type[_Bounds]
    if getattr(yaml, "__with_libyaml__", False):
        from yaml._yaml import CParser
        from yaml.composer import Composer
        from yaml.constructor import SafeConstructor
        from yaml.resolver import Resolver

        class CEventsLoader(_Bounds, Composer, CParser, SafeConstructor, Resolver):
            """libyaml's C scanner and parser make the events (several times faster than PyYAML's
            own); the nodes are still composed in Python (Composer before CParser), so the depth
            bound holds before any recursion: libyaml's own composer has none."""

            def __init__(self, stream: str) -> None:
                CParser.__init__(self, stream)
                Composer.__init__(self)
                SafeConstructor.__init__(self)
                Resolver.__init__(self)

        loader = CEventsLoader
    else:

        class BoundedLoader(_Bounds, yaml.SafeLoader):
            pass

        loader = BoundedLoader
    loader.add_constructor("tag:yaml.org,2002:int", loader.construct_yaml_int)
    return loader


def _check_unique_keys(node: MappingNode) -> None:
    """Refuse a mapping that gives one plain key twice (as written: ``a`` and ``"a"`` are the same)."""
    from yaml.constructor import ConstructorError
    from yaml.error import Mark
    from yaml.nodes import ScalarNode

    seen: dict[tuple[str, str], Mark] = {}
    for key, _value in node.value:
        if not isinstance(key, ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        first = seen.setdefault((key.tag, key.value), key.start_mark)
        if first is not key.start_mark:
            raise ConstructorError(
                None,
                None,
                f"duplicate key {_short(key.value, 60)!r} (first at line {first.line + 1}, again at line {key.start_mark.line + 1})",
                key.start_mark,
            )


def _check_aliases(root: Node) -> None:
    """Refuse a document whose aliases repeat more than MAX_ALIAS_NODES nodes, or itself."""
    from yaml.composer import ComposerError
    from yaml.nodes import MappingNode, SequenceNode

    def _children(node: Node) -> list[Node]:
        if isinstance(node, SequenceNode):
            return list(node.value)
        if isinstance(node, MappingNode):
            return [n for pair in node.value for n in pair]
        return []

    size: dict[int, int] = {}  # node id -> nodes it expands to
    unique = 0
    active: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            active.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            continue
        if key in size:
            continue
        if key in active:
            raise ComposerError(None, None, "an alias refers to a node that contains it", node.start_mark)
        active.add(key)
        unique += 1
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
        # An expansion far beyond the budget is refused as soon as one node shows it.
    total = size[id(root)]
    if total - unique > MAX_ALIAS_NODES:
        raise ComposerError(
            None,
            None,
            f"aliases would expand to {total - unique:,} more nodes (at most {MAX_ALIAS_NODES:,})",
            root.start_mark,
        )
