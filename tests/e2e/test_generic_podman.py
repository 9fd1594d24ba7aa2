"""End to end with this machine's own device nodes and REAL podman: the generic backend through the
daemon (in-process), the kubelet stand-in's Allocate and podman reading the CDI spec.

- ``/dev/fuse`` shared by ``count: 2`` containers (a third pod is Pending), ``/dev/net/tun`` and
  ``/dev/null``: each container gets the node, with type, major and minor in the spec, and opens it.
- Nodes made with ``mknod`` in a test folder of the test's own under ``/dev`` (removed afterwards), one reached
  through a symlink (the spec gives its real node with its numbers: the CDI library refuses a
  symlink host path without them): the container opens them; the node made again with a new minor
  (what a replug does) is in the next Allocate's spec, and the container opens that one.

Needs root, podman, runc and busybox-static (``hack/podman-setup.sh``), as test_podman_cdi does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest

from cdiplug.cdi.writer import SpecWriter
from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, running_daemon
from cdiplug_backends.generic.testing import FakeDev

pytestmark = pytest.mark.e2e

CDI_DIR = Path("/var/run/cdi")  # with /etc/cdi, the only folder podman 4.3 reads specs from
IMAGE = "localhost/cdiplug-busybox:e2e"  # hack/podman-setup.sh imports it (tests/e2e/conftest.py)
FUSE, TUN, NULL, MADE = "e2e.cdiplug.test/gfuse", "e2e.cdiplug.test/gtun", "e2e.cdiplug.test/gnull", "e2e.cdiplug.test/gmade"

OPEN_SCRIPT = r"""
for f in "$@"; do
  if [ -c "$f" ]; then echo "NODE $f $(stat -c '%t:%T' "$f")"; else echo "NODE $f missing"; fi
  if (exec 3<>"$f") 2>/dev/null; then echo "OPEN $f ok"; else echo "OPEN $f denied"; fi
done
"""


@pytest.fixture
def cdi_files() -> Iterator[list[Path]]:
    writer = SpecWriter(CDI_DIR)
    paths = [writer.path_for(kind) for kind in (FUSE, TUN, NULL, MADE)]
    others = sorted(p for p in CDI_DIR.glob("cdiplug-*.json") if p not in paths and not p.name.startswith("cdiplug-claim-"))
    live = subprocess.run(["pgrep", "-f", "cdiplug serve"], capture_output=True, text=True).stdout.split()
    if others and live:
        pytest.fail(
            f"{CDI_DIR} holds other cdiplug specs and cdiplug runs here (pids {', '.join(live)}): the daemon under test would remove them"
        )
    for p in paths:
        p.unlink(missing_ok=True)
    try:
        yield paths
    finally:
        for p in paths:
            p.unlink(missing_ok=True)


async def podman_open(env: dict[str, str], cdi_devices: list[str], nodes: list[str]) -> dict[str, str]:
    args = ["podman", "run", "--rm", "--network", "none"]
    for name in cdi_devices:
        args += ["--device", name]
    args += [IMAGE, "/bin/sh", "-c", OPEN_SCRIPT, "sh", *nodes]
    proc = await asyncio.create_subprocess_exec(*args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, f"{' '.join(args[:8])} failed: {err.decode()}"
    return {
        f"{tag} {path}": value
        for tag, path, value in (line.split(" ", 2) for line in out.decode().splitlines() if line.count(" ") >= 2)
    }


@contextlib.asynccontextmanager
async def node(config: Config, world: World) -> AsyncIterator[KubeletStandIn]:
    async with KubeletStandIn(world.kubelet_dir) as kubelet, running_daemon(config, world):
        for r in config.resources:
            await kubelet.wait_registered(r.name, timeout=20)
        yield kubelet


def spec_node(path: Path, device: str, node_path: str) -> dict:
    spec = json.loads(path.read_text())
    (entry,) = [d for d in spec["devices"] if d["name"] == device]
    (found,) = [n for n in entry["containerEdits"]["deviceNodes"] if n["path"] == node_path]
    return found


async def test_this_machines_nodes_open_in_podman(podman_env: dict[str, str], cdi_files: list[Path], world: World) -> None:
    config = parse_config(
        {
            "resources": [
                {"name": FUSE, "backend": "generic", "options": {"groups": [{"paths": [{"path": "/dev/fuse"}], "count": 2}]}},
                {"name": TUN, "backend": "generic", "options": {"groups": [{"paths": [{"path": "/dev/net/tun"}]}]}},
                {
                    "name": NULL,
                    "backend": "generic",
                    "options": {"groups": [{"paths": [{"path": "/dev/null", "mount_path": "/dev/e2e-null"}]}]},
                },
            ]
        },
        "test_generic_podman",
    )
    real = attrs.evolve(world, dev_root=Path("/"), cdi_dir=CDI_DIR)
    async with node(config, real) as kubelet:
        await kubelet.wait_until(lambda: kubelet.allocatable(FUSE) == 2, timeout=10, what="2 fuse slots")
        one = await kubelet.admit_pod("fuse-a", {FUSE: 1, TUN: 1, NULL: 1})
        two = await kubelet.admit_pod("fuse-b", {FUSE: 1})
        three = await kubelet.admit_pod("fuse-c", {FUSE: 1})
        assert one.admitted and two.admitted and not three.admitted, (one, two, three)
        fuse = spec_node(cdi_files[0], "fuse-slot0", "/dev/fuse")
        assert (fuse["type"], fuse["major"], fuse["minor"]) == ("c", 10, 229)
        for pod, nodes in ((one, ["/dev/fuse", "/dev/net/tun", "/dev/e2e-null"]), (two, ["/dev/fuse"])):
            names = [n for c in pod.containers for _, a in c.allocations for n in a.cdi_devices]
            seen = await podman_open(podman_env, names, nodes)
            for path in nodes:
                assert seen[f"OPEN {path}"] == "ok", (pod.name, seen)
        assert seen["NODE /dev/fuse"] == "a:e5"  # 10:229 in hex, as stat prints it


@pytest.fixture
def dev_folder() -> Iterator[str]:
    """A folder of this test's own under /dev (paths are served only there), removed afterwards."""
    folder = tempfile.mkdtemp(prefix="cdiplug-e2e-", dir="/dev")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_mknod_nodes_and_a_replug_open_in_podman(
    podman_env: dict[str, str], cdi_files: list[Path], world: World, dev_folder: str
) -> None:
    dev = FakeDev(Path("/"))
    made = f"{dev_folder}/made0"
    dev.node(made, 1, 3)  # /dev/null's numbers: harmless to open
    dev.link(f"{dev_folder}/by-id/e2e-link", made)
    config = parse_config(
        {
            "resources": [
                {
                    "name": MADE,
                    "backend": "generic",
                    "options": {
                        "groups": [{"paths": [{"path": f"{dev_folder}/by-id/e2e-*", "mount_path": "/dev/e2e-link"}]}],
                        "rescan_interval": 0.2,  # this folder sends no udev events: the rescan sees the replug
                    },
                }
            ]
        },
        "test_generic_podman",
    )
    device = Path(dev_folder).name  # the group's ID comes from its first path: /dev/<folder>/by-id/e2e-*
    device = f"{device}-by-id-e2e"
    async with node(config, attrs.evolve(world, dev_root=Path("/"), cdi_dir=CDI_DIR)) as kubelet:
        await kubelet.wait_until(lambda: kubelet.allocatable(MADE) == 1, timeout=10, what="the made node")
        (answer,) = await kubelet.allocate(MADE, [device])
        found = spec_node(cdi_files[3], device, "/dev/e2e-link")
        # The link's real node with its numbers: the CDI library refuses a symlink host path without them.
        assert (found["hostPath"], found["type"], found["major"], found["minor"]) == (made, "c", 1, 3)
        assert (await podman_open(podman_env, list(answer.cdi_devices), ["/dev/e2e-link"]))["OPEN /dev/e2e-link"] == "ok"
        dev.node(made, 1, 5)  # made again with a new minor (/dev/zero's), as a replug does
        await kubelet.wait_until(
            lambda: spec_node(cdi_files[3], device, "/dev/e2e-link")["minor"] == 5, timeout=10, what="the new minor in the spec"
        )
        (answer,) = await kubelet.allocate(MADE, [device])
        seen = await podman_open(podman_env, list(answer.cdi_devices), ["/dev/e2e-link"])
        assert seen == {"NODE /dev/e2e-link": "1:5", "OPEN /dev/e2e-link": "ok"}
