"""A mixed fleet on the multi-node local cluster: one DaemonSet, one ConfigMap, node labels both ways.

``hack/local-cluster.sh up --nodes 3`` (real kubelets 1.36, containerd and CRI-O), cdiplug deployed
from ``tests/cluster/overlays/mixed-fleet`` (``deploy/overlays/mixed-fleet`` with the test's named
configurations) after the multinode overlay is removed. node-a is labelled
``cdiplug.dev/config=slow-fpga``, node-b ``fast-fpga``, node-c nothing (``default``: no FPGAs).

- Each node gets its configuration from the one ConfigMap; cdiplug labels each node with what it
  found (``cdiplug.dev/example.com.fpga.speed``); node-c, without FPGAs, shows no
  ``example.com/fpga`` at all and no such labels.
- A classic pod with node affinity ``cdiplug.dev/example.com.fpga.speed Gt 5`` lands on node-b.
- Relabelling node-a switches its resources live (the daemon pod is not restarted); the FPGA
  labels disappear when the resource leaves its configuration.
- An unknown name keeps the old configuration and shows a ConfigurationError Event on the node.
- The admission policy refuses the daemon's own token (inside its pod) a label on another node
  and a label of another prefix on its own.
- A live handover from the device plugin to DRA (node-b relabelled ``fast-fpga-dra``) while a
  classic pod holds an FPGA: that device is published tainted; classic pods made one after
  another throughout keep starting, through the device plugin before and through DRA after (the
  DeviceClass's ``extendedResourceName``), never on the held device, and only those bound in the
  window before the scheduler sees node-b's allocatable drop are refused by the kubelet; a DRA
  claim made meanwhile gets the other device and a second waits until the classic pod is deleted.
  Then back to the device plugin while both claims' pods run: the slice goes at once, each pod
  can still be deleted (the kubelet unprepares through the drained driver), and each device
  comes back to the device plugin only once its pod is gone.

Run by the lead: ``pytest -m multinode tests/cluster/test_mixed_fleet.py``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.multinode, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
OVERLAY = HERE / "overlays" / "mixed-fleet"
MULTINODE_OVERLAY = HERE / "overlays" / "multinode"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-mixed-fleet-test"
LABEL = "cdiplug.test/mixed-fleet"
STREAM = "cdiplug.test/classic-stream"
CONFIG_LABEL = "cdiplug.dev/config"
FPGA, DONGLE = "example.com/fpga", "example.com/dongle"
SPEED = "cdiplug.dev/example.com.fpga.speed"
COUNT = "cdiplug.dev/example.com.fpga.count"
KINDS = {"node-a": "slow-fpga", "node-b": "fast-fpga", "node-c": None}


def ours(node: dict[str, Any]) -> dict[str, str]:
    labels = node["metadata"].get("labels") or {}
    return {k: v for k, v in labels.items() if k.startswith("cdiplug.dev/") and k != CONFIG_LABEL}


def label(kube: Any, node: str, value: str | None) -> None:
    kube("label", "node", node, "--overwrite", f"{CONFIG_LABEL}={value}" if value else f"{CONFIG_LABEL}-")


def pod(name: str, affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                "resources": {"limits": {FPGA: "1"}},
            }
        ],
    }
    if affinity:
        spec["affinity"] = affinity
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": {LABEL: "true"}},
        "spec": spec,
    }


def daemon_pods(kube: Any) -> dict[str, dict[str, Any]]:
    return {
        p["spec"]["nodeName"]: p for p in kube.get("pods", NAMESPACE)["items"] if p["metadata"].get("deletionTimestamp") is None
    }


@pytest.fixture(scope="module")
def fleet(multinode: tuple[Any, list[dict[str, Any]]]) -> Iterator[Any]:
    kube, nodes = multinode
    assert {n["name"] for n in nodes} >= set(KINDS), "the node file should have node-a, node-b and node-c"
    # The multinode tests' DaemonSet (same name, same namespace) goes first, namespace and all.
    kube("delete", "-k", str(MULTINODE_OVERLAY), "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150, check=False)
    kube("wait", "--for=delete", f"namespace/{NAMESPACE}", "--timeout=120s", timeout=150, check=False)
    for node, kind in KINDS.items():
        label(kube, node, kind)
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("apply", "--validate=false", "-k", str(OVERLAY), timeout=120)
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    yield kube
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150, check=False)
    kube("delete", "-k", str(OVERLAY), "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150, check=False)
    for node in KINDS:
        label(kube, node, None)


def test_each_node_kind_from_one_configmap_with_its_labels(fleet: Any) -> None:
    kube = fleet
    started = time.monotonic()
    for node, speed in (("node-a", "1"), ("node-b", "9")):
        got = kube.watch(
            f"node/{node}",
            lambda n, s=speed: ours(n).get(SPEED) == s and n["status"].get("allocatable", {}).get(FPGA) == "2",
            what=f"{node}: {SPEED}={speed} and 2 FPGAs allocatable",
            timeout=120,
        )
        assert ours(got)[COUNT] == "2"
    print(f"labels and FPGAs on node-a and node-b {time.monotonic() - started:.1f} s after the rollout")
    node_c = kube.get("node/node-c")
    assert FPGA not in node_c["status"].get("capacity", {}), "a node without FPGAs must not show example.com/fpga"
    assert not any(k.startswith("cdiplug.dev/example.com.fpga.") for k in ours(node_c))


def test_node_affinity_on_the_speed_label_lands_on_the_fast_node(fleet: Any) -> None:
    kube = fleet
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": SPEED, "operator": "Gt", "values": ["5"]}]}]
            }
        }
    }
    kube.apply(pod("fast", affinity))
    try:
        kube.wait_pod_ready("fast", TEST_NAMESPACE, timeout=120)
        assert kube.get("pod/fast", TEST_NAMESPACE)["spec"]["nodeName"] == "node-b"
    finally:
        kube.delete_pods(TEST_NAMESPACE, selector=LABEL)


def test_a_label_change_switches_live_and_an_unknown_name_keeps_the_last_good(fleet: Any) -> None:
    kube = fleet
    before = daemon_pods(kube)["node-a"]
    try:
        started = time.monotonic()
        label(kube, "node-a", "dongles")  # the FPGAs leave node-a's configuration, a dongle comes
        got = kube.watch(
            "node/node-a",
            lambda n: "cdiplug.dev/example.com.dongle.count" in ours(n) and COUNT not in ours(n) and SPEED not in ours(n),
            what="node-a: the dongle's labels, the FPGA's gone",
            timeout=120,
        )
        kube.watch(
            "node/node-a", lambda n: n["status"].get("allocatable", {}).get(DONGLE) == "1", what="node-a: a dongle", timeout=120
        )
        print(f"node-a switched to 'dongles' {time.monotonic() - started:.1f} s after its label changed")
        assert ours(got)["cdiplug.dev/example.com.dongle.count"] == "1"

        label(kube, "node-a", "no-such-kind")
        events = kube.watch(
            "events",
            lambda e: any(
                i["reason"] == "ConfigurationError" and "no configuration named 'no-such-kind'" in i["message"]
                for i in e.get("items", [e])
            ),
            what="a ConfigurationError Event on node-a",
            namespace="default",
            timeout=120,
        )
        assert events
        node_a = kube.get("node/node-a")
        assert node_a["status"]["allocatable"].get(DONGLE) == "1" and "cdiplug.dev/example.com.dongle.count" in ours(node_a)
        described = kube("describe", "node", "node-a")
        assert "ConfigurationError" in described, described[-2000:]

        label(kube, "node-a", "slow-fpga")
        kube.watch("node/node-a", lambda n: ours(n).get(SPEED) == "1", what="node-a back to slow-fpga", timeout=120)
        after = daemon_pods(kube)["node-a"]
        assert after["metadata"]["uid"] == before["metadata"]["uid"], "the daemon pod was replaced: the switch was not live"
        assert after["status"]["containerStatuses"][0]["restartCount"] == before["status"]["containerStatuses"][0]["restartCount"]
    finally:
        label(kube, "node-a", "slow-fpga")


PROBE = """
import asyncio, sys
from cdiplug.kube.client import connect
async def main():
    client = connect()
    for node, labels in ((sys.argv[1], {"cdiplug.dev/x": "1"}), (sys.argv[2], {"example.com/x": "1"})):
        try:
            await client.patch_node(node, {"metadata": {"labels": labels}})
            print("ACCEPTED", node, labels)
        except Exception as exc:
            print("REFUSED", node, type(exc).__name__, str(exc)[:300])
    await client.close()
asyncio.run(main())
"""


def test_the_admission_policy_holds_the_daemons_own_token(fleet: Any) -> None:
    kube = fleet
    name = daemon_pods(kube)["node-a"]["metadata"]["name"]
    out = kube.exec(name, NAMESPACE, "python3", "-c", PROBE, "node-b", "node-a")
    lines = out.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("REFUSED") for line in lines), out
    assert all("cdiplug-node-labels-own-node" in line for line in lines), out
    for node in ("node-a", "node-b"):
        labels = kube.get(f"node/{node}")["metadata"].get("labels") or {}
        assert "cdiplug.dev/x" not in labels and "example.com/x" not in labels, json.dumps(labels)


DRIVER = "fpga.example.com"
HANDOVER_TAINT = "cdiplug.dev/device-plugin-pod"
SCHEDULER_SLACK = 2.0
"""Seconds the scheduler may take, after our own watch, to see node-b's allocatable drop."""


def dra_pod(name: str) -> list[dict[str, Any]]:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": {LABEL: "true"}},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    p = pod(name)
    container = p["spec"]["containers"][0]
    container["resources"] = {"claims": [{"name": "fpga"}]}
    p["spec"]["resourceClaims"] = [{"name": "fpga", "resourceClaimName": name}]
    p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
    return [claim, p]


def slice_devices(kube: Any) -> dict[str, list[str]]:
    """node-b's fpga.example.com devices -> their taint keys."""
    out: dict[str, list[str]] = {}
    for s in kube.get("resourceslices")["items"]:
        if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == "node-b":
            for d in s["spec"].get("devices") or []:
                out[d["name"]] = [t["key"] for t in d.get("taints") or []]
    return out


@attrs.frozen
class Started:
    """One pod of the classic stream: when it was made, how long it took to run (or why not)."""

    name: str
    created: float  # monotonic
    waited: float  # seconds until Running, or until refused
    device: str | None  # FAKE_FPGA_DEVICES inside it
    through_dra: bool  # the scheduler made a claim for its extended resource (KEP-5004)
    refused: str | None = None  # the pod's reason and message when it did not run


class ClassicStream:
    """Classic ``example.com/fpga`` pods on node-b, one after another, from a thread: each is made,
    waited for until it runs (or is refused), its device read inside it, and deleted."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self.pods: list[Started] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="classic stream", daemon=True)

    def __enter__(self) -> ClassicStream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=300)
        assert not self._thread.is_alive(), "the classic stream did not stop"

    def wait_for(self, predicate: Callable[[Started], bool], what: str, timeout: float = 180) -> Started:
        """The first pod for which ``predicate`` holds (waits on the stream's condition)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if self.error is not None:
                    raise AssertionError(f"the classic stream failed: {self.error!r}")
                found = next((p for p in self.pods if predicate(p)), None)
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    raise AssertionError(f"waiting for {what}: classic pods so far {self.pods}")
                self._changed.wait(remaining)

    def _run(self) -> None:
        try:
            for i in itertools.count():
                if self._stop.is_set():
                    return
                started = self._one(f"stream-{i}")
                with self._changed:
                    self.pods.append(started)
                    self._changed.notify_all()
        except BaseException as exc:  # shown by wait_for and by the test
            with self._changed:
                self.error = exc
                self._changed.notify_all()

    def _one(self, name: str) -> Started:
        manifest = pod(name)
        manifest["metadata"]["labels"][STREAM] = "true"
        manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
        created = time.monotonic()
        self.kube.apply(manifest)
        try:
            got = self.kube.watch(
                f"pod/{name}",
                lambda p: p.get("status", {}).get("phase") in ("Running", "Failed", "Succeeded"),
                namespace=TEST_NAMESPACE,
                what=f"{name} running or refused",
                timeout=180,
            )
            waited = time.monotonic() - created
            status = got["status"]
            through_dra = bool((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))
            if status["phase"] != "Running":
                return Started(name, created, waited, None, through_dra, f"{status.get('reason')}: {status.get('message')}")
            device = self.kube.env_of(name, TEST_NAMESPACE).get("FAKE_FPGA_DEVICES")
            return Started(name, created, waited, device, through_dra)
        finally:
            self.kube.delete_pods(TEST_NAMESPACE, name)


def test_a_live_handover_to_dra_never_gives_a_claim_the_classic_pods_device(fleet: Any) -> None:
    kube = fleet
    classic = pod("classic")
    classic["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
    kube.apply(classic)
    stream = ClassicStream(kube)
    try:
        kube.wait_pod_ready("classic", TEST_NAMESPACE, timeout=120)
        held = kube.env_of("classic", TEST_NAMESPACE)["FAKE_FPGA_DEVICES"]
        free = ({"fpga-0", "fpga-1"} - {held}).pop()
        with stream:
            stream.wait_for(lambda p: p.refused is None and not p.through_dra, "a classic pod through the device plugin")
            started = time.monotonic()
            label(kube, "node-b", "fast-fpga-dra")
            kube.watch(
                "resourceslices",
                lambda _: slice_devices(kube) == {held: [HANDOVER_TAINT], free: []},
                what=f"node-b's slice: {held} tainted {HANDOVER_TAINT}, {free} free",
                timeout=120,
            )
            published = time.monotonic()
            print(f"handover: the held device published tainted {published - started:.1f} s after the label changed")
            kube.watch(
                "node/node-b",
                lambda n: n["status"].get("allocatable", {}).get(FPGA) in (None, "0"),
                what="no classic FPGA on node-b",
            )
            no_classic = time.monotonic()
            # Classic pods go on starting, now through DRA (the DeviceClass's extendedResourceName).
            for _ in range(2):
                made_after = max(p.created for p in stream.pods)
                stream.wait_for(
                    lambda p, t=made_after: p.created > t and p.through_dra and p.refused is None,
                    "a classic pod made after the handover, through DRA",
                )
        assert stream.error is None, repr(stream.error)
        for p in stream.pods:
            outcome = (
                f"refused after {p.waited:.1f} s: {p.refused}" if p.refused else f"running after {p.waited:.1f} s on {p.device}"
            )
            how = "through DRA" if p.through_dra else "device plugin"
            print(f"handover: {p.name} made at {p.created - started:+.1f} s, {outcome} ({how})")
        window = no_classic - started
        print(f"handover: the scheduler saw no classic FPGA on node-b {window:.1f} s after the label changed")
        assert not [p for p in stream.pods if p.device == held], f"a classic pod got {held}, which 'classic' holds"
        # Before the label change the device plugin serves classic pods; once node-b's allocatable
        # shows 0, the scheduler serves them through DRA. Between the two (one kubelet node-status
        # update: the kubelet knows before the scheduler) a pod the scheduler still sends to the
        # device plugin is refused by the kubelet's admission, as for any device plugin that goes;
        # a controller's replacement then runs through DRA. Nothing else may refuse a pod.
        refused = [p for p in stream.pods if p.refused]
        late = [p for p in refused if p.created + p.waited < started or p.created > no_classic + SCHEDULER_SLACK]
        assert not late, f"classic pods refused outside the handover's window of {window:.1f} s: {late}"
        # The kubelet's admission refusal: "no healthy devices", "endpoint ... stopped", or the
        # device plugin's GetPreferredAllocation cut off as its socket goes.
        assert all(p.refused.startswith("UnexpectedAdmissionError") for p in refused), refused  # type: ignore[union-attr]
        ran = [p for p in stream.pods if not p.refused]
        assert all(p.device == free for p in ran), ran
        before = [p.through_dra for p in ran if p.created < started]
        assert before and not any(before), ran
        assert all(p.through_dra for p in ran if p.created > no_classic + SCHEDULER_SLACK), ran

        # The stream's claims (made by the scheduler for their extended resource) go with their pods.
        kube("wait", "--for=delete", "resourceclaims", "--all", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70, check=False)
        kube.apply(dra_pod("claim-a"))
        kube.wait_pod_ready("claim-a", TEST_NAMESPACE, timeout=120)
        assert kube.env_of("claim-a", TEST_NAMESPACE)["FAKE_FPGA_DEVICES"] == free
        kube.apply(dra_pod("claim-b"))  # only the classic pod's device is left: it waits
        kube.watch(
            "pod/claim-b",
            lambda p: any(
                c["type"] == "PodScheduled" and c["status"] == "False" for c in p.get("status", {}).get("conditions", [])
            ),
            namespace=TEST_NAMESPACE,
            what="claim-b unschedulable while the classic pod holds its device",
            timeout=120,
        )
        deleted = time.monotonic()
        kube.delete_pods(TEST_NAMESPACE, "classic")
        kube.wait_pod_ready("claim-b", TEST_NAMESPACE, timeout=180)  # PodResources is polled every 5 s
        assert kube.env_of("claim-b", TEST_NAMESPACE)["FAKE_FPGA_DEVICES"] == held
        print(
            f"handover: the classic pod's device went to a DRA claim {time.monotonic() - deleted:.1f} s after the pod was deleted"
        )

        # The way back while both claims' pods run: their devices stay out of the device plugin's
        # hands, and the DRA driver stays for the kubelet to unprepare them (else they stay Terminating).
        (ours_b,) = [
            s["metadata"]["name"]
            for s in kube.get("resourceslices")["items"]
            if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == "node-b"
        ]
        back = time.monotonic()
        label(kube, "node-b", "fast-fpga")
        kube("wait", "--for=delete", f"resourceslice/{ours_b}", "--timeout=120s", timeout=130)  # withdrawn first
        for name, left in (("claim-a", "1"), ("claim-b", "2")):  # 1: claim-b's device is not handed out
            kube.delete_pods(TEST_NAMESPACE, name)  # fails if the kubelet cannot unprepare it
            kube.watch(
                "node/node-b",
                lambda n, v=left: n["status"]["allocatable"].get(FPGA) == v,
                what=f"{left} classic FPGAs on node-b once {name} is gone",
                timeout=120,
            )
        print(
            f"handover: back to the device plugin, both claims' pods gone, {time.monotonic() - back:.1f} s after the label changed"
        )
    except AssertionError:
        print("classic stream:", *stream.pods, sep="\n  ")
        print(kube("get", "pods", "-n", TEST_NAMESPACE, "-o", "wide", check=False))
        print(kube("logs", "-n", NAMESPACE, daemon_pods(kube)["node-b"]["metadata"]["name"], "--tail=100", check=False))
        raise
    finally:
        kube.delete_pods(TEST_NAMESPACE, selector=LABEL)
        kube("delete", "resourceclaims", "-n", TEST_NAMESPACE, "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=120)
        label(kube, "node-b", "fast-fpga")
        kube.watch(
            "node/node-b",
            lambda n: n["status"].get("allocatable", {}).get(FPGA) == "2",
            what="node-b's classic FPGAs back",
            timeout=120,
        )
