"""The Helm chart on a real node (``hack/local-cluster.sh``), with real Helm 4.2.3 and kubectl 1.36.3.

- ``helm install`` of the fake device-plugin example runs the seed experiment (two pods Running on
  distinct FPGAs, the third Pending with ``Insufficient example.com/fpga``); its CDI spec carries
  the release's instance name.
- A DRA release (``maxSurge: 1``, sockets named with the pod UID): ``helm upgrade`` to a new image tag, then ``helm rollback``, each
  while a claim's pod is made every second: no failed prepare, every pod Running.
- Both releases on one node: each restarted five times and the kubelet restarted twice, inotify
  watching every shared folder the whole time: no file of one release is removed while only the
  other (or nothing) was being restarted; both keep serving.
- ``helm uninstall`` of both leaves the node as it was before the first install, file by file
  (CDI folder, the kubelet's plugin folders, the state folder), with no ResourceSlice of the DRA
  driver and no ``cdiplug.dev/`` node label.

The session's kustomize deployment (``cdiplug`` fixture) is taken away first (its default
instance serves ``example.com/fpga`` too) and put back at the end.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..deploy.chart import CHART, EXAMPLES, helm
from .conftest import FAKE_OVERLAY, NAMESPACE, SCRIPT, Kube, seed_experiment, stream_pods

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]

RELEASE_NS = "cdiplug-helm"
TEST_NS = "cdiplug-helm-test"
LABEL = "cdiplug.test/helm"
DP, DRA = "seed", "dra"
FPGA, DONGLE = "example.com/fpga", "example.com/dongle"
DRIVER = "dongle.example.com"
DONGLES = 8
# The node's folders the releases share (the DaemonSet's hostPaths), watched and compared.
FOLDERS = [
    Path("/var/run/cdi"),
    Path("/var/lib/kubelet/device-plugins"),
    Path("/var/lib/kubelet/plugins_registry"),
    Path("/var/lib/kubelet/plugins"),
    Path("/var/lib/cdiplug"),
]
# What names a file as one release's (its instance name, resource or driver in the path).
OWN = {
    DP: ("cdiplug.seed.", "/instances/seed", "example.com-fpga", "fpga.example.com"),
    DRA: ("cdiplug.dra.", "/instances/dra", "example.com-dongle", DRIVER),
}
DRA_VALUES = {"config": {"resources": [{"name": DONGLE, "backend": "fake", "api": "dra", "options": {"count": DONGLES}}]}}


def files_under(folders: list[Path]) -> set[str]:
    return {str(p) for folder in folders if folder.exists() for p in folder.rglob("*")}


# This kube-apiserver build cannot serve its OpenAPI document (Go 1.27; kubectl needs --validate=false
# too): Helm's check of the rendered objects against it is left out. The API server still validates.
NO_OPENAPI = "--disable-openapi-validation"


def install(kube: Kube, verb: str, release: str, *args: str) -> None:
    result = helm(
        verb, release, str(CHART), "-n", RELEASE_NS, NO_OPENAPI, *args, env={"KUBECONFIG": str(kube.kubeconfig)}, timeout=400
    )
    assert result.returncode == 0, f"helm {verb} {release}: {result.stderr}"


def helm_ok(kube: Kube, *args: str) -> str:
    result = helm(*args, env={"KUBECONFIG": str(kube.kubeconfig)}, timeout=400)
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def run_post_delete_hooks(kube: Kube, hooks: str) -> None:
    """What Helm does after ``uninstall`` deleted the release's objects: its post-delete hooks (as
    ``helm get hooks`` shows them, stored with the release) created in weight order, the Job
    awaited, then deleted (``hook-succeeded``). Done here with kubectl because Helm validates
    hooks against the OpenAPI document this API server cannot serve."""
    objects = [o for o in yaml.safe_load_all(hooks) if o and o["metadata"]["annotations"]["helm.sh/hook"] == "post-delete"]
    objects.sort(key=lambda o: int(o["metadata"]["annotations"].get("helm.sh/hook-weight", "0")))
    assert [o["kind"] for o in objects][-1:] == ["Job"], objects
    kube.apply(objects)
    job = objects[-1]["metadata"]
    kube("wait", "--for=condition=Complete", f"job/{job['name']}", "-n", job["namespace"], "--timeout=180s", timeout=190)
    print(kube("logs", "-n", job["namespace"], f"job/{job['name']}"))
    for o in reversed(objects):
        kube(
            "delete",
            o["kind"],
            o["metadata"]["name"],
            *(["-n", o["metadata"]["namespace"]] if "namespace" in o["metadata"] else []),
            "--wait=true",
            timeout=120,
        )


def rollout(kube: Kube, release: str) -> None:
    name = "cdiplug" if release == "cdiplug" else f"{release}-cdiplug"
    kube("rollout", "status", "-n", RELEASE_NS, f"daemonset/{name}", "--timeout=240s", timeout=250)


def dongle_slice(kube: Kube, timeout: float = 90) -> None:
    kube.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and len(s["spec"].get("devices") or []) == DONGLES,
        what=f"the {DRIVER} slice with {DONGLES} devices",
        timeout=timeout,
    )


def claim_pod(name: str) -> dict[str, Any]:
    """A busybox pod with a claim for one dongle (from the template ``one-dongle``)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NS, "labels": {LABEL: "true"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "dongle", "resourceClaimTemplateName": "one-dongle"}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                    "resources": {"claims": [{"name": "dongle"}]},
                }
            ],
        },
    }


class DeleteWatch:
    """Every file deleted or moved away under ``folders`` (recursively, new subfolders included),
    with the time it went, read by a thread from one inotify descriptor."""

    IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_ISDIR, IN_DELETE_SELF = 0x100, 0x200, 0x40, 0x40000000, 0x400

    def __init__(self, folders: list[Path]) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_CLOEXEC)
        assert self.fd >= 0, f"inotify_init1: {os.strerror(ctypes.get_errno())}"
        self.dirs: dict[int, Path] = {}
        self.gone: list[tuple[float, str]] = []
        self.stop = threading.Event()
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            for d in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
                self._add(d)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _add(self, folder: Path) -> None:
        mask = self.IN_CREATE | self.IN_DELETE | self.IN_MOVED_FROM | self.IN_DELETE_SELF
        wd = self.libc.inotify_add_watch(self.fd, str(folder).encode(), mask)
        if wd >= 0:
            self.dirs[wd] = folder

    def _read(self) -> None:
        header = struct.Struct("iIII")
        while not self.stop.is_set():
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            offset = 0
            while offset < len(data):
                wd, mask, _, length = header.unpack_from(data, offset)
                name = data[offset + header.size : offset + header.size + length].rstrip(b"\0").decode()
                offset += header.size + length
                folder = self.dirs.get(wd)
                if folder is None or not name:
                    continue
                path = folder / name
                if mask & self.IN_CREATE and mask & self.IN_ISDIR:
                    self._add(path)
                if mask & (self.IN_DELETE | self.IN_MOVED_FROM):
                    self.gone.append((time.monotonic(), str(path)))

    def close(self) -> list[tuple[float, str]]:
        self.stop.set()
        os.close(self.fd)  # ends the blocking read
        self.thread.join(5)
        return list(self.gone)


@pytest.fixture(scope="module")
def node(kube: Kube) -> Iterator[dict[str, Any]]:
    """The node without the session's kustomize deployment; the files in the shared folders as they
    were before any release (``baseline``). Releases and test objects deleted at the end and the
    kustomize deployment put back if it was there."""
    had = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    if had:
        kube(
            "delete", "daemonset", "cdiplug", "-n", NAMESPACE, "--cascade=foreground", "--wait=true", "--timeout=90s", timeout=120
        )
    env = {"KUBECONFIG": str(kube.kubeconfig)}
    for release in (DP, DRA):
        helm("uninstall", release, "-n", RELEASE_NS, "--ignore-not-found", "--no-hooks", "--wait", env=env, timeout=200)
    kube("delete", "namespace", TEST_NS, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("create", "namespace", TEST_NS)
    # The release namespace made here, not by helm --create-namespace (Helm validates that one
    # against the OpenAPI document this API server cannot serve).
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": RELEASE_NS, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
        }
    )
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NS, "--timeout=60s", timeout=70)
    if FPGA in kube.get(f"node/{kube.node}")["status"]["allocatable"]:
        kube.wait_node("allocatable", FPGA, "0")
    state: dict[str, Any] = {"baseline": files_under(FOLDERS)}
    yield state
    kube.delete_pods(TEST_NS, selector=LABEL)
    kube("delete", "namespace", TEST_NS, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150, check=False)
    for release in (DP, DRA):
        helm("uninstall", release, "-n", RELEASE_NS, "--ignore-not-found", "--no-hooks", "--wait", env=env, timeout=200)
    if had:
        kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)


def test_helm_install_runs_the_seed_experiment(kube: Kube, node: dict[str, Any]) -> None:
    started = time.monotonic()
    install(
        kube,
        "install",
        DP,
        "-f",
        str(EXAMPLES / "fake-device-plugin.yaml"),
        "--set",
        "config.node_labels=true",
    )
    kube.wait_node("allocatable", FPGA, "2", timeout=180)
    node["install_to_allocatable"] = took = time.monotonic() - started
    print(f"helm install -> {FPGA} allocatable 2 on the node: {took:.1f} s")
    rollout(kube, DP)
    seed_experiment(kube)
    # The release's own CDI spec, named by its instance (the release name).
    assert Path("/var/run/cdi/cdiplug.seed.example.com-fpga.json").exists(), sorted(os.listdir("/var/run/cdi"))
    labels = kube.watch(
        f"node/{kube.node}",
        lambda n: n["metadata"]["labels"].get("cdiplug.dev/example.com.fpga.count") == "2",
        what="the node label cdiplug.dev/example.com.fpga.count=2",
    )["metadata"]["labels"]
    assert labels["cdiplug.dev/example.com.fpga.count"] == "2"


def test_helm_upgrade_and_rollback_while_claim_pods_stream_fail_no_prepare(kube: Kube, node: dict[str, Any]) -> None:
    values = Path(kube.state_dir) / "helm-dra-values.yaml"
    values.write_text(yaml.safe_dump(DRA_VALUES))
    install(kube, "install", DRA, "-f", str(values), "--wait", "--timeout=240s")
    dongle_slice(kube)
    kube.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-dongle", "namespace": TEST_NS, "labels": {LABEL: "true"}},
                "spec": {"spec": {"devices": {"requests": [{"name": "dongle", "exactly": {"deviceClassName": DRIVER}}]}}},
            }
        ]
    )
    tag = "0.1.0-helm-upgrade"
    subprocess.run([str(SCRIPT), "images", tag], check=True, capture_output=True, timeout=600)
    figures = {}
    for step, args in (
        ("upgrade", ["upgrade", DRA, str(CHART), "-n", RELEASE_NS, NO_OPENAPI, "--reuse-values", "--set", f"image.tag={tag}"]),
        ("rollback", ["rollback", DRA, "1", "-n", RELEASE_NS]),
    ):

        def act(args: list[str] = args) -> None:
            helm_ok(kube, *args, "--wait", "--timeout=240s")
            rollout(kube, DRA)

        starts = stream_pods(kube, TEST_NS, claim_pod, act)
        events = kube.get("events", TEST_NS)["items"]
        warnings = [f"{e['involvedObject']['name']}: {e['reason']}: {e['message']}" for e in events if e["type"] == "Warning"]
        assert not [w for w in warnings if "repare" in w], f"{step}: {warnings}"
        figures[step] = max(starts.values())
        print(
            f"helm {step} (maxSurge 1) while a claim pod is made every second: {len(starts)} pods, longest start {figures[step]:.1f} s"
        )
    images = {
        p["spec"]["containers"][0]["image"]
        for p in kube.get("pods", RELEASE_NS)["items"]
        if p["metadata"]["labels"].get("app.kubernetes.io/instance") == DRA
    }
    assert images == {"cdiplug:0.1.0"}, images
    kube.delete_pods(TEST_NS, selector=LABEL)


def test_two_releases_never_remove_each_others_files(kube: Kube, node: dict[str, Any]) -> None:
    kube.wait_node("allocatable", FPGA, "2")
    dongle_slice(kube)
    watch = DeleteWatch(FOLDERS)
    windows: list[tuple[float, float, str]] = []  # (from, to, who was being restarted)
    try:
        for i in range(5):
            for release in (DP, DRA):
                began = time.monotonic()
                kube("rollout", "restart", "-n", RELEASE_NS, f"daemonset/{release}-cdiplug")
                rollout(kube, release)
                windows.append((began, time.monotonic(), release))
            if i in (1, 3):
                began = time.monotonic()
                pid = kube.kubelet_pid()
                os.kill(pid, signal.SIGKILL)
                subprocess.run(["timeout", "20", "tail", f"--pid={pid}", "-s", "0.1", "-f", "/dev/null"], check=True)
                subprocess.run([str(SCRIPT), "start", "kubelet"], check=True, capture_output=True, timeout=60)
                kube.wait_node("allocatable", FPGA, "2", timeout=120)
                windows.append((began, time.monotonic(), "kubelet"))
    finally:
        gone = watch.close()
    removed_by_other = []
    for at, path in gone:
        for release, marks in OWN.items():
            if not any(m in path for m in marks):
                continue
            during = {who for start, end, who in windows if start - 1 <= at <= end + 5}
            # Its own restart, or the kubelet's (which clears the device-plugin folder), explain it.
            if release in during or ("kubelet" in during and path.startswith("/var/lib/kubelet/device-plugins/")):
                continue
            removed_by_other.append((path, sorted(during) or ["nothing restarting"]))
    assert not removed_by_other, removed_by_other
    # Both keep serving: the FPGAs for pods, the dongles for claims.
    kube.wait_node("allocatable", FPGA, "2")
    dongle_slice(kube)
    kube.apply([claim_pod("after-restarts")])
    kube.wait_pod_ready("after-restarts", TEST_NS)
    kube.delete_pods(TEST_NS, selector=LABEL)
    print(
        f"two releases, 10 restarts and 2 kubelet restarts: {len(gone)} files went, none of one release while only the other restarted"
    )


def test_helm_uninstall_leaves_the_node_clean(kube: Kube, node: dict[str, Any]) -> None:
    kube("delete", "resourceclaimtemplates", "-n", TEST_NS, "-l", LABEL, "--ignore-not-found", timeout=60)
    for release in (DP, DRA):
        hooks = helm_ok(kube, "get", "hooks", release, "-n", RELEASE_NS)
        helm_ok(kube, "uninstall", release, "-n", RELEASE_NS, "--no-hooks", "--wait", "--timeout=180s")
        run_post_delete_hooks(kube, hooks)
    kube("wait", "--for=delete", "pods", "-n", RELEASE_NS, "-l", "app.kubernetes.io/name=cdiplug", "--timeout=120s", timeout=130)
    left = sorted(files_under(FOLDERS) - node["baseline"])
    assert not left, f"left on the node after helm uninstall: {left}"
    slices = [s["metadata"]["name"] for s in kube.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
    if slices:  # the kubelet deletes a driver's slices about 30 s after it unregisters, if cdiplug did not
        kube("wait", "--for=delete", *(f"resourceslice/{n}" for n in slices), "--timeout=60s", timeout=70)
    labels = [k for k in kube.get(f"node/{kube.node}")["metadata"]["labels"] if k.startswith("cdiplug.dev/")]
    assert not labels, f"node labels of ours left: {labels}"
    assert not [c["metadata"]["name"] for c in kube.get("deviceclasses")["items"] if c["metadata"]["name"] == DRIVER]
