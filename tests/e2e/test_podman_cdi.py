"""End to end with a REAL runtime: CDI names from cdiplug's Allocate answers, given to real podman
(4.3, runc) as ``podman run --device``, give each container the env, device nodes and mounts of the
spec cdiplug wrote to /var/run/cdi — and nothing of the other containers' devices.

The daemon runs in-process against the kubelet stand-in (``cdiplug.testing.KubeletStandIn``, real
gRPC over unix sockets), which admits two pods. Three resources: two fake ones with several
devices (env only) and a test-only backend, defined here and passed in as a ``BackendPlugin``,
whose devices carry a real character device node (made with mknod) and a read-only bind mount.
Podman runs from ``hack/podman-setup.sh`` (its own config and storage in a temporary folder, a
busybox image imported from the static binary). podman reads specs only from /etc/cdi and
/var/run/cdi, so the daemon writes there; the test removes exactly the files it wrote. Needs root,
podman, runc and busybox-static; when they are missing the test fails and says so.

Also DRA device metadata (KEP-5304): a claim prepared with ``device_metadata: true`` through the
DRA kubelet stand-in gives a container the metadata file, read-only, at the path Kubernetes documents.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest
from attrs import frozen
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from cdiplug.backend import BackendPlugin, SnapshotSink
from cdiplug.cdi.validate import check_file
from cdiplug.cdi.version import parse
from cdiplug.cdi.writer import SpecWriter
from cdiplug.config import Config, ResourceConfig, parse_config
from cdiplug.models.devices import ContainerEdits, Device, DeviceNode, DeviceSnapshot, Mount
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, running_daemon
from cdiplug_backends.fake import plugin as fake_plugin

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CDI_DIR = Path("/var/run/cdi")  # with /etc/cdi, the only folder podman 4.3 reads specs from
IMAGE = "localhost/cdiplug-busybox:e2e"
FPGA, NIC, NODE = "e2e.cdiplug.test/fpga", "e2e.cdiplug.test/nic", "e2e.cdiplug.test/node"
RESOURCES = (FPGA, NIC, NODE)
PODMAN_MAX_VERSION = "0.5.0"  # podman 4.3 refuses specs with a newer cdiVersion


# --- a test-only backend: devices with a real device node and a bind mount ---------------------


@frozen
class NodeOptions:
    folder: Path
    count: int = 2


NODE_NUMBERS = ((1, 3), (1, 5))  # /dev/null and /dev/zero: harmless to read and write


def make_node_devices(folder: Path, count: int) -> None:
    """What a driver would have made on the host: device nodes and a folder per device."""
    for i in range(count):
        node = folder / f"node{i}"
        if not node.exists():
            major, minor = NODE_NUMBERS[i % len(NODE_NUMBERS)]
            os.mknod(node, 0o666 | 0o020000, os.makedev(major, minor))
        share = folder / f"share{i}"
        share.mkdir(exist_ok=True)
        (share / "content").write_text(f"share of node-{i}\n")


class NodeBackend:
    def __init__(self, resources: Sequence[ResourceConfig], world: World) -> None:
        self.resources = tuple(resources)

    def snapshot(self, resource: ResourceConfig) -> DeviceSnapshot:
        opts: NodeOptions = resource.options
        devices = [
            Device(
                id=f"node-{i}",
                edits=ContainerEdits(
                    env={f"E2E_NODE_{i}": f"node-{i}"},
                    device_nodes=[
                        DeviceNode(path=f"/dev/e2e-node{i}", host_path=str(opts.folder / f"node{i}"), permissions="rw")
                    ],
                    mounts=[Mount(host_path=str(opts.folder / f"share{i}"), container_path=f"/mnt/e2e-{i}", read_only=True)],
                ),
            )
            for i in range(opts.count)
        ]
        return DeviceSnapshot(
            resource=resource.name, devices=devices, common_edits=ContainerEdits(env={"E2E_NODE_DRIVER": "mknod"})
        )

    async def run(self, sink: SnapshotSink) -> None:
        for resource in self.resources:
            sink.publish(self.snapshot(resource))
        await asyncio.Event().wait()


NODE_PLUGIN = BackendPlugin(name="e2e-node", options_type=NodeOptions, create=NodeBackend)


# --- podman --------------------------------------------------------------------------------


# Prints what the container sees, one fact a line, for parse_report().
REPORT_SCRIPT = r"""
env | sort | sed 's/^/ENV /'
for f in /dev/e2e-*; do [ -e "$f" ] && echo "NODE $f $(stat -c '%F %t:%T' "$f")"; done
for f in /dev/e2e-*; do [ -e "$f" ] && { echo x > "$f" && echo "WRITE $f ok" || echo "WRITE $f denied"; }; done
grep ' /mnt/e2e-' /proc/mounts | while read -r src dst type opts rest; do echo "MOUNT $dst $opts"; done
for d in /mnt/e2e-*; do [ -d "$d" ] && echo "FILE $d $(cat "$d/content")"; done
for d in /mnt/e2e-*; do [ -d "$d" ] && { touch "$d/new" 2>/dev/null && echo "TOUCH $d ok" || echo "TOUCH $d denied"; }; done
true
"""


@frozen
class Report:
    env: dict[str, str]
    nodes: dict[str, str]
    writes: dict[str, str]
    mounts: dict[str, str]
    files: dict[str, str]
    touches: dict[str, str]


def parse_report(text: str) -> Report:
    sections: dict[str, dict[str, str]] = {k: {} for k in ("ENV", "NODE", "WRITE", "MOUNT", "FILE", "TOUCH")}
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "ENV":
            key, _, value = rest.partition("=")
            sections["ENV"][key] = value
        elif tag in sections:
            key, _, value = rest.partition(" ")
            sections[tag][key] = value
    return Report(sections["ENV"], sections["NODE"], sections["WRITE"], sections["MOUNT"], sections["FILE"], sections["TOUCH"])


async def podman_run(env: dict[str, str], cdi_devices: Sequence[str]) -> Report:
    args = ["podman", "run", "--rm", "--network", "none"]
    for name in cdi_devices:
        args += ["--device", name]
    args += [IMAGE, "/bin/sh", "-c", REPORT_SCRIPT]
    proc = await asyncio.create_subprocess_exec(*args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    if proc.returncode != 0:
        # podman's real CDI errors show only at debug level: run it again to say why.
        debug = subprocess.run(["podman", "--log-level=debug", *args[1:]], env=env, capture_output=True, text=True, timeout=120)
        pytest.fail(f"{' '.join(args[:-1])} failed ({proc.returncode}): {err.decode()}\n--- debug:\n{debug.stderr[-4000:]}")
    return parse_report(out.decode())


# --- the specs -----------------------------------------------------------------------------


@frozen
class Expected:
    """What a container given some CDI devices must see, and what it must not, from the specs."""

    env: dict[str, str]
    nodes: set[str]
    mounts: set[str]
    absent_env: set[str]
    absent_nodes: set[str]
    absent_mounts: set[str]


def expected_from_specs(specs: dict[str, dict[str, Any]], cdi_devices: Sequence[str]) -> Expected:
    wanted = set(cdi_devices)
    env: dict[str, str] = {}
    nodes: set[str] = set()
    mounts: set[str] = set()
    others_env: set[str] = set()
    others_nodes: set[str] = set()
    others_mounts: set[str] = set()
    for kind, spec in specs.items():
        used = any(name.startswith(kind + "=") for name in wanted)
        if used:
            env.update(e.split("=", 1) for e in spec.get("containerEdits", {}).get("env", []))
        for device in spec["devices"]:
            edits = device["containerEdits"]
            mine = f"{kind}={device['name']}" in wanted
            for entry in edits.get("env", []):
                key, _, value = entry.partition("=")
                if mine:
                    env[key] = value
                else:
                    others_env.add(key)
            (nodes if mine else others_nodes).update(n["path"] for n in edits.get("deviceNodes", []))
            (mounts if mine else others_mounts).update(m["containerPath"] for m in edits.get("mounts", []))
    return Expected(env, nodes, mounts, others_env - env.keys(), others_nodes - nodes, others_mounts - mounts)


def check_container(report: Report, expected: Expected, label: str) -> None:
    for key, value in expected.env.items():
        assert report.env.get(key) == value, f"{label}: env {key}={value} missing (got {report.env.get(key)!r})"
    assert not expected.absent_env & report.env.keys(), (
        f"{label}: sees env of other devices: {expected.absent_env & report.env.keys()}"
    )
    assert set(report.nodes) == expected.nodes, f"{label}: device nodes {sorted(report.nodes)}, want {sorted(expected.nodes)}"
    for node, what in report.nodes.items():
        assert what.startswith("character special file"), f"{label}: {node} is {what}"
        assert report.writes[node] == "ok", f"{label}: cannot write {node} (device cgroup?)"
    assert set(report.mounts) == expected.mounts, f"{label}: mounts {sorted(report.mounts)}, want {sorted(expected.mounts)}"
    for mount in expected.mounts:
        assert "ro" in report.mounts[mount].split(","), f"{label}: {mount} is not read-only: {report.mounts[mount]}"
        assert report.touches[mount] == "denied", f"{label}: could write into read-only {mount}"
        index = mount.rsplit("-", 1)[1]
        assert report.files[mount] == f"share of node-{index}", f"{label}: wrong content in {mount}"
    assert not expected.absent_nodes & set(report.nodes) and not expected.absent_mounts & set(report.mounts)


@pytest.fixture
def cdi_files() -> Iterator[list[Path]]:
    """The spec files this test may write into /var/run/cdi: refuses to run beside a live cdiplug
    (whose specs the daemon under test would remove as stale), removes exactly these afterwards.

    Per-resource specs that no running cdiplug owns (a local cluster's DaemonSet that is gone)
    are leftovers: they are moved out of the way, as the daemon under test would remove them."""
    writer = SpecWriter(CDI_DIR)
    paths = [writer.path_for(kind) for kind in RESOURCES]
    others = sorted(p for p in CDI_DIR.glob("cdiplug-*.json") if p not in paths and not p.name.startswith("cdiplug-claim-"))
    if others:
        live = subprocess.run(["pgrep", "-f", "cdiplug serve"], capture_output=True, text=True).stdout.split()
        if live:
            pytest.fail(
                f"{CDI_DIR} holds other cdiplug specs ({', '.join(p.name for p in others)}) and cdiplug runs on this "
                f"machine (pids {', '.join(live)}): the daemon under test would remove its specs as stale"
            )
        for p in others:
            p.unlink(missing_ok=True)
    for p in paths:  # only our own e2e kinds: left over from an interrupted run
        p.unlink(missing_ok=True)
    try:
        yield paths
    finally:
        for p in paths:
            p.unlink(missing_ok=True)


def official_schema() -> jsonschema.Draft7Validator:
    """The official CDI JSON schema (copied into tests/cdiplug/cdi/schema), defs.json resolved."""
    folder = REPO / "tests" / "cdiplug" / "cdi" / "schema"
    defs = Resource.from_contents(json.loads((folder / "defs.json").read_text()), default_specification=DRAFT7)
    return jsonschema.Draft7Validator(
        json.loads((folder / "schema.json").read_text()), registry=Registry().with_resource("defs.json", defs)
    )


def read_specs(paths: list[Path]) -> dict[str, dict[str, Any]]:
    specs = {}
    schema = official_schema()
    for path in paths:
        assert check_file(path) == [], check_file(path)
        spec = json.loads(path.read_text())
        assert [e.message for e in schema.iter_errors(spec)] == [], path
        assert parse(spec["cdiVersion"]) <= parse(PODMAN_MAX_VERSION), (
            f"{path}: cdiVersion {spec['cdiVersion']} is too new for podman 4.3"
        )
        assert path.stat().st_mode & 0o7777 == 0o644
        specs[spec["kind"]] = spec
    return specs


def make_config(folder: Path) -> Config:
    return parse_config(
        {
            "resources": [
                {"name": FPGA, "backend": "fake", "options": {"count": 3}},
                {"name": NIC, "backend": "fake", "options": {"count": 2}},
                {"name": NODE, "backend": "e2e-node", "options": {"folder": str(folder), "count": 2}},
            ]
        },
        "test_podman_cdi",
        PLUGINS,
    )


PLUGINS = {"fake": fake_plugin, "e2e-node": NODE_PLUGIN}


@contextlib.asynccontextmanager
async def node(config: Config, world: World) -> AsyncIterator[KubeletStandIn]:
    """The daemon in this event loop, registered with the kubelet stand-in."""
    async with KubeletStandIn(world.kubelet_dir) as kubelet, running_daemon(config, world, plugins=PLUGINS):
        for resource in RESOURCES:
            await kubelet.wait_registered(resource, timeout=20)
        yield kubelet


async def test_allocate_answers_work_in_podman(podman_env: dict[str, str], cdi_files: list[Path], world: World) -> None:
    devices_folder = world.dev_root
    make_node_devices(devices_folder, 2)
    cdi_world = attrs.evolve(world, cdi_dir=CDI_DIR)
    async with node(make_config(devices_folder), cdi_world) as kubelet:
        for resource, count in ((FPGA, 3), (NIC, 2), (NODE, 2)):
            await kubelet.wait_until(
                lambda r=resource, n=count: kubelet.allocatable(r) == n, timeout=10, what=f"{count} {resource}"
            )
        one = await kubelet.admit_pod("pod-a", {FPGA: 2, NIC: 1, NODE: 1})
        two = await kubelet.admit_pod("pod-b", [{FPGA: 1, NODE: 1}, {NIC: 1}])  # two containers
        assert one.admitted and two.admitted, (one, two)
        # The specs on disk hold every device by the time an Allocate answer names one.
        specs = read_specs(cdi_files)
        assert {k: len(s["devices"]) for k, s in specs.items()} == {FPGA: 3, NIC: 2, NODE: 2}
        containers = [(f"{pod.name}/{c.name}", c) for pod in (one, two) for c in pod.containers]
        assert len(containers) == 3
        seen: set[str] = set()
        for label, container in containers:
            names = [n for _, a in container.allocations for n in a.cdi_devices]
            ids = [i for _, a in container.allocations for i in a.device_ids]
            assert len(names) == len(ids) and names, f"{label}: cdi_devices {names} for devices {ids}"
            assert not seen & set(names), f"{label}: devices given twice: {seen & set(names)}"
            seen.update(names)
            report = await podman_run(podman_env, names)
            check_container(report, expected_from_specs(specs, names), label)
    assert len(seen) == 7  # every device of the three resources, each in exactly one container


# --- DRA device metadata (KEP-5304) read inside a real container ----------------------------

META_DRIVER = "meta.e2e.cdiplug.test"  # a kind (k8s.<driver>/claim) no live cdiplug on this machine uses
META_UID = "e2e0e2e0-0000-4000-8000-00000000feed"


async def test_dra_device_metadata_is_readable_in_podman(podman_env: dict[str, str], world: World, short_tmp: Path) -> None:
    """The daemon (DRA, device_metadata: true) prepares a claim through the DRA kubelet stand-in;
    real podman given the claim's CDI device sees the metadata file, read-only, at the KEP's path.

    The daemon writes its CDI folder under short_tmp (a live cdiplug on this machine owns
    /var/run/cdi's claim specs and the daemon would sweep them); the claim's spec, byte for byte,
    is put into /var/run/cdi under a name of its own for podman, and removed afterwards.
    """
    from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
    from cdiplug.testing.dra_kubelet import ClaimRef

    config = parse_config(
        {
            "resources": [
                {
                    "name": "e2e.cdiplug.test/meta",
                    "backend": "fake",
                    "api": "dra",
                    "dra_driver": META_DRIVER,
                    "device_metadata": True,
                    "options": {"count": 1, "attributes": {"meta-0": {"speed": 7}}},
                }
            ]
        },
        source="test_podman_cdi",
    )
    async with ApiServerStandIn() as api:
        api.put_node("node-e2e")
        dra_world = attrs.evolve(
            world,
            plugins_registry_dir=short_tmp / "reg",
            plugins_dir=short_tmp / "plugins",
            node_name="node-e2e",
            kubeconfig=api.kubeconfig(short_tmp / "kubeconfig"),
        )
        claim = {
            "metadata": {"name": "vm-claim", "namespace": "default", "uid": META_UID},
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": META_DRIVER}}]}},
            "status": {
                "allocation": {
                    "devices": {"results": [{"request": "dev", "driver": META_DRIVER, "pool": "node-e2e", "device": "meta-0"}]}
                }
            },
        }
        async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
            conn = await asyncio.wait_for(kubelet.wait_registered(META_DRIVER), 10)
            await asyncio.wait_for(api.wait_for(lambda: len(api.slices(spec__driver=META_DRIVER)) == 1), 10)
            api.put_claim(claim)
            ref = ClaimRef("default", "vm-claim", META_UID)
            answer = (await conn.prepare([ref]))[META_UID]
            assert answer.error == ""
            (cdi_id,) = answer.devices[0].cdi_ids
            spec = (dra_world.cdi_dir / f"cdiplug-claim-{META_UID}.json").read_bytes()
            visible = CDI_DIR / f"e2e-dra-metadata-{META_UID}.json"
            visible.write_bytes(spec)
            try:
                inside = f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-claim/dev/{META_DRIVER}-metadata.json"
                script = (
                    f"echo BEGIN; cat {inside}; echo END; "
                    f"grep ' {inside} ' /proc/mounts | while read -r s d t o r; do echo \"MOUNT $o\"; done; "
                    f"(echo x >> {inside}) 2>/dev/null && echo WRITE ok || echo WRITE denied"
                )
                args = ["podman", "run", "--rm", "--network", "none", "--device", cdi_id, IMAGE, "/bin/sh", "-c", script]
                proc = await asyncio.create_subprocess_exec(
                    *args, env=podman_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
                )
                out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
            finally:
                visible.unlink(missing_ok=True)
            assert proc.returncode == 0, f"{' '.join(args[:-1])} failed: {err.decode()}"
            text = out.decode()
            body = json.loads(text.split("BEGIN\n", 1)[1].split("END\n", 1)[0])
            assert (body["apiVersion"], body["kind"]) == ("metadata.resource.k8s.io/v1alpha1", "DeviceMetadata")
            assert body["metadata"]["uid"] == META_UID and body["requests"][0]["name"] == "dev"
            (device,) = body["requests"][0]["devices"]
            assert device["name"] == "meta-0" and device["attributes"]["speed"] == {"int": 7}
            mount_opts = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("MOUNT ")]
            assert mount_opts and mount_opts[0].split(",")[0] == "ro", text
            assert "WRITE denied" in text
            assert await conn.unprepare([ref]) == {META_UID: ""}
            assert not (dra_world.plugins_dir / META_DRIVER / "dra-device-metadata" / "default_vm-claim").exists()
