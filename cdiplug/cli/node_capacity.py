"""``cdiplug node-capacity set|remove``: advertise counted resources in a node's status.

``cdiplug node-capacity set NODE example.com/dongle=4 [NAME=COUNT ...]`` and
``cdiplug node-capacity remove NODE example.com/dongle [NAME ...]``. Credentials come in kubectl's
order (:mod:`cdiplug.kube.credentials`): ``--kubeconfig`` (``$CDIPLUG_KUBECONFIG``), ``$KUBECONFIG``,
``~/.kube/config``, then the in-cluster service account. Exit status: 0 done, 1 the API server
refused or was unreachable, 2 a bad argument or unusable credentials.
"""

from __future__ import annotations

import argparse
import sys

from cdiplug.cli import EXIT_USAGE, KUBECONFIG_HELP, add_log_level, add_option, add_path_option
from cdiplug.kube.credentials import CredentialsError, find_credentials
from cdiplug.kube.node_capacity import CapacityUsageError, NodeCapacity, NodeCapacityError, parse_quantity


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "node-capacity",
        help="advertise counted resources (dongles, licences) in a node's status, no device plugin needed",
        description=(
            "Patch a node's status capacity through the Kubernetes API (JSON Patch on nodes/NODE/status). "
            "The kubelet copies capacity into allocatable at its next status update. "
            "Needs 'patch' on 'nodes/status' (deploy/rbac-node-capacity.yaml)."
        ),
    )
    # The options sit on each action, so they may come after the positional arguments too.
    common = argparse.ArgumentParser(add_help=False)
    add_path_option(common, "--kubeconfig", absolute=False, help=KUBECONFIG_HELP)
    add_option(common, "--context", help="kubeconfig context; without it the current context")
    add_option(common, "--timeout", "30", type=float, help="seconds to wait for the API server's answer")
    add_log_level(common)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    set_parser = actions.add_parser("set", parents=[common], help="add or change capacity: NODE NAME=COUNT ...")
    set_parser.add_argument("node", metavar="NODE")
    set_parser.add_argument("quantities", metavar="NAME=COUNT", nargs="+", help="as in example.com/dongle=4")
    set_parser.set_defaults(func=run)

    remove_parser = actions.add_parser("remove", parents=[common], help="remove capacity: NODE NAME ...")
    remove_parser.add_argument("node", metavar="NODE")
    remove_parser.add_argument("resources", metavar="NAME", nargs="+", help="as in example.com/dongle")
    remove_parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prog = f"cdiplug node-capacity {args.action}"
    try:
        if args.action == "set":
            quantities: dict[str, int] = {}
            for assignment in args.quantities:
                name, count = parse_quantity(assignment)
                if name in quantities:
                    raise CapacityUsageError(f"{name} is named twice")
                quantities[name] = count
        if not args.timeout > 0:  # also NaN
            raise CapacityUsageError(f"--timeout {args.timeout}: must be a number of seconds above 0")
        client = NodeCapacity(find_credentials(args.kubeconfig, args.context), timeout=args.timeout)
        if args.action == "set":
            capacity = client.set(args.node, quantities)
            for name in quantities:
                print(f"node {args.node}: {name}={capacity.get(name, '?')}")
        else:
            capacity = client.remove(args.node, args.resources)
            for name in args.resources:
                state = "still present" if name in capacity else "removed"
                print(f"node {args.node}: {name} {state}")
    except (CapacityUsageError, CredentialsError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NodeCapacityError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    return 0
