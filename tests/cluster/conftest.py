"""Fixtures of the cluster tests: a real one-node cluster (``hack/local-cluster.sh``) and cdiplug
deployed on it from ``deploy/overlays/fake``.

``kube`` (session) brings the node up when it is not (``hack/local-cluster.sh up``; then down
again at the end unless ``CDIPLUG_CLUSTER_KEEP=1``), builds the cdiplug image from this working
tree and imports it (``hack/local-cluster.sh images``), and hands out a ``Kube``: kubectl with
the cluster's kubeconfig, and ``watch``, which waits for an object to reach a state as an event
(``kubectl get --watch``), never by sleeping. ``cdiplug`` (session)
deletes what an earlier session left, applies the fake overlay and waits for the rollout; at the end
it deletes what the session made. ``pods`` makes test pods in their own namespace and deletes them
(waiting until the kubelet has stopped them, so the next test finds every device free).

Needs root, the node kit (``../shared/k8s``), etcd-server, containernetworking-plugins, podman,
runc, debootstrap and busybox-static; a missing one fails with a message, never a skip. kubectl
and helm are the ones ``hack/get-tools.sh`` installs (put first on PATH for the whole session).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from ..deploy.chart import tools

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "local-cluster.sh"
FAKE_OVERLAY = REPO / "deploy" / "overlays" / "fake"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-cluster-test"
CDI_CRI_NAMESPACE = "cdiplug-cdi-cri-test"  # tests/cluster/overlays/cdi-cri
FPGA = "example.com/fpga"
# The fake overlay's health file (config.yaml), on the node's /var/lib/cdiplug (a hostPath).
HEALTH_FILE = Path("/var/lib/cdiplug/fake-health.yaml")
TEST_LABEL = "cdiplug.test/cluster"


def script(*args: str, timeout: float = 900) -> str:
    result = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        pytest.fail(
            f"hack/local-cluster.sh {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-6000:]}", pytrace=False
        )
    return result.stdout


class Kube:
    """kubectl against the local cluster, and waiting on objects as events."""

    def __init__(self, kubeconfig: Path, state_dir: Path, node: str) -> None:
        self.kubeconfig = kubeconfig
        self.state_dir = state_dir
        self.node = node
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def __call__(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        result = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def get(self, resource: str, namespace: str | None = None) -> dict[str, Any]:
        ns = ["-n", namespace] if namespace else []
        return json.loads(self("get", resource, *ns, "-o", "json"))

    def apply(self, manifest: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        items = [manifest] if isinstance(manifest, Mapping) else list(manifest)
        # --validate=false: this kube-apiserver build cannot serve its OpenAPI document (Go 1.27).
        self("apply", "--validate=false", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def watch(
        self,
        resource: str,
        predicate: Callable[[dict[str, Any]], bool],
        *,
        what: str,
        namespace: str | None = None,
        selector: str | None = None,
        timeout: float = 60,
    ) -> dict[str, Any]:
        """The first version of ``resource`` (``node/vm``, ``pods``) for which ``predicate`` holds.

        ``kubectl get --watch -o json`` prints each object as it is and then every change; a
        thread decodes them into a queue, this waits on the queue. Fails after ``timeout`` seconds
        naming ``what`` and showing the last version seen."""
        args = ["kubectl", "get", resource, "--watch", "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", selector]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        objects: queue.Queue[dict[str, Any] | None] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            decoder, buffer = json.JSONDecoder(), ""
            for line in proc.stdout:
                buffer += line
                if line.rstrip("\n") == "}":  # kubectl ends each object with "}" in column 0
                    obj, _ = decoder.raw_decode(buffer.strip())
                    objects.put(obj)
                    buffer = ""
            objects.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    obj = objects.get(timeout=remaining)
                except queue.Empty:
                    break
                if obj is None:
                    assert proc.stderr is not None
                    raise AssertionError(f"waiting for {what}: kubectl get --watch ended: {proc.stderr.read().strip()}")
                last = obj
                if predicate(obj):
                    return obj
        finally:
            proc.kill()
            proc.wait()
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen:\n{json.dumps(last, indent=1)[-4000:]}")

    def node_quantity(self, field: str, resource: str) -> Callable[[dict[str, Any]], str | None]:
        return lambda node: node["status"].get(field, {}).get(resource)

    def wait_node(self, field: str, resource: str, value: str | None, timeout: float = 60) -> dict[str, Any]:
        """Until the node's ``status.<field>[resource]`` is ``value`` (None: absent)."""
        return self.watch(
            f"node/{self.node}",
            lambda n: n["status"].get(field, {}).get(resource) == value,
            what=f"node {field} {resource} = {value}",
            timeout=timeout,
        )

    def wait_pod_ready(self, name: str, namespace: str, timeout: float = 90) -> dict[str, Any]:
        """The pod once Ready; on a timeout the failure shows its conditions and its events."""
        try:
            self(
                "wait",
                "-n",
                namespace,
                "--for=condition=Ready",
                f"pod/{name}",
                f"--timeout={int(timeout)}s",
                timeout=timeout + 10,
            )
        except AssertionError as exc:
            status = self.get(f"pod/{name}", namespace).get("status", {})
            events = self("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", check=False)
            raise AssertionError(f"{exc}\nconditions: {status.get('conditions')}\nevents:\n{events[-3000:]}") from None
        return self.get(f"pod/{name}", namespace)

    def delete_pods(self, namespace: str, *names: str, selector: str | None = None) -> None:
        """Delete and wait until they are gone (the kubelet has stopped them and freed their devices)."""
        which = ["-l", selector] if selector else list(names)
        self(
            "delete",
            "pod",
            "-n",
            namespace,
            *which,
            "--ignore-not-found",
            "--grace-period=1",
            "--wait=true",
            "--timeout=90s",
            timeout=120,
        )

    def remove_daemonset(self, namespace: str) -> None:
        """Delete cdiplug's DaemonSet and wait until its pod is gone (its sockets with it), then its
        namespace without waiting (the namespace controller takes its time; a later session waits
        for it if it must)."""
        self(
            "delete",
            "daemonset",
            "cdiplug",
            "-n",
            namespace,
            "--ignore-not-found",
            "--cascade=foreground",
            "--wait=true",
            "--timeout=90s",
            timeout=120,
        )
        self("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")

    def exec(self, pod: str, namespace: str, *command: str) -> str:
        return self("exec", "-n", namespace, pod, "--", *command)

    def env_of(self, pod: str, namespace: str) -> dict[str, str]:
        """The environment of the pod's container, read inside it."""
        lines = self.exec(pod, namespace, "env").splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def daemon_pod(self, namespace: str = NAMESPACE) -> dict[str, Any]:
        """cdiplug's one Ready pod (waits for it)."""
        return self.watch(
            "pods",
            lambda p: p["metadata"].get("deletionTimestamp") is None and is_ready(p),
            what=f"a Ready cdiplug pod in {namespace}",
            namespace=namespace,
            selector="app.kubernetes.io/name=cdiplug",
            timeout=90,
        )

    @staticmethod
    def metrics(pod: Mapping[str, Any]) -> dict[str, float]:
        """cdiplug's /metrics (pod IP, port 9765: the node reaches the pod network), summed per name."""
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9765/metrics", timeout=5) as response:
            text = response.read().decode()
        totals: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                sample, value = line.rsplit(" ", 1)
                name = sample.split("{")[0]
                totals[name] = totals.get(name, 0.0) + float(value)
        return totals

    @staticmethod
    def is_ready(pod: Mapping[str, Any]) -> bool:
        return is_ready(pod)

    def kubelet_pid(self) -> int:
        return int((self.state_dir / "run" / "kubelet.pid").read_text().split()[0])


def write_health(text: str) -> None:
    """Replace the fake backend's health file on the node atomically, as a ConfigMap update or an operator would."""
    HEALTH_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=HEALTH_FILE.parent, prefix=".health-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, HEALTH_FILE)


def wait_for_file(path: Path, present: bool, timeout: float = 60) -> None:
    """Until ``path`` exists (or is gone): inotify on its folder, never polling."""
    from cdiplug.toolkit.filewatch import FolderWatch

    async def settle() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        async with FolderWatch(path.parent) as watch:
            changes = aiter(watch)
            while path.exists() != present:
                await anext(changes)

    try:
        asyncio.run(asyncio.wait_for(settle(), timeout))
    except TimeoutError:
        raise AssertionError(f"{path} {'never appeared' if present else 'still there'} after {timeout} s") from None


def seed_experiment(kube: Kube) -> None:
    """deploy/examples' three pods: two Running on distinct FPGAs (``FAKE_FPGA_DEVICES``, each
    device's own variable from the CDI spec), the third Pending with ``Insufficient
    example.com/fpga`` from the real scheduler; deleted again at the end."""
    examples = str(REPO / "deploy" / "examples")
    kube("apply", "--validate=false", "-k", examples)
    try:
        devices = []
        for name in ("fpga-pod-1", "fpga-pod-2"):
            kube.wait_pod_ready(name, "default")
            env = kube.env_of(name, "default")
            devices.append(env["FAKE_FPGA_DEVICES"])
            # The device's own variable comes from the CDI spec.
            index = env["FAKE_FPGA_DEVICES"].rpartition("-")[2]
            assert env[f"FAKE_FPGA_DEVICE_{index}"] == env["FAKE_FPGA_DEVICES"]
        assert sorted(devices) == ["fpga-0", "fpga-1"]

        def unschedulable(pod: dict[str, Any]) -> bool:
            return any(
                c["type"] == "PodScheduled" and c["status"] == "False" and "Insufficient example.com/fpga" in c.get("message", "")
                for c in pod.get("status", {}).get("conditions", [])
            )

        greedy = kube.watch("pod/fpga-pod-greedy", unschedulable, namespace="default", what="fpga-pod-greedy unschedulable")
        condition = next(c for c in greedy["status"]["conditions"] if c["type"] == "PodScheduled")
        assert condition["reason"] == "Unschedulable"
        assert "0/1 nodes are available: 1 Insufficient example.com/fpga" in condition["message"]
        assert greedy["status"]["phase"] == "Pending" and not greedy["spec"].get("nodeName")
    finally:
        kube("delete", "-k", examples, "--ignore-not-found", "--grace-period=1", "--wait=true", "--timeout=90s", timeout=120)


def stream_pods(
    kube: Kube, namespace: str, manifest: Callable[[str], dict[str, Any]], action: Callable[[], None], *, at_least: int = 5
) -> dict[str, float]:
    """Make a pod (``manifest(name)``: ``during-0``, ``during-1``, ...) every second while
    ``action()`` runs, and two more after it (``at_least`` in all: an update can be over in two
    seconds); each is deleted once Ready. Returns each pod's start time (made -> Ready, seconds);
    fails naming every pod that failed or never became Ready."""
    starts: dict[str, float] = {}
    errors: list[str] = []
    done = threading.Event()
    lock = threading.Lock()
    created: list[str] = []

    def follow(name: str, made: float) -> None:
        try:
            kube.watch(
                f"pod/{name}",
                lambda p: is_ready(p) or p.get("status", {}).get("phase") == "Failed",
                namespace=namespace,
                what=f"{name} Ready",
                timeout=180,
            )
            status = kube.get(f"pod/{name}", namespace)["status"]
            with lock:
                if status.get("phase") == "Failed":
                    errors.append(f"{name} failed: {status.get('reason')}: {status.get('message')}")
                else:
                    starts[name] = time.monotonic() - made
            kube("delete", "pod", name, "-n", namespace, "--grace-period=1", "--wait=false")
        except AssertionError as exc:
            with lock:
                errors.append(f"{name}: {exc}")

    def load() -> None:
        i, after = 0, 2
        followers = []
        while after:
            if done.is_set() and i >= at_least:
                after -= 1
            name = f"during-{i}"
            made = time.monotonic()
            kube.apply([manifest(name)])
            followers.append(threading.Thread(target=follow, args=(name, made), daemon=True))
            followers[-1].start()
            i += 1
            time.sleep(max(0.0, made + 1.0 - time.monotonic()))  # the pace of the load, not a wait for a state
        for f in followers:
            f.join(240)
        created.extend(f"during-{n}" for n in range(i))

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        action()
    finally:
        done.set()
        thread.join(400)
    assert not errors, errors
    assert len(created) >= at_least and sorted(starts) == sorted(created), (created, starts)
    return starts


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def pod_manifest(name: str, limits: Mapping[str, int], *, command: str = "sleep 3600") -> dict[str, Any]:
    """A busybox pod asking for ``limits``; stops at once on SIGTERM."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": {TEST_LABEL: "true"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", f"trap 'exit 0' TERM; {command} & wait"],
                    "resources": {"limits": {k: str(v) for k, v in limits.items()}},
                }
            ],
        },
    }


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    if os.geteuid() != 0:
        pytest.fail("the cluster tests run a kubelet and containerd: run them as root", pytrace=False)
    os.environ["PATH"] = f"{tools()}:{os.environ.get('PATH', '')}"
    missing = [
        tool for tool in ("kubectl", "podman", "runc", "etcd", "debootstrap", "openssl", "curl") if shutil.which(tool) is None
    ]
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)}: apt-get install podman runc etcd-server debootstrap containernetworking-plugins busybox-static curl",
            pytrace=False,
        )
    # Left as found: brought down at the end only if this session brought it up (CI brings it up
    # and down itself; CDIPLUG_CLUSTER_KEEP=1 keeps it for the next run).
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False).returncode == 0
    script("up")
    script("images")
    env = dict(line.removeprefix("export ").split("=", 1) for line in script("env").splitlines() if "=" in line)
    kubeconfig = Path(env["KUBECONFIG"])
    state = Path(env["CDIPLUG_CLUSTER_DIR"])
    nodes = json.loads(
        subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "json"], capture_output=True, text=True, check=True
        ).stdout
    )
    (node,) = nodes["items"]
    yield Kube(kubeconfig, state, node["metadata"]["name"])
    if not was_up and not os.environ.get("CDIPLUG_CLUSTER_KEEP"):
        script("down")


@pytest.fixture(scope="session")
def cdiplug(kube: Kube) -> Iterator[dict[str, Any]]:
    """cdiplug deployed from deploy/overlays/fake, freshly (what a previous session left is deleted
    first, so the pod runs the image just built). Yields its Ready pod."""
    HEALTH_FILE.unlink(missing_ok=True)
    kube(
        "delete",
        "namespace",
        NAMESPACE,
        TEST_NAMESPACE,
        CDI_CRI_NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
        timeout=150,
    )
    kube("delete", "-k", str(REPO / "deploy" / "examples"), "--ignore-not-found", "--grace-period=1", "--wait=true", timeout=120)
    kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=120s", timeout=130)
    yield kube.daemon_pod()
    HEALTH_FILE.unlink(missing_ok=True)
    kube.remove_daemonset(NAMESPACE)
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=false")


@pytest.fixture
def pods(kube: Kube, cdiplug: dict[str, Any]) -> Iterator[Callable[..., dict[str, Any]]]:
    """``pods(name, {resource: n})`` makes a test pod and waits until it is Ready; every test pod
    is deleted at the end of the test."""

    def make(name: str, limits: Mapping[str, int], *, ready: bool = True, command: str = "sleep 3600") -> dict[str, Any]:
        kube.apply(pod_manifest(name, limits, command=command))
        return kube.wait_pod_ready(name, TEST_NAMESPACE) if ready else kube.get(f"pod/{name}", TEST_NAMESPACE)

    yield make
    kube.delete_pods(TEST_NAMESPACE, selector=TEST_LABEL)


@pytest.fixture(scope="session")
def multinode() -> Iterator[tuple[Kube, list[dict[str, Any]]]]:
    """The multi-node cluster (``hack/local-cluster.sh up --nodes``: ``CDIPLUG_NODES``, a number or
    a node file, default 3) with the cdiplug image built and imported on every node; yields a
    ``Kube`` (its ``node`` the first node) and the node list as the cluster uses it. Brought down
    at the end only if this session brought it up (and not with ``CDIPLUG_CLUSTER_KEEP=1``)."""
    if os.geteuid() != 0:
        pytest.fail("the cluster tests run kubelets and runtimes: run them as root", pytrace=False)
    os.environ["PATH"] = f"{tools()}:{os.environ.get('PATH', '')}"
    missing = [
        tool for tool in ("kubectl", "podman", "runc", "etcd", "conmon", "jq", "unshare", "nsenter") if shutil.which(tool) is None
    ]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: apt-get install podman runc etcd-server conmon jq util-linux", pytrace=False)
    import yaml

    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False).returncode == 0
    script("up", "--nodes", os.environ.get("CDIPLUG_NODES", "3"))
    script("images")
    env = dict(line.removeprefix("export ").split("=", 1) for line in script("env").splitlines() if "=" in line)
    nodes = yaml.safe_load(Path(env["CDIPLUG_NODES_FILE"]).read_text())
    yield Kube(Path(env["KUBECONFIG"]), Path(env["CDIPLUG_CLUSTER_DIR"]), nodes[0]["name"]), nodes
    if not was_up and not os.environ.get("CDIPLUG_CLUSTER_KEEP"):
        script("down")
