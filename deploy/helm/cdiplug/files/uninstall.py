"""What the chart runs at uninstall, with the cdiplug image's Python and lightkube (in-cluster credentials).

``uninstall.py daemonset-gone NAMESPACE NAME``: exit 0 when the release's DaemonSet is gone or
being deleted (``helm uninstall``, ``kubectl delete``), or when the API server no longer accepts
the pod's credentials (its service account or role deleted with the release); 1 while it stands
(an upgrade, a restart, a drained node: the node's files must stay) or when the API server cannot
be asked. The daemon's container runs ``cdiplug cleanup`` on its node when this says 0.

``uninstall.py forget --resources R,... --drivers D,... [--node-selector K=V,...] [--labels]``:
the API objects a release leaves: its DRA drivers' ResourceSlices, and with ``--labels`` the
``cdiplug.dev/<vendor>.<class>.`` node labels of its resources on the nodes the selector picks (a
Helm post-delete hook, once the daemons' own rights are gone with the release).
"""

from __future__ import annotations

import argparse
import sys

import httpx2
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

PREFIX = "cdiplug.dev/"


def daemonset_gone(namespace: str, name: str) -> int:
    try:
        found = Client(timeout=httpx2.Timeout(5.0)).get(DaemonSet, name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code in (401, 403, 404):
            print(f"uninstall: DaemonSet {namespace}/{name}: {exc.status.code}: the release is being removed", file=sys.stderr)
            return 0
        print(f"uninstall: cannot read DaemonSet {namespace}/{name}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # no answer: keep the node's files
        print(f"uninstall: cannot read DaemonSet {namespace}/{name}: {exc}", file=sys.stderr)
        return 1
    return 0 if found.metadata is not None and found.metadata.deletionTimestamp is not None else 1


def forget(resources: list[str], drivers: list[str], selector: str, labels: bool) -> int:
    client = Client(timeout=httpx2.Timeout(10.0))
    for driver in drivers:
        for s in client.list(ResourceSlice, fields={"spec.driver": driver}):
            assert s.metadata is not None and s.metadata.name is not None
            client.delete(ResourceSlice, s.metadata.name)
            print(f"uninstall: deleted ResourceSlice {s.metadata.name} of {driver}")
    if not labels:
        return 0
    prefixes = tuple(f"{PREFIX}{r.replace('/', '.', 1)}." for r in resources)
    wanted: dict[str, str | None] = {k: v for k, v in (kv.split("=", 1) for kv in selector.split(",") if kv)}
    for node in client.list(Node, labels=wanted or None):  # type: ignore[arg-type]
        assert node.metadata is not None and node.metadata.name is not None
        ours = [k for k in node.metadata.labels or {} if k.startswith(prefixes)]
        if ours:
            client.patch(Node, node.metadata.name, {"metadata": {"labels": dict.fromkeys(ours)}})
            print(f"uninstall: removed {', '.join(sorted(ours))} from node {node.metadata.name}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="uninstall.py")
    sub = parser.add_subparsers(dest="command", required=True)
    gone = sub.add_parser("daemonset-gone")
    gone.add_argument("namespace")
    gone.add_argument("name")
    fg = sub.add_parser("forget")
    fg.add_argument("--resources", default="")
    fg.add_argument("--drivers", default="")
    fg.add_argument("--node-selector", default="")
    fg.add_argument("--labels", action="store_true")
    args = parser.parse_args()
    if args.command == "daemonset-gone":
        return daemonset_gone(args.namespace, args.name)
    resources = [x for x in args.resources.split(",") if x]
    drivers = [x for x in args.drivers.split(",") if x]
    return forget(resources, drivers, args.node_selector, args.labels)


if __name__ == "__main__":
    sys.exit(main())
