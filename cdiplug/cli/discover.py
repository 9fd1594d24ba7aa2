"""``cdiplug discover [--config FILE] [--configuration NAME] [-o table|json|yaml]``: what every resource would advertise.

Runs each configured backend once, as ``cdiplug serve`` would (without serving), and prints per
resource every device with its health, NUMA nodes, preparation group and device nodes, then every
device a backend found but will not advertise, with the reason (``DeviceSnapshot.skipped``: an
IOMMU group shared with a function nobody selected, a denylisted address, ...), and the node
labels it would write (``cdiplug.dev/...``; written only with ``node_labels: true``). With
named configurations, ``--configuration`` picks one (as the node label cdiplug.dev/config
would; ``default`` otherwise). ``-o json`` and ``-o yaml`` print the same as data. What the
backends' own checks doubt (a health_file that is not there, a selector that matches nothing, a
PCI address without its domain) is said on stderr. Exit status 1 when a backend fails, 2 for bad
configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from typing import Any

import yaml

from cdiplug.backend import Abilities
from cdiplug.cli import BACKEND_WORLD, add_configuration_options, add_log_level, add_world_options, describe, world_from_args
from cdiplug.config import Config
from cdiplug.errors import BackendError
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.world import World

FORMATS = ("table", "json", "yaml")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "discover",
        help="show what every resource would advertise, and why devices are skipped",
        description=describe(__doc__, 1),
    )
    add_configuration_options(parser)
    add_world_options(parser, BACKEND_WORLD)
    parser.add_argument("-o", "--output", choices=FORMATS, default="table", help="output format (default table)")
    add_log_level(parser)
    parser.set_defaults(func=run)


def _device(device: Device) -> dict[str, Any]:
    return {
        "id": device.id,
        "health": device.health.value,
        "numa_nodes": list(device.numa_nodes),
        "prepare_group": device.prepare_group,
        "device_nodes": [n.path for n in device.edits.device_nodes],
        "env": dict(device.edits.env),
        # Typed as DRA publishes them; a version is written as its text.
        "attributes": {k: v if isinstance(v, (str, int, bool)) else str(v) for k, v in device.attributes},
        "capacity": dict(device.capacity),
    }


def as_data(snapshots: Mapping[str, DeviceSnapshot], labels: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """The snapshots as plain data, resources in config order, with the node labels of each."""
    return {
        name: {
            "devices": [_device(d) for d in snap.devices],
            "common_device_nodes": [n.path for n in snap.common_edits.device_nodes],
            "ids_env": snap.ids_env,
            "skipped": [{"id": i, "reason": r} for i, r in snap.skipped],
            "explained": [{"what": w, "found": f} for w, f in snap.explained],
            "node_labels": dict((labels or {}).get(name, {})),
        }
        for name, snap in snapshots.items()
    }


def as_table(snapshots: Mapping[str, DeviceSnapshot], labels: Mapping[str, Mapping[str, str]] | None = None) -> str:
    lines = []
    for name, snap in snapshots.items():
        lines.append(f"{name}: {len(snap.devices)} devices ({snap.healthy_count()} healthy), {len(snap.skipped)} skipped")
        common = ", ".join(n.path for n in snap.common_edits.device_nodes)
        if common:
            lines.append(f"  common device nodes: {common}")
        if snap.ids_env:
            lines.append(f"  IDs env: {snap.ids_env}")
        rows = [("DEVICE", "HEALTH", "NUMA", "GROUP", "DEVICE NODES", "ATTRIBUTES")]
        for d in snap.devices:
            attrs = " ".join(f"{k}={v}" for k, v in d.attributes if v)
            rows.append(
                (
                    d.id,
                    d.health.value,
                    ",".join(map(str, d.numa_nodes)) or "-",
                    d.prepare_group or "-",
                    ",".join(n.path for n in d.edits.device_nodes) or "-",
                    attrs or "-",
                )
            )
        if len(rows) > 1:
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
            for row in rows:
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
        for device_id, reason in snap.skipped:
            lines.append(f"  skipped {device_id}: {reason}")
        for what, found in snap.explained:
            lines.append(f"  {what}: {found}")
        ours = (labels or {}).get(name)
        if ours:
            lines.append("  node labels: " + " ".join(f"{k}={v}" for k, v in ours.items()))
    return "\n".join(lines)


def _warn(config: Config, world: World) -> None:
    """What the backends' own checks doubt (a health_file that is not there, a selector that
    matches nothing, a PCI address without its domain), on stderr (``cdiplug doctor`` says all)."""
    from cdiplug.doctor import backend_findings
    from cdiplug.models.checks import Verdict

    try:
        findings = asyncio.run(backend_findings(config, world))
    except BackendError as exc:
        print(f"cdiplug discover: warning: the backends' checks failed: {exc}", file=sys.stderr)
        return
    for finding in findings:
        if finding.verdict is not Verdict.OK:
            print(f"cdiplug discover: {finding.line()}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from cdiplug.config import load_config
    from cdiplug.discovery import discover_once
    from cdiplug.kube.node_labels import resource_labels

    config = load_config(args.config, configuration=args.configuration)
    world = world_from_args(args)
    abilities: dict[str, Abilities] = {}
    try:
        snapshots = asyncio.run(discover_once(config, world, abilities=abilities))
    except BackendError as exc:
        print(f"cdiplug discover: {exc}", file=sys.stderr)
        return 1
    labels = {name: resource_labels(snap, abilities[name].model_labels)[0] for name, snap in snapshots.items()}
    _warn(config, world)
    if args.output == "json":
        print(json.dumps(as_data(snapshots, labels), indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(as_data(snapshots, labels), sort_keys=False), end="")
    else:
        print(as_table(snapshots, labels))
        if config.name is not None:
            print(f"(named configuration {config.name!r} of {', '.join(config.names)})")
        if not config.node_labels:
            print("(node labels are not written: the configuration has no node_labels: true)")
    return 0
