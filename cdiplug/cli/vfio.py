"""``cdiplug vfio status|bind|unbind ADDR``: VFIO binding by hand, for people at a node.

- ``status ADDR`` shows the function's IDs, driver, ``driver_override``, IOMMU group with its
  members and their drivers, the group's ``/dev/vfio`` node, the original driver cdiplug recorded
  and any half-done operation in the journal.
- ``bind ADDR`` binds every endpoint function of ADDR's IOMMU group to vfio-pci, exactly as an
  Allocate would: journaled in ``--state-dir``, locked against a running daemon, refused when a
  function is in use (``--force`` binds anyway).
- ``unbind ADDR`` returns ADDR, and the other functions of its group that cdiplug bound, to their
  recorded original drivers (``drivers_probe`` when none was recorded); refused while a process
  holds the group's ``/dev/vfio`` node open (``--force`` goes ahead).

The work is the PCI backend's, reached through its entry point (the core never imports backends).
Exit status: 0 done, 1 refused or failed (reason on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from cdiplug.backend import load_plugins
from cdiplug.cli import BACKEND_WORLD, add_log_level, add_world_options, describe, world_from_args
from cdiplug.errors import CdiplugError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("vfio", help="bind PCI functions to vfio-pci and back by hand", description=describe(__doc__))
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (
        ("status", "show a function's driver, IOMMU group and what cdiplug recorded"),
        ("bind", "bind a function's IOMMU group to vfio-pci"),
        ("unbind", "return a function (and its group) to the original driver"),
    ):
        sub = actions.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        sub.add_argument("address", metavar="ADDR", help="PCI address, e.g. 0000:3b:02.0")
        add_world_options(sub, BACKEND_WORLD)
        add_log_level(sub)
        if name != "status":
            sub.add_argument("--force", action="store_true", help="go ahead even when the function is in use")
        sub.set_defaults(func=run)


def _backend(args: argparse.Namespace) -> Any:
    return load_plugins()["pci"].create((), world_from_args(args))


def _status_lines(status: Any) -> list[str]:
    fn = status.function
    lines = [
        f"{fn.address}: {fn.ids} class 0x{fn.class_code:06x}",
        f"  driver: {fn.driver or 'none'}",
        f"  driver_override: {status.driver_override or 'none'}",
        f"  NUMA node: {fn.numa_node if fn.numa_node is not None else 'none'}",
    ]
    if fn.iommu_group is None:
        lines.append("  IOMMU group: none")
    else:
        members = ", ".join(f"{a} ({d or 'no driver'})" for a, d in status.group_members)
        lines.append(f"  IOMMU group {fn.iommu_group}: {members}")
        lines.append(f"  device node: {status.node} ({'present' if status.node_present else 'absent'})")
    if fn.physfn:
        lines.append(f"  SR-IOV VF of {fn.physfn}")
    if fn.virtfns:
        lines.append(f"  SR-IOV PF with VFs {', '.join(fn.virtfns)}")
    if fn.netdevs:
        lines.append(f"  network interfaces: {', '.join(fn.netdevs)}")
    if status.record is not None:
        lines.append(
            f"  bound by cdiplug; original driver: {status.record.original_driver or 'none'}"
            + (f"; resource {status.record.resource}" if status.record.resource else "")
        )
    for line in status.pending:
        lines.append(f"  journal: {line} (recovered by the next bind, unbind or daemon start)")
    return lines


async def _run(args: argparse.Namespace) -> int:
    backend = _backend(args)
    if args.action == "status":
        print("\n".join(_status_lines(await backend.status(args.address))))
    elif args.action == "bind":
        result = await backend.bind_address(args.address, force=args.force)
        for address in result.bound:
            print(f"{address}: bound to vfio-pci ({result.node})")
        for address in result.already:
            print(f"{address}: already on vfio-pci ({result.node})")
    else:
        for result in await backend.unbind_address(args.address, force=args.force):
            for address, driver in result.restored:
                print(f"{address}: restored to {driver or 'no driver'}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except ValueError as exc:
        print(f"cdiplug vfio {args.action}: {exc}", file=sys.stderr)
        return 2
    except CdiplugError as exc:
        print(f"cdiplug vfio {args.action}: {exc}", file=sys.stderr)
        return 1
