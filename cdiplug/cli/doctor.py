"""``cdiplug doctor``: check that this node has what cdiplug needs, and say how to fix what it lacks.

Checks the configuration file, the kubelet's folders and sockets, the container runtime's CDI
settings (containerd's config.toml, CRI-O's crio.conf and crio.conf.d), the CDI folder, and what
each configured backend needs (the IOMMU and the vfio-pci module for PCI, the driver and NVML for
NVIDIA, files and selectors of the resources' options). One line per check: ok, warning or
problem, with the fix. Exit status 1 when there is a problem, 0 otherwise (warnings included),
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from cdiplug.cli import (
    add_configuration_options,
    add_log_level,
    add_path_option,
    add_plugin_folders,
    add_world_options,
    describe,
    world_from_args,
)

FORMATS = ("text", "json")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check that this node has what cdiplug needs, and how to fix what it lacks",
        description=describe(__doc__, 1),
    )
    add_configuration_options(parser)
    add_world_options(parser)
    add_plugin_folders(parser)
    add_path_option(
        parser,
        "--containerd-config",
        absolute=False,
        help="containerd's config.toml (default: the --config of the containerd running here, else /etc/containerd/config.toml)",
    )
    add_path_option(parser, "--crio-config", absolute=False, help="CRI-O's crio.conf (default /etc/crio/crio.conf when there)")
    add_path_option(parser, "--crio-config-dir", "/etc/crio/crio.conf.d", help="CRI-O's drop-in folder")
    add_path_option(parser, "--proc-root", "/proc", help="where /proc is mounted (to find the running containerd)")
    parser.add_argument("-o", "--output", choices=FORMATS, default="text", help="output format (default text)")
    add_log_level(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cdiplug.doctor import RuntimeFiles, examine, worst
    from cdiplug.models.checks import Verdict

    files = RuntimeFiles(
        containerd=Path(args.containerd_config) if args.containerd_config else None,
        crio=Path(args.crio_config) if args.crio_config else None,
        crio_dir=Path(args.crio_config_dir),
        proc_root=Path(args.proc_root),
    )
    findings = asyncio.run(examine(world_from_args(args), args.config, files, args.configuration))
    if args.output == "json":
        data = [
            {
                "subject": f.subject,
                "verdict": f.verdict.value,
                "detail": f.detail,
                "fix": f.fix,
                "resource": f.resource,
                "field": f.field,
            }
            for f in findings
        ]
        print(json.dumps(data, indent=2))
    else:
        for finding in findings:
            print(finding.line())
    counts = {v: sum(f.verdict is v for f in findings) for v in Verdict}
    summary = f"{counts[Verdict.PROBLEM]} problems, {counts[Verdict.WARNING]} warnings, {counts[Verdict.OK]} checks ok"
    print(f"cdiplug doctor: {summary}", file=sys.stderr)
    return 1 if worst(findings) is Verdict.PROBLEM else 0
