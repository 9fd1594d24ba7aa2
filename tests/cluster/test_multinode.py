"""cdiplug on a heterogeneous multi-node cluster on one machine (``hack/local-cluster.sh up --nodes
3``: one control plane, and per node a real kubelet 1.36 with its own runtime, containerd 2.3.4 on
node-a and node-b, CRI-O 1.36.3 on node-c, each in its own mount namespace), deployed as one
DaemonSet from ``deploy/overlays/node-config`` (each node's configuration from the node file,
``hack/nodes/default.yaml``), with the image built from this tree.

- The DaemonSet runs on every node, and each node's capacity, allocatable and ResourceSlice show
  exactly its own resources (none where it has none).
- The seed experiment across nodes: FPGA pods spread over the FPGA nodes until all are taken, on
  distinct devices (env read in the containers), the next one Pending with the scheduler's
  ``Insufficient example.com/fpga``.
- DRA "strongest first" (``firstAvailable``) with the ``cdiplug-device-first`` profile of
  ``deploy/scheduler``: to the fast node while it has a free fast device, elsewhere once they are
  taken, on idle and on busy nodes; a CEL selector that only node-c's device satisfies (guarded
  on an attribute the other devices lack) lands on node-c.
- CRI-O: a device-plugin pod with ``allocate: [cdi-cri]`` and a DRA pod get their env from our
  CDI specs through the CRI ``CDI_devices`` field (no annotations).
- A node's kubelet stopped: NotReady, new pods elsewhere; started again: Ready, devices back.
- A rolling update of the DaemonSet to a new image tag while pods hold devices: none loses its
  device, every pod created during the update starts (the longest delay is printed).
- ``down`` leaves no process, mount, namespace, bridge or route of the cluster (last test).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.multinode, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "local-cluster.sh"
OVERLAY = Path(__file__).resolve().parent / "overlays" / "multinode"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-multinode-test"
LABEL = "cdiplug.test/multinode"
FPGA = "example.com/fpga"
CDI_FPGA = "example.com/cdi-fpga"
ACCEL = "example.com/accel"
DRIVER = "accel.example.com"
DEVICE_FIRST = "cdiplug-device-first"  # deploy/scheduler/kube-scheduler-config.yaml
FAST = f'device.attributes["{DRIVER}"].speed >= 5'
# Only node-c's accelerator has a site: the guard keeps the others from failing the expression.
SITE_C = f'"site" in device.attributes["{DRIVER}"] && device.attributes["{DRIVER}"].site == "lab-c"'


def plugin_resources(node: Mapping[str, Any]) -> dict[str, str]:
    """The device-plugin resources the node file gives the node, with their counts."""
    return {
        r["name"]: str(r.get("options", {}).get("count", 2))
        for r in node["cdiplug"].get("resources", [])
        if r.get("api", "device-plugin") != "dra"
    }


def dra_devices(node: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The node's accelerators (DRA) as the node file describes them: name -> attributes."""
    out: dict[str, dict[str, Any]] = {}
    for r in node["cdiplug"].get("resources", []):
        if r.get("api") == "dra" and r["name"] == ACCEL:
            options = r.get("options", {})
            for i in range(options.get("count", 2)):
                out[f"accel-{i}"] = options.get("attributes", {}).get(f"accel-{i}", {})
    return out


def pod(
    name: str,
    *,
    limits: Mapping[str, int] | None = None,
    claim_template: str | None = None,
    node: str | None = None,
    node_name: str | None = None,
    scheduler: str | None = None,
    cpu: str | None = None,
) -> dict[str, Any]:
    """A busybox pod of the test namespace that stops at once on SIGTERM."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
        "resources": {},
    }
    spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container]}
    if limits:
        container["resources"]["limits"] = {k: str(v) for k, v in limits.items()}
    if cpu:
        container["resources"]["requests"] = {"cpu": cpu, "memory": "64Mi"}
    if claim_template:
        spec["resourceClaims"] = [{"name": "accel", "resourceClaimTemplateName": claim_template}]
        container["resources"]["claims"] = [{"name": "accel"}]
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if node_name:
        spec["nodeName"] = node_name
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": {LABEL: "true"}},
        "spec": spec,
    }


def claim_template(name: str, *alternatives: tuple[str, str | None]) -> dict[str, Any]:
    """A ResourceClaimTemplate for one accelerator: one request, or a firstAvailable list of
    (subrequest name, CEL selector) alternatives."""
    subrequests = [
        {"name": n, "deviceClassName": DRIVER, **({"selectors": [{"cel": {"expression": cel}}]} if cel else {})}
        for n, cel in alternatives
    ]
    request = {"name": "accel", **({"firstAvailable": subrequests} if len(subrequests) > 1 else {"exactly": subrequests[0]})}
    request.get("exactly", {}).pop("name", None)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": {LABEL: "true"}},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def is_unschedulable(p: dict[str, Any]) -> bool:
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in p.get("status", {}).get("conditions", [])
    )


def node_ready(n: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))


class Cluster:
    """The multi-node cluster with cdiplug deployed: kubectl, the node list, test pods."""

    def __init__(self, kube: Any, nodes: list[dict[str, Any]]) -> None:
        self.kube = kube
        self.nodes = nodes
        self.by_name = {n["name"]: n for n in nodes}

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kube.apply(list(objects))

    def ready(self, name: str, timeout: float = 120) -> dict[str, Any]:
        try:
            result: dict[str, Any] = self.kube.wait_pod_ready(name, TEST_NAMESPACE, timeout=timeout)
            return result
        except AssertionError as exc:
            status = self.kube.get(f"pod/{name}", TEST_NAMESPACE).get("status", {})
            events = self.kube(
                "get", "events", "-n", TEST_NAMESPACE, "--field-selector", f"involvedObject.name={name}", check=False
            )
            raise AssertionError(f"{exc}\nconditions: {status.get('conditions')}\nevents:\n{events[-3000:]}") from None

    def node_of(self, name: str) -> str:
        result: str = self.kube.get(f"pod/{name}", TEST_NAMESPACE)["spec"]["nodeName"]
        return result

    def env(self, name: str) -> dict[str, str]:
        result: dict[str, str] = self.kube.env_of(name, TEST_NAMESPACE)
        return result

    def claim(self, name: str) -> dict[str, Any]:
        status = self.kube.get(f"pod/{name}", TEST_NAMESPACE)["status"]
        (claim_name,) = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or []]
        result: dict[str, Any] = self.kube.get(f"resourceclaim/{claim_name}", TEST_NAMESPACE)
        return result

    def subrequest(self, name: str) -> str:
        (result,) = self.claim(name)["status"]["allocation"]["devices"]["results"]
        request: str = result["request"]
        return request

    def clean(self) -> None:
        """Every test pod and template gone, their claims unprepared: every device free again."""
        self.kube.delete_pods(TEST_NAMESPACE, selector=LABEL)
        self.kube("delete", "resourceclaimtemplates", "-n", TEST_NAMESPACE, "-l", LABEL, "--ignore-not-found", timeout=60)
        self.kube("wait", "--for=delete", "resourceclaims", "--all", "-n", TEST_NAMESPACE, "--timeout=90s", timeout=100)

    def daemon_pods(self) -> dict[str, dict[str, Any]]:
        items = self.kube.get("pods", NAMESPACE)["items"]
        return {p["spec"]["nodeName"]: p for p in items if p["metadata"].get("deletionTimestamp") is None}


@pytest.fixture(scope="module")
def cluster(multinode: tuple[Any, list[dict[str, Any]]]) -> Iterator[Cluster]:
    kube, nodes = multinode
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("apply", "--validate=false", "-k", str(OVERLAY))
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    with_dra = {n["name"] for n in nodes if dra_devices(n)}
    kube.watch(
        "resourceslices",
        lambda _: (
            {s["spec"]["nodeName"] for s in kube.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER} >= with_dra
        ),
        what=f"a {DRIVER} slice on {sorted(with_dra)}",
    )
    c = Cluster(kube, nodes)
    yield c
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150, check=False)
    kube("delete", "-k", str(OVERLAY), "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150, check=False)


@pytest.fixture
def clean(cluster: Cluster) -> Iterator[Cluster]:
    yield cluster
    cluster.clean()


def test_daemonset_runs_on_every_node_and_each_node_shows_its_own_resources(cluster: Cluster) -> None:
    kube = cluster.kube
    names = [n["name"] for n in cluster.nodes]
    daemons = cluster.daemon_pods()
    assert sorted(daemons) == sorted(names)
    for node in cluster.nodes:
        name = node["name"]
        assert kube.is_ready(daemons[name]), f"cdiplug on {name} is not Ready"
        expected = plugin_resources(node)

        def own(n: dict[str, Any], field: str) -> dict[str, str]:
            # A resource an earlier test's configuration served (test_mixed_fleet switches node
            # configurations) stays on the node at allocatable 0: the kubelet keeps a gone
            # plugin's resource. Only what is allocatable counts.
            allocatable = n["status"].get("allocatable", {})
            return {
                k: v
                for k, v in n["status"].get(field, {}).items()
                if k.startswith("example.com/") and (k in expected or allocatable.get(k, "0") != "0")
            }

        got = kube.watch(
            f"node/{name}",
            lambda n: own(n, "capacity") == expected and own(n, "allocatable") == expected,
            what=f"{name}'s capacity and allocatable = {expected}",
        )
        assert own(got, "capacity") == own(got, "allocatable") == expected
        # Its DRA devices, with its own attributes, in its own slice only.
        slices = [
            s for s in kube.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == name
        ]
        devices = {d["name"]: d["attributes"] for s in slices for d in s["spec"].get("devices") or []}
        wanted = dra_devices(node)
        assert sorted(devices) == sorted(wanted), name
        for device, attributes in wanted.items():
            for key, value in attributes.items():
                kind = "int" if isinstance(value, int) else "string"
                assert devices[device][key] == {kind: value}, (name, device, key)
            assert "site" in devices[device] or "site" not in attributes
    # The runtimes are the node file's.
    runtimes = {n["metadata"]["name"]: n["status"]["nodeInfo"]["containerRuntimeVersion"] for n in kube.get("nodes")["items"]}
    for node in cluster.nodes:
        assert runtimes[node["name"]].startswith("cri-o://" if node["runtime"] == "cri-o" else "containerd://")


def test_seed_experiment_fpga_pods_spread_until_all_are_taken(clean: Cluster) -> None:
    c = clean
    fpga_nodes = {n["name"]: int(plugin_resources(n)[FPGA]) for n in c.nodes if FPGA in plugin_resources(n)}
    total = sum(fpga_nodes.values())
    assert len(fpga_nodes) >= 2, "the node file should give FPGAs to two nodes at least"
    names = [f"fpga-{i}" for i in range(total)]
    c.apply(*(pod(n, limits={FPGA: 1}) for n in names))
    placed: dict[str, list[str]] = {}
    for n in names:
        c.ready(n)
        placed.setdefault(c.node_of(n), []).append(c.env(n)["FAKE_FPGA_DEVICES"])
    # Every FPGA of every FPGA node taken, each pod on a device of its own.
    assert {node: sorted(devices) for node, devices in placed.items()} == {
        node: [f"fpga-{i}" for i in range(count)] for node, count in fpga_nodes.items()
    }
    c.apply(pod("fpga-one-too-many", limits={FPGA: 1}))
    p = c.kube.watch("pod/fpga-one-too-many", is_unschedulable, namespace=TEST_NAMESPACE, what="the next FPGA pod unschedulable")
    (condition,) = [x for x in p["status"]["conditions"] if x["type"] == "PodScheduled"]
    assert f"{len(c.nodes)} Insufficient {FPGA}" in condition["message"], condition
    assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")


def fast_nodes(c: Cluster) -> dict[str, int]:
    return {
        n["name"]: len(devices) for n in c.nodes if (devices := [d for d, a in dra_devices(n).items() if a.get("speed", 0) >= 5])
    }


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_strongest_first_goes_to_the_fast_node_while_it_has_a_free_fast_device(clean: Cluster, busy: bool) -> None:
    c = clean
    fast = fast_nodes(c)
    (fast_node, count) = next(iter(fast.items()))
    assert len(fast) == 1, "the node file should have fast accelerators on one node"
    c.apply(claim_template("strongest", ("fast", FAST), ("any", None)))
    if busy:
        # A dozen pods with requests on the fast node (bound there directly): the scheduler's
        # resource scores now prefer the other nodes.
        load = [f"load-{i}" for i in range(12)]
        c.apply(*(pod(n, node_name=fast_node, cpu="120m") for n in load))
        for n in load:
            c.ready(n)
        # What the default profile does here, for the record (it weighs the device's rank as one
        # score of many): printed, not asserted.
        c.apply(pod("default-profile", claim_template="strongest"))
        c.ready("default-profile")
        print(
            f"busy {fast_node}: the default profile placed a strongest-first claim on {c.node_of('default-profile')} ({c.subrequest('default-profile')})"
        )
        c.kube.delete_pods(TEST_NAMESPACE, "default-profile")
    started = time.monotonic()
    for i in range(count):
        name = f"strong-{i}"
        c.apply(pod(name, claim_template="strongest", scheduler=DEVICE_FIRST))
        c.ready(name)
        assert (c.node_of(name), c.subrequest(name)) == (fast_node, "accel/fast"), name
        assert c.env(name)["FAKE_ACCEL_DEVICES"] == c.claim(name)["status"]["allocation"]["devices"]["results"][0]["device"]
    # The fast ones are taken: the next goes to another node, on the fallback.
    c.apply(pod("strong-fallback", claim_template="strongest", scheduler=DEVICE_FIRST))
    c.ready("strong-fallback")
    assert c.node_of("strong-fallback") != fast_node and c.subrequest("strong-fallback") == "accel/any"
    print(f"{'busy' if busy else 'idle'}: {count + 1} strongest-first pods placed in {time.monotonic() - started:.1f} s")


def test_a_selector_only_node_c_satisfies_lands_on_node_c(clean: Cluster) -> None:
    c = clean
    with_site = [n["name"] for n in c.nodes if any("site" in a for a in dra_devices(n).values())]
    assert with_site, "the node file should give one node's accelerator a site"
    c.apply(claim_template("site-c", ("site", SITE_C)), pod("on-site", claim_template="site-c"))
    c.ready("on-site")
    assert c.node_of("on-site") == with_site[0]
    assert c.env("on-site")["FAKE_ACCEL_DEVICES"] == "accel-0"


def test_cri_o_node_injects_our_cdi_specs_for_device_plugin_and_dra_pods(clean: Cluster) -> None:
    c = clean
    crio = [n for n in c.nodes if n["runtime"] == "cri-o"]
    assert crio, "the node file should have a CRI-O node"
    node = crio[0]["name"]
    log = c.kube.state_dir / "logs" / f"{node}.crio.log"
    offset = log.stat().st_size
    # Device plugin, allocate: [cdi-cri]: the Allocate answer names the CDI device only; the env
    # comes from the spec, through the CRI CDI_devices field.
    c.apply(pod("crio-plugin", limits={CDI_FPGA: 1}))
    c.ready("crio-plugin")
    assert c.node_of("crio-plugin") == node
    env = c.env("crio-plugin")
    assert env.get("FAKE_CDI_FPGA_DEVICE_0") == "cdi-fpga-0", "CRI-O did not apply the CDI spec"
    assert "FAKE_CDI_FPGA_DEVICES" not in env, "the Allocate answer carried env although allocate is [cdi-cri]"
    # DRA: the claim's own CDI spec, named by the kubelet in the same field.
    c.apply(claim_template("site-c", ("site", SITE_C)), pod("crio-dra", claim_template="site-c"))
    c.ready("crio-dra")
    assert c.node_of("crio-dra") == node
    env = c.env("crio-dra")
    assert env.get("FAKE_ACCEL_DEVICES") == "accel-0" and env.get("FAKE_ACCEL_DEVICE_0") == "accel-0", env
    # CRI-O says so whenever a CDI device comes as an annotation: none did.
    with log.open() as f:
        f.seek(offset)
        assert "Passing CDI devices as annotations" not in f.read()


def test_a_stopped_kubelet_makes_its_node_not_ready_and_pods_go_elsewhere(clean: Cluster) -> None:
    c = clean
    kube = c.kube
    fpga_nodes = [n["name"] for n in c.nodes if FPGA in plugin_resources(n)]
    down, other = fpga_nodes[0], fpga_nodes[1]
    started = time.monotonic()
    subprocess.run([str(SCRIPT), "stop", f"{down}.kubelet"], check=True, capture_output=True, timeout=60)
    try:
        kube.watch(f"node/{down}", lambda n: not node_ready(n), what=f"{down} NotReady", timeout=90)
        not_ready = time.monotonic() - started
        kube.watch(
            f"node/{down}",
            # NoSchedule is what keeps new pods off (the NoExecute one every pod tolerates for 300 s),
            # and the node-lifecycle controller may add it a moment after the other
            lambda n: any(
                t["key"] == "node.kubernetes.io/unreachable" and t.get("effect") == "NoSchedule"
                for t in n["spec"].get("taints") or []
            ),
            what=f"{down} tainted unreachable:NoSchedule",
            timeout=30,
        )
        for i in range(2):
            c.apply(pod(f"elsewhere-{i}", limits={FPGA: 1}))
            c.ready(f"elsewhere-{i}")
            assert c.node_of(f"elsewhere-{i}") == other
    finally:
        subprocess.run([str(SCRIPT), "start", f"{down}.kubelet"], check=True, capture_output=True, timeout=60)
    restarted = time.monotonic()
    kube.watch(f"node/{down}", node_ready, what=f"{down} Ready again", timeout=90)
    kube.watch(
        f"node/{down}",
        lambda n: n["status"]["allocatable"].get(FPGA) == plugin_resources(c.by_name[down])[FPGA],
        what=f"{down}'s FPGAs back",
        timeout=60,
    )
    # The restarted kubelet reports the FPGAs from its checkpoint before cdiplug has registered
    # again and listed them: a pod admitted in that gap is refused (UnexpectedAdmissionError,
    # "Available: 0"; seen once in CI), the kubelet's own race after its restart. One refused pod
    # is made again once the plugin had time to register (about 60 ms after the kubelet's
    # registration server is up); a second refusal fails the test.
    for attempt in range(2):
        c.apply(pod("back-again", limits={FPGA: 1}, node=down))
        try:
            c.ready("back-again", timeout=60 if attempt == 0 else 120)
            break
        except AssertionError as exc:
            if attempt or "UnexpectedAdmissionError" not in str(exc):
                raise
            kube("delete", "pod", "back-again", "-n", TEST_NAMESPACE, "--wait=true", "--timeout=60s", timeout=90)
    print(
        f"{down}: NotReady {not_ready:.1f} s after its kubelet stopped; Ready, FPGAs back and a pod running {time.monotonic() - restarted:.1f} s after its start"
    )


class AdmissionRejected(AssertionError):
    """A pod the kubelet refused (UnexpectedAdmissionError) while its node's cdiplug was replaced."""


# Known gap, seen here: a device-plugin pod the scheduler binds to a node in the seconds between
# the old cdiplug pod's stop and the new one's registration is refused by the kubelet ("Allocate
# failed due to no healthy devices present; cannot allocate unhealthy devices example.com/fpga")
# and fails for good. The kubelet marks a stopped plugin's devices unhealthy at once, while the
# node's allocatable (what the scheduler reads) follows a status update later. Closing it needs
# the daemon to hand over without a gap (the new pod registering before the old one leaves, a
# maxSurge rollout, which the daemon's fixed socket names do not allow today). Only that refusal
# is expected to fail here; anything else (a holder losing its device, a DRA pod not starting,
# a timeout) fails the test. A DRA pod bound in that gap does start, but late: its first prepare
# meets no driver (the old socket gone, the new one not yet registered) and the kubelet tries again
# on its own schedule, seen here 86-90 s later; the pod's wait (180 s) allows for that.
@pytest.mark.xfail(
    raises=AdmissionRejected, strict=False, reason="kubelet refuses device-plugin pods bound during the daemon's swap"
)
def test_rolling_update_keeps_every_device_and_starts_every_new_pod(clean: Cluster) -> None:
    c = clean
    kube = c.kube
    fpga_nodes = [n["name"] for n in c.nodes if FPGA in plugin_resources(n)]
    holders = [pod(f"holds-{n}", limits={FPGA: 1}, node=n) for n in fpga_nodes]
    # The accelerator holder on a node with another one free: the load below meets every node.
    roomy = next(n["name"] for n in c.nodes if len(dra_devices(n)) >= 2)
    c.apply(claim_template("one", ("one", None)), *holders, pod("holds-accel", claim_template="one", node=roomy))
    names = [h["metadata"]["name"] for h in holders] + ["holds-accel"]
    before = {}
    for n in names:
        p = c.ready(n)
        env = c.env(n)
        before[n] = (
            p["status"]["containerStatuses"][0]["containerID"],
            env.get("FAKE_FPGA_DEVICES") or env.get("FAKE_ACCEL_DEVICES"),
        )
    old_daemons = {node: p["metadata"]["uid"] for node, p in c.daemon_pods().items()}

    tag = "0.1.0-rolling"
    subprocess.run([str(SCRIPT), "images", tag], check=True, capture_output=True, timeout=600)
    kube("set", "image", "-n", NAMESPACE, "daemonset/cdiplug", f"cdiplug=cdiplug:{tag}")

    delays: list[tuple[str, float, str]] = []
    errors: list[str] = []
    rejected: list[str] = []
    done = threading.Event()

    accel_nodes = [n["name"] for n in c.nodes if dra_devices(n)]

    def load() -> None:
        # One pod at a time, a device-plugin FPGA and a DRA accelerator in turn, each on the next
        # node that has one (so every node's update window is met), each deleted once it runs,
        # until the update is over (and one more after).
        i = 0
        while True:
            last = done.is_set()
            name = f"during-{i}"
            if i % 2 == 0:
                manifest = pod(name, limits={FPGA: 1}, node=fpga_nodes[(i // 2) % len(fpga_nodes)])
            else:
                manifest = pod(name, claim_template="one", node=accel_nodes[(i // 2) % len(accel_nodes)])
            t0 = time.monotonic()
            try:
                c.apply(manifest)
                # Running and Ready, or refused for good by the kubelet (phase Failed).
                p = kube.watch(
                    f"pod/{name}",
                    lambda p: kube.is_ready(p) or p.get("status", {}).get("phase") == "Failed",
                    namespace=TEST_NAMESPACE,
                    what=f"{name} Ready",
                    timeout=180,
                )
                status = p.get("status", {})
                if status.get("phase") == "Failed":
                    # Only a device-plugin pod's admission refusal is the known gap; a DRA pod's is not.
                    if status.get("reason") != "UnexpectedAdmissionError" or i % 2:
                        errors.append(f"{name} failed: {status.get('reason')}: {status.get('message')}")
                        return
                    rejected.append(f"{name} on {c.node_of(name)} after {time.monotonic() - t0:.1f} s: {status.get('message')}")
                else:
                    delays.append((name, time.monotonic() - t0, c.node_of(name)))
                kube.delete_pods(TEST_NAMESPACE, name)
            except AssertionError as exc:
                errors.append(f"{name}: {exc}")
                return
            i += 1
            if last:
                return

    thread = threading.Thread(target=load, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=300s", timeout=310)
    finally:
        done.set()
        thread.join(400)
    took = time.monotonic() - started
    assert not errors, errors
    daemons = c.daemon_pods()
    assert all(d["spec"]["containers"][0]["image"] == f"cdiplug:{tag}" for d in daemons.values())
    assert all(d["metadata"]["uid"] != old_daemons[node] for node, d in daemons.items())
    for n in names:
        p = kube.get(f"pod/{n}", TEST_NAMESPACE)
        (status,) = p["status"]["containerStatuses"]
        env = c.env(n)
        assert (status["containerID"], env.get("FAKE_FPGA_DEVICES") or env.get("FAKE_ACCEL_DEVICES")) == before[n], n
        assert status["restartCount"] == 0 and status["ready"]
    # The load met the update: three pods at least were made during it, started or (the known gap
    # below) refused; a refused one counts, it is the update's window the load was meant to meet.
    assert len(delays) + len(rejected) >= 3, (delays, rejected)
    print(
        f"rolling update over {len(c.nodes)} nodes took {took:.1f} s; {len(delays)} pods started during it"
        + (f", {len(rejected)} refused" if rejected else "")
        + ": "
        + ", ".join(f"{n} {d:.1f}s@{node}" for n, d, node in delays)
    )
    if rejected:
        raise AdmissionRejected("pods rejected by the kubelet during the update: " + "; ".join(rejected))


def our_namespaces(state: Path) -> set[str]:
    return {p.read_text().strip() for p in (state / "nodes").glob("*/mntns")}


def test_down_leaves_no_process_mount_namespace_or_interface(cluster: Cluster) -> None:
    state = cluster.kube.state_dir
    namespaces = our_namespaces(state)
    assert len(namespaces) == len(cluster.nodes)
    pids = [int(p.read_text().split()[0]) for p in (state / "run").glob("*.pid")]
    assert pids
    bridges = [f"cdiplugn{i}" for i in range(1, len(cluster.nodes) + 1)]
    subprocess.run([str(SCRIPT), "down"], check=True, capture_output=True, timeout=300)

    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not alive, f"still running after down: {alive}"
    in_ours = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "ns" / "mnt") in namespaces:
                    in_ours.append(proc.name)
            except OSError:
                continue
    assert not in_ours, f"processes left in the nodes' mount namespaces: {in_ours}"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert not [m for m in mounts if m.startswith(str(state))], "mounts of the state folder left on the host"
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout)
    names = {link["ifname"] for link in links}
    assert not names & set(bridges), names & set(bridges)
    assert not [link for link in links if link.get("master") in bridges], "veths left on our bridges"
    route = subprocess.run(["ip", "route", "show", "10.244.0.0/16"], capture_output=True, text=True, check=True).stdout
    assert "unreachable" not in route, route
    assert not Path("/run/cdiplug").exists()
