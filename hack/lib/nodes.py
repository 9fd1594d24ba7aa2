"""The node list of a multi-node local cluster (hack/local-cluster.sh up --nodes N|FILE).

    nodes.py plan N|FILE OUT_DIR

reads the built-in node file (hack/nodes/default.yaml, N >= 3 nodes: extra nodes copy node-a) or
FILE, checks it, writes OUT_DIR/nodes.yaml (the list as used, for the tests) and
OUT_DIR/<name>/config.yaml (the node's cdiplug configuration), and prints one line per node for
the shell: ``INDEX NAME RUNTIME LABELS`` (LABELS: ``k=v,k=v``, or ``-``). A bad file gets one
line on stderr naming the file and the entry, and exit status 2.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import yaml

DEFAULT = Path(__file__).resolve().parents[1] / "nodes" / "default.yaml"
RUNTIMES = ("containerd", "cri-o")
MAX_NODES = 20  # node i gets 127.0.0.(i+1) and the pod subnet 10.244.i.0/24
MAX_FILE_BYTES = 1 << 20
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")


class NodeFileError(Exception):
    pass


def load(source: str) -> tuple[list[dict[str, Any]], str]:
    if source.isdigit():
        count = int(source)
        if count < 3:
            raise NodeFileError(f"--nodes {count}: the built-in cluster has 3 nodes at least (a file may name fewer)")
        nodes = read(DEFAULT)
        for i in range(len(nodes), count):
            extra = copy.deepcopy(nodes[0])
            extra["name"] = f"node-{chr(ord('a') + i)}" if i < 26 else f"node-{i + 1}"
            nodes.append(extra)
        return nodes[:count], str(DEFAULT)
    return read(Path(source)), source


def read(path: Path) -> list[dict[str, Any]]:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise NodeFileError(f"cannot read the node file: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise NodeFileError(f"larger than {MAX_FILE_BYTES} bytes")
    try:
        nodes = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise NodeFileError(f"not YAML: {exc}") from None
    if not isinstance(nodes, list) or not nodes:
        raise NodeFileError("must be a non-empty YAML list of nodes")
    return nodes


def check(nodes: list[Any]) -> None:
    if len(nodes) > MAX_NODES:
        raise NodeFileError(f"{len(nodes)} nodes: at most {MAX_NODES}")
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        at = f"$[{i}]"
        if not isinstance(node, dict):
            raise NodeFileError(f"must be a mapping with name, runtime, labels, cdiplug @ {at}")
        unknown = set(node) - {"name", "runtime", "labels", "cdiplug"}
        if unknown:
            raise NodeFileError(f"unknown keys {sorted(unknown)} @ {at}")
        name = node.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise NodeFileError(f"name must be a DNS label (a-z, 0-9, -), got {name!r} @ {at}.name")
        if name in seen:
            raise NodeFileError(f"node {name!r} named twice @ {at}.name")
        seen.add(name)
        runtime = node.setdefault("runtime", "containerd")
        if runtime not in RUNTIMES:
            raise NodeFileError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r} @ {at}.runtime")
        labels = node.setdefault("labels", {}) or {}
        node["labels"] = labels
        if not isinstance(labels, dict):
            raise NodeFileError(f"labels must map keys to strings @ {at}.labels")
        for key, value in labels.items():
            if not isinstance(key, str) or not LABEL_KEY.match(key):
                raise NodeFileError(f"not a label key: {key!r} @ {at}.labels")
            if not isinstance(value, str) or not LABEL_VALUE.match(value):
                raise NodeFileError(
                    f"label values are strings of at most 63 of A-Z a-z 0-9 _ . -, got {value!r} @ {at}.labels.{key}"
                )
        config = node.setdefault("cdiplug", {"resources": []})
        if not isinstance(config, dict):
            raise NodeFileError(f"cdiplug must be a cdiplug configuration (a mapping with resources) @ {at}.cdiplug")


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[1] != "plan":
        print("usage: nodes.py plan N|FILE OUT_DIR", file=sys.stderr)
        return 2
    source, out = argv[2], Path(argv[3])
    try:
        nodes, origin = load(source)
        check(nodes)
    except NodeFileError as exc:
        where = DEFAULT if source.isdigit() else source
        print(f"{where}: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        folder = out / node["name"]
        folder.mkdir(exist_ok=True)
        (folder / "config.yaml").write_text(
            f"# node {node['name']}, from {origin}\n" + yaml.safe_dump(node["cdiplug"], sort_keys=False)
        )
    (out / "nodes.yaml").write_text(f"# from {origin}\n" + yaml.safe_dump(nodes, sort_keys=False))
    for i, node in enumerate(nodes, start=1):
        labels = ",".join(f"{k}={v}" for k, v in node["labels"].items()) or "-"
        print(i, node["name"], node["runtime"], labels)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
