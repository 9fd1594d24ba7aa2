"""``cdiplug cdi generate|validate|list``: write, check and list CDI specs without serving.

- ``generate [--config FILE] [--output-dir DIR]`` runs every configured backend once and prints
  one spec per kind on standard output (one JSON document each), exactly as ``cdiplug serve``
  would write it; with ``--output-dir`` it writes them into that folder instead (never removing
  other files). It never writes into the node's CDI folder unless told to.
- ``validate FILE...`` checks spec files as strictly as the reference CDI library; one line per
  problem on stderr, exit 1 when there is any.
- ``list [--cdi-dir DIR]`` prints the qualified device names of every spec in the folder
  (``.json`` and ``.yaml``, whoever wrote them), sorted; unreadable specs, and a folder that is
  not there, are named on stderr and make the exit status 1.

Exit status 2 is a bad argument or configuration, as everywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cdiplug.cli import (
    BACKEND_WORLD,
    add_config_option,
    add_log_level,
    add_path_option,
    add_world_options,
    describe,
    world_from_args,
)
from cdiplug.errors import BackendError, CdiError
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import DEFAULT_CDI_DIR


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cdi", help="write, check and list CDI specs", description=describe(__doc__))
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    help_text = "print the CDI specs for what the backends find (or write them with --output-dir), without serving"
    gen = actions.add_parser("generate", help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    add_config_option(gen)
    add_path_option(
        gen,
        "--output-dir",
        absolute=False,
        help=f"write the specs into this folder (the node's is {DEFAULT_CDI_DIR}) instead of standard output",
    )
    add_world_options(gen, BACKEND_WORLD)
    add_log_level(gen)
    gen.set_defaults(func=generate)

    help_text = "check CDI spec files as strictly as the reference library"
    val = actions.add_parser("validate", help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    val.add_argument("files", metavar="FILE", nargs="+", type=Path)
    add_log_level(val)
    val.set_defaults(func=validate)

    help_text = "print the qualified device names of every spec in a folder"
    lst = actions.add_parser("list", help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    add_world_options(lst, ("cdi_dir",))
    add_log_level(lst)
    lst.set_defaults(func=list_devices)


def generate(args: argparse.Namespace) -> int:
    from cdiplug.cdi.writer import SpecWriter
    from cdiplug.config import load_config
    from cdiplug.discovery import discover_once

    config = load_config(args.config)
    world = world_from_args(args)
    try:
        snapshots = asyncio.run(discover_once(config, world))
    except BackendError as exc:
        print(f"cdiplug cdi generate: {exc}", file=sys.stderr)
        return 1
    if args.output_dir is None:
        return _print_specs(config.resources, snapshots)
    writer = SpecWriter(Path(args.output_dir))
    status = 0
    for resource in config.resources:
        snapshot = snapshots[resource.name]
        path = writer.path_for(resource.cdi_kind)
        try:
            changed = writer.write(resource.cdi_kind, snapshot)
        except CdiError as exc:
            print(f"cdiplug cdi generate: {resource.name}: {exc}", file=sys.stderr)
            status = 1
            continue
        if not snapshot.devices:
            print(f"{resource.cdi_kind}: no devices, no spec" + (f" (removed {path})" if changed else ""))
        else:
            print(f"{path}: {len(snapshot.devices)} devices, {'written' if changed else 'unchanged'}")
    return status


def _print_specs(resources: Sequence[ResourceConfig[Any]], snapshots: Mapping[str, DeviceSnapshot]) -> int:
    """Each spec with devices on stdout (as the file would hold it); the rest said on stderr."""
    from cdiplug.cdi.writer import SpecWriter

    writer = SpecWriter(DEFAULT_CDI_DIR)  # for rendering and names only: nothing is written
    status = 0
    for resource in resources:
        snapshot = snapshots[resource.name]
        if not snapshot.devices:
            print(f"cdiplug cdi generate: {resource.cdi_kind}: no devices, no spec", file=sys.stderr)
            continue
        try:
            content = writer.render(resource.cdi_kind, snapshot)
            name = writer.path_for(resource.cdi_kind).name
        except CdiError as exc:
            print(f"cdiplug cdi generate: {resource.name}: {exc}", file=sys.stderr)
            status = 1
            continue
        sys.stdout.write(content.decode())
        sys.stdout.flush()
        print(f"cdiplug cdi generate: printed {name} ({len(snapshot.devices)} devices)", file=sys.stderr)
    return status


def validate(args: argparse.Namespace) -> int:
    from cdiplug.cdi.validate import check_file

    problems = [p for f in args.files for p in check_file(f)]
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{len(args.files)} spec file{'s' if len(args.files) != 1 else ''} valid")
    return 1 if problems else 0


def list_devices(args: argparse.Namespace) -> int:
    folder = Path(args.cdi_dir)
    names: set[str] = set()
    status = 0
    for path, result in _read_specs(folder):
        if isinstance(result, str):
            print(f"cdiplug cdi list: {path}: {result}", file=sys.stderr)
            status = 1
        else:
            names.update(result)
    for name in sorted(names):
        print(name)
    return status


def _read_specs(folder: Path) -> Iterator[tuple[Path, list[str] | str]]:
    """Each spec file of ``folder`` with its qualified device names, or why they cannot be read."""
    from cdiplug.cdi.validate import load_document
    from cdiplug.models.names import qualified_name_problem

    try:
        paths = sorted(p for p in folder.iterdir() if p.suffix in (".json", ".yaml") and p.is_file())
    except FileNotFoundError:
        yield folder, "no such folder (nothing has written a CDI spec here; --cdi-dir names another folder)"
        return
    except NotADirectoryError:
        yield folder, "not a folder"
        return
    except OSError as exc:
        yield folder, f"cannot list: {exc.strerror}"
        return
    for path in paths:
        try:
            data: Any = load_document(path.read_text(), yaml_format=path.suffix == ".yaml")
        except (OSError, UnicodeDecodeError) as exc:
            yield path, f"cannot read: {getattr(exc, 'strerror', None) or exc}"
            continue
        except CdiError as exc:
            yield path, str(exc)
            continue
        kind = data.get("kind") if isinstance(data, dict) else None
        devices = data.get("devices") if isinstance(data, dict) else None
        if not isinstance(kind, str) or not isinstance(devices, list):
            yield path, "not a CDI spec (no kind or no devices)"
            continue
        qualified = [f"{kind}={d.get('name')}" for d in devices if isinstance(d, dict)]
        problem = next(filter(None, map(qualified_name_problem, qualified)), None)
        yield path, problem or qualified
