#!/usr/bin/env python3
"""Write docs/configuration.md from the configuration classes themselves.

    hack/gen-config-docs.py          # rewrite docs/configuration.md
    hack/gen-config-docs.py --check  # exit 1 (with a diff) when the page is not what this writes

It walks attrs classes generically: the file's top level (``cdiplug.config._RawConfig``), every
class its fields lead to, the per-resource settings class of every registered front end (when a
front end has one), and the options class of every backend the repository registers (the
``cdiplug.backends`` entry points of pyproject.toml, installed or not), with every attrs class
their fields lead to. Per key: its name as the file spells it (``class_`` renamed ``class``), its type, its default, an example, and a description taken from
the comments beside the field in the source (or ``metadata={"doc": ...}``; ``metadata={"example":
...}`` gives the example). Nothing here names a key, so a new option needs no edit here, and the
test (tests/hack/test_config_docs.py) fails until the page is regenerated.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import inspect
import io
import json
import re
import sys
import tokenize
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"

INTRO = """\
# Configuration

What this page is for: every key of cdiplug's configuration file (`cdiplug serve --config FILE`,
in a cluster the `config.yaml` of the ConfigMap the DaemonSet mounts), with its type, its default
and an example: the file's top level, a resource, each front end's settings, and each backend's
`options`.

The file is YAML. JSON is YAML too, and a file that is one JSON object (as the Helm chart writes
it) is read without loading the YAML parser: the daemon starts about 20 ms sooner on 2 cores.

This page is generated from the configuration classes by `hack/gen-config-docs.py`; a test
fails when it is not current. Do not edit it by hand: change the class (a comment above a field
is its description here) and run the script.

Unknown keys, wrong types and bad values are errors that name the key and the file:
`expected an integer, got str '2' @ $.resources[0].options.count (in /etc/cdiplug/config.yaml)`.
`cdiplug discover --config FILE` shows what a file makes of this node; `cdiplug doctor` checks the
node itself.

A minimal file:

```yaml
resources:
  - name: example.com/fpga
    backend: fake
    options: {count: 2}
```
"""

TYPE_NAMES = {int: "integer", str: "string", bool: "boolean", float: "number", Path: "path", Any: "any", object: "any"}
SAMPLES: dict[Any, Any] = {int: 1, str: "text", bool: True, float: 1.5, Path: "/var/lib/cdiplug/file"}


def key_of(a: attrs.Attribute[Any]) -> str:
    """The key as the file spells it (the config loader says it so too)."""
    return (a.alias or a.name).rstrip("_")


def _strip_optional(t: Any) -> tuple[Any, bool]:
    args = typing.get_args(t)
    if typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007
    return t, False


def _list_item(t: Any) -> Any | None:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    if origin in (list, frozenset, set, typing.get_origin(typing.Sequence[int])):
        return args[0] if args else Any
    return None


def _mapping_value(t: Any) -> Any | None:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (dict, typing.get_origin(typing.Mapping[str, int])):
        return args[1] if args else Any
    return None


def _base(t: Any) -> Any:
    """A NewType or an int subclass (a size) as what the file holds."""
    while hasattr(t, "__supertype__"):
        t = t.__supertype__
    if isinstance(t, type) and not issubclass(t, enum.Enum):
        for known in (bool, int, float, str, Path):
            if issubclass(t, known):
                return known
    return t


class Walker:
    """The sections of the page: one per attrs class reached, in the order first reached."""

    def __init__(self) -> None:
        self.sections: dict[type, str] = {}  # class -> title
        self.order: list[tuple[str, type, str]] = []  # (title, class, where it sits in the file)
        self.anchor: dict[type, str] = {}

    def add(self, cls: type, title: str, where: str, root: tuple[str, str] | None = None) -> None:
        """``root``: the title and place of the section this class is reached from (None: a root)."""
        if cls in self.sections:
            return
        self.sections[cls] = title
        self.anchor[cls] = _anchor(title)
        self.order.append((title, cls, where))
        root = root or (title, where)
        for a in attrs.fields(cls):
            self._reach(_hints(cls).get(a.name, a.type), f"{where}.{key_of(a)}", root)

    def _reach(self, t: Any, where: str, root: tuple[str, str]) -> None:
        t, _ = _strip_optional(t)
        if (item := _list_item(t)) is not None:
            self._reach(item, f"{where}[]", root)
        elif (value := _mapping_value(t)) is not None:
            self._reach(value, f"{where}.NAME", root)
        elif isinstance(t, type) and attrs.has(t):
            below = where.removeprefix(root[1]).lstrip(".")
            self.add(t, f"{root[0]}: {below}", where, root)

    def type_text(self, t: Any) -> str:
        t, optional = _strip_optional(t)
        t = _base(t)
        if (item := _list_item(t)) is not None:
            text = f"list of {self.type_text(item)}"
        elif (value := _mapping_value(t)) is not None:
            text = f"mapping of names to {self.type_text(value)}"
        elif isinstance(t, type) and attrs.has(t):
            text = f"[{self.sections.get(t, t.__name__)}](#{self.anchor.get(t, '')})".replace("`", "")
        elif isinstance(t, type) and issubclass(t, enum.Enum):
            text = "one of " + ", ".join(f"`{m.value}`" for m in t)
        elif typing.get_origin(t) is typing.Literal:
            text = "one of " + ", ".join(f"`{v}`" for v in typing.get_args(t))
        elif typing.get_origin(t) in (typing.Union, types.UnionType):
            text = " or ".join(self.type_text(a) for a in typing.get_args(t))
        else:
            text = TYPE_NAMES.get(t, getattr(t, "__name__", str(t)))
        return f"{text} (optional)" if optional else text


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a forward reference the module keeps under TYPE_CHECKING
        return {a.name: a.type for a in attrs.fields(cls)}


def comments(cls: type) -> dict[str, str]:
    """Each field's description: the comment lines right above it, and the one at its end."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    above: list[str] = []
    names = {a.name for a in attrs.fields(cls)}
    line_tokens: dict[int, list[tokenize.TokenInfo]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        line_tokens.setdefault(tok.start[0], []).append(tok)
    for number in sorted(line_tokens):
        toks = [t for t in line_tokens[number] if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)]
        if not toks:
            above = []
            continue
        if toks[0].type == tokenize.COMMENT:
            above.append(toks[0].string.lstrip("#").strip())
            continue
        if toks[0].type == tokenize.NAME and toks[0].string in names and len(toks) > 1 and toks[1].string == ":":
            trailing = [t.string.lstrip("#").strip() for t in toks if t.type == tokenize.COMMENT]
            text = " ".join(above + trailing).strip()
            if text:
                found[toks[0].string] = text
        above = []
    return found


_DOC_LINE = re.compile(r"^\s*-?\s*([a-z_]+):\s*([^#]*?)\s*(?:#\s*(.*))?$")


_DOC_PROSE = re.compile(r"``([a-z_]+)`` \(([^()]+)\)")


def documented(cls: type) -> dict[str, tuple[str, str]]:
    """What the class's and its module's docstrings say of a key: ``key: value  # what it is``
    lines of their YAML examples, and prose of the form ``key`` (what it is): key -> (the value
    as written, its description)."""
    module = sys.modules.get(cls.__module__)
    found: dict[str, tuple[str, str]] = {}
    docs = [inspect.getdoc(cls) or "", (inspect.getdoc(module) or "") if module else ""]
    for doc in docs:
        in_block = False
        for line in doc.splitlines():
            if line.strip().startswith("```"):
                in_block = not in_block
                continue
            if in_block and (m := _DOC_LINE.match(line)) and m.group(1) not in found:
                found[m.group(1)] = (m.group(2).strip(), (m.group(3) or "").strip())
    for doc in docs:
        for m in _DOC_PROSE.finditer(" ".join(doc.split())):
            value, said = found.get(m.group(1), ("", ""))
            if not said:
                found[m.group(1)] = (value, m.group(2).replace("``", "`"))
    return found


def _plain(value: Any) -> Any:
    """A default or example as the file would spell it."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (frozenset, set)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if attrs.has(type(value)):
        return {key_of(a): _plain(getattr(value, a.name)) for a in attrs.fields(type(value))}
    return value


def _yaml(value: Any) -> str:
    text = json.dumps(_plain(value), ensure_ascii=False, sort_keys=False)
    return text


def default_text(a: attrs.Attribute[Any]) -> str:
    if a.default is attrs.NOTHING:
        return "required"
    default = a.default.factory() if isinstance(a.default, attrs.Factory) else a.default  # type: ignore[arg-type]
    if default is None:
        return "none"
    return f"`{_yaml(default)}`"


def example(a: attrs.Attribute[Any], t: Any) -> Any:
    """``metadata["example"]``, else a value of the type that differs from the default where it can."""
    if "example" in a.metadata:
        return a.metadata["example"]
    t, _ = _strip_optional(t)
    t = _base(t)
    default = a.default.factory() if isinstance(a.default, attrs.Factory) else a.default  # type: ignore[arg-type]
    if (item := _list_item(t)) is not None:
        if default not in (attrs.NOTHING, None) and len(default):
            return sorted(_plain(default))[:1] if len(default) > 3 else default  # one of a long default
        return [example_value(item)]
    if (value := _mapping_value(t)) is not None:
        if default not in (attrs.NOTHING, None) and len(default):
            return default
        return {"name": example_value(value)}
    if t is bool:
        return not default if isinstance(default, bool) else True
    if default not in (attrs.NOTHING, None) and not (isinstance(t, type) and attrs.has(t)):
        return default
    return example_value(t)


def example_value(t: Any) -> Any:
    t, _ = _strip_optional(t)
    t = _base(t)
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return list(t)[-1].value
    if typing.get_origin(t) is typing.Literal:
        return typing.get_args(t)[0]
    if isinstance(t, type) and attrs.has(t):
        fields = [a for a in attrs.fields(t) if a.default is attrs.NOTHING] or list(attrs.fields(t))[:1]
        return {key_of(a): example(a, _hints(t).get(a.name, a.type)) for a in fields}
    if (item := _list_item(t)) is not None:
        return [example_value(item)]
    if (value := _mapping_value(t)) is not None:
        return {"name": example_value(value)}
    return SAMPLES.get(t, "value")


def _keys(cls: type) -> list[attrs.Attribute[Any]]:
    """The fields of ``cls`` a file writes (one marked ``metadata={"internal": True}`` is not a key)."""
    return [a for a in attrs.fields(cls) if not a.metadata.get("internal")]


def rows(walker: Walker, cls: type) -> Iterator[tuple[str, str, str, str, str]]:
    notes = comments(cls)
    written = documented(cls)
    hints = _hints(cls)
    for a in _keys(cls):
        t = hints.get(a.name, a.type)
        key = key_of(a)
        value, comment = written.get(key, ("", ""))
        doc = str(a.metadata.get("doc", "")) or notes.get(a.name, "") or comment
        # a value the docstrings show, unless it only repeats the default
        shown = value and "example" not in a.metadata and f"`{value}`" != default_text(a)
        sample = value if shown else _yaml(example(a, t))
        yield key, walker.type_text(t), default_text(a), f"`{key}: {sample}`", doc


def _cell(text: str) -> str:
    text = re.sub(r":[a-z]+:`~?\.?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|").replace("\n", " ")


def backends() -> dict[str, Any]:
    """The backends this repository registers (pyproject.toml's ``cdiplug.backends`` entry points,
    whatever this environment installed), each plugin imported from its ``module:attr``."""
    import importlib
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found = {}
    for name, target in sorted(project["entry-points"]["cdiplug.backends"].items()):
        module, _, attr = target.partition(":")
        found[name] = getattr(importlib.import_module(module), attr)
    return found


def roots() -> Iterator[tuple[str, type, str, str]]:
    """(title, class, where in the file, what the section is) of every starting point."""
    from cdiplug import config, frontend

    yield "The file", config._RawConfig, "", "The top level of the file."
    for api in frontend.registered():
        settings = frontend.front_end_type(api).settings
        if isinstance(settings, type) and attrs.has(settings) and attrs.fields(settings):
            yield (
                f"Settings of api: {api}",
                settings,
                "resources[]",
                f"More keys of a resource with `api: {api}`, beside its name, backend, options and api.",
            )
    for name, plugin in backends().items():
        yield (
            f"Backend {name}: options",
            plugin.options_type,
            "resources[].options",
            f"The `options` of a resource with `backend: {name}`.",
        )


def render() -> str:
    walker = Walker()
    intros: dict[type, str] = {}
    for title, cls, where, intro in roots():
        intros.setdefault(cls, intro)
        walker.add(cls, title, where)
    out = [INTRO, "## Contents\n"]
    out += [f"- [{title.replace('`', '')}](#{walker.anchor[cls]})" for title, cls, _ in walker.order]
    for title, cls, where in walker.order:
        out.append(f"\n## {title.replace('`', '')}\n")
        doc = intros.get(cls) or (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        place = f"Where: `{where.lstrip('.')}`." if where else ""
        out.append("\n\n".join(filter(None, [doc, place])) + "\n")
        out.append("| key | type | default | example | description |")
        out.append("|---|---|---|---|---|")
        for key, type_text, default, sample, doc_text in rows(walker, cls):
            out.append(f"| `{key}` | {_cell(type_text)} | {_cell(default)} | {_cell(sample)} | {_cell(doc_text)} |")
    return "\n".join(out) + "\n"


def sections() -> dict[str, list[str]]:
    """Every section's title with the keys it must list (what the test checks the page against)."""
    walker = Walker()
    for title, cls, where, _ in roots():
        walker.add(cls, title, where)
    return {title.replace("`", ""): [key_of(a) for a in _keys(cls)] for title, cls, _ in walker.order}


def main() -> int:
    parser = argparse.ArgumentParser(description="Write docs/configuration.md from the configuration classes.")
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when the page is not current")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != text:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), str(PAGE), "generated"))
            print(f"{PAGE.relative_to(REPO)} is not current: run hack/gen-config-docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
