"""Node labels, Events and the configuration label against a REAL kube-apiserver 1.36, as the daemon's pod.

The server of test_dra_apiserver (etcd and kube-apiserver on free loopback ports, Node,RBAC)
with deploy/overlays/mixed-fleet/rbac-node-labels.yaml applied as shipped. The daemon's calls are
made with a service-account token bound to a pod on node n1, as the DaemonSet's token is (it
carries the node's name), through cdiplug's own NodeLabeler, NodeEvents and ConfigLabelWatch.
Covers: the overlay accepted (server-side dry run); the labels written on n1 and others' labels kept; the admission policy refusing that
token a cdiplug.dev/ label on another node, another prefix, cdiplug.dev/config, a spec change and
an annotation; an Event about n1 accepted, one about another node refused; the configuration
label read through list/watch.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdiplug.errors import KubernetesError
from cdiplug.kube.client import LightkubeClient
from cdiplug.kube.config_label import ConfigLabelWatch
from cdiplug.kube.credentials import load_kubeconfig
from cdiplug.kube.events import NodeEvents, event_body
from cdiplug.kube.node_labels import NodeLabeler
from cdiplug.models.devices import Device, DeviceSnapshot

from .test_dra_apiserver import REPO, _as_user, apiserver, kubectl  # noqa: F401 - apiserver is a fixture

pytestmark = pytest.mark.e2e

NS = "cdiplug-system"
RBAC = REPO / "deploy" / "overlays" / "mixed-fleet" / "rbac-node-labels.yaml"
POLICY = "cdiplug-node-labels-own-node"
EVENTS_POLICY = "cdiplug-node-events-own-node"


def labels_of(kubeconfig: Path, node: str) -> dict[str, str]:
    return dict(json.loads(kubectl(kubeconfig, "get", "node", node, "-o", "json"))["metadata"].get("labels") or {})


def pod_token(kubeconfig: Path, pod: str) -> str:
    bound = ["create", "token", "cdiplug", "-n", NS, "--bound-object-kind", "Pod", "--bound-object-name", pod]
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *bound], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def refused(call: Callable[[], Awaitable[Any]], *words: str) -> KubernetesError:
    with pytest.raises(KubernetesError) as info:
        await call()
    assert all(w in str(info.value) for w in words), info.value
    return info.value


async def until_policy_applies(policy: str, call: Callable[[int], Awaitable[Any]]) -> None:
    """Make call(attempt) until the server refuses it naming ``policy``.

    RBAC and each admission policy reach the server's caches a moment after they are created, each
    on its own (a CI run saw the events policy admit an Event about n9 after the node-labels one had
    taken effect): until then, nothing a test asserts about the policy means anything. A plain 403
    is RBAC not there yet; an admitted call, the policy not yet there.
    """
    deadline = time.monotonic() + 60
    for attempt in itertools.count():
        try:
            await call(attempt)
        except KubernetesError as exc:
            if policy in str(exc):
                return
            assert exc.status == 403, exc
        assert time.monotonic() < deadline, f"the admission policy {policy} never took effect"
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def daemon_kubeconfig(apiserver: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The RBAC and policies as shipped, a pod of the DaemonSet's service account on n1; its token's kubeconfig."""
    kubectl(apiserver, "create", "namespace", NS)
    kubectl(apiserver, "create", "serviceaccount", "cdiplug", "-n", NS)
    for doc in yaml.safe_load_all(RBAC.read_text()):
        kubectl(apiserver, "create", "-f", "-", input=doc)
    kubectl(apiserver, "create", "-f", "-", input={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n9"}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cdiplug-n1", "namespace": NS},
        "spec": {"nodeName": "n1", "serviceAccountName": "cdiplug", "containers": [{"name": "c", "image": "cdiplug"}]},
    }
    kubectl(apiserver, "create", "-f", "-", input=pod)
    return _as_user(apiserver, pod_token(apiserver, "cdiplug-n1"), tmp_path_factory.mktemp("daemon") / "kubeconfig")


async def test_the_daemon_labels_its_own_node_and_nothing_else(apiserver: Path, daemon_kubeconfig: Path) -> None:  # noqa: F811
    kubectl(apiserver, "label", "node", "n1", "team=infra", "cdiplug.dev/config=fast-fpga", "cdiplug.dev/stale.thing.count=3")
    client = LightkubeClient(load_kubeconfig(daemon_kubeconfig))
    try:
        # Each probe sets a new value: the server admits no unchanged object at all.
        await until_policy_applies(
            POLICY, lambda attempt: client.patch_node("n1", {"metadata": {"labels": {"probe.example.com/x": str(attempt)}}})
        )
        kubectl(apiserver, "label", "node", "n1", "probe.example.com/x-")  # what got through before it did

        labeler = NodeLabeler(lambda: client, "n1", interval=0.1, settle=0, backoff=(0.1, 0.5))
        labeler.expect(["example.com/fpga"])
        snapshot = DeviceSnapshot(
            "example.com/fpga", [Device(f"fpga-{i}", attributes={"speed": 9, "model": "fake fpga"}) for i in range(2)]
        )
        labeler.offer(snapshot)
        task = asyncio.create_task(labeler.run())
        try:
            await asyncio.wait_for(labeler.wait_until(lambda it: it.patches >= 1 or it.failures > 0), 30)
            assert labeler.failures == 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        got = labels_of(apiserver, "n1")
        ours = {k: v for k, v in got.items() if k.startswith("cdiplug.dev/")}
        assert ours == {
            "cdiplug.dev/config": "fast-fpga",  # the administrator's: kept
            "cdiplug.dev/example.com.fpga.count": "2",
            "cdiplug.dev/example.com.fpga.speed": "9",
            "cdiplug.dev/example.com.fpga.model": "fake-fpga",
        }  # the stale cdiplug.dev/ label is gone
        assert got["team"] == "infra" and "probe.example.com/x" not in got

        # what the policy refuses the daemon's token:
        await refused(lambda: client.patch_node("n9", {"metadata": {"labels": {"cdiplug.dev/x": "1"}}}), POLICY, "n9")
        await refused(lambda: client.patch_node("n1", {"metadata": {"labels": {"team": None}}}), POLICY, "cdiplug.dev/")
        await refused(lambda: client.patch_node("n1", {"metadata": {"labels": {"cdiplug.dev/config": "other"}}}), POLICY)
        await refused(lambda: client.patch_node("n1", {"spec": {"unschedulable": True}}), POLICY, "spec")
        await refused(lambda: client.patch_node("n1", {"metadata": {"annotations": {"cdiplug.dev/x": "1"}}}), POLICY)
        await refused(
            lambda: client.patch_node("n1", {"metadata": {"labels": {"cdiplug.dev/x": "1"}, "annotations": {"a": "b"}}}), POLICY
        )
        # and RBAC: nothing but the Node itself (its status is not ours)
        await refused(
            lambda: client.patch_node_status("n1", [{"op": "add", "path": "/status/capacity/x", "value": "1"}]), "forbidden"
        )
        assert labels_of(apiserver, "n9").get("cdiplug.dev/x") is None
        assert labels_of(apiserver, "n1")["team"] == "infra"
        node = json.loads(kubectl(apiserver, "get", "node", "n1", "-o", "json"))
        assert not node["spec"].get("unschedulable") and "annotations" not in node["metadata"]
    finally:
        await client.close()


async def test_events_about_its_own_node_only(apiserver: Path, daemon_kubeconfig: Path) -> None:  # noqa: F811
    client = LightkubeClient(load_kubeconfig(daemon_kubeconfig))
    try:
        now = datetime.datetime.now(datetime.UTC)
        await until_policy_applies(
            EVENTS_POLICY, lambda _: client.create_event("default", event_body("n9", "Probe", "policy yet?", False, 1, now))
        )
        events = NodeEvents(lambda: client, "n1", interval=0.1, backoff=(0.1, 0.5))
        task = asyncio.create_task(events.run())
        try:
            events.emit("ConfigurationError", "no configuration named 'gpu' (the file has: default)", warning=True)
            async with asyncio.timeout(10):  # NodeEvents has no signal of its own; it sends within one loop turn
                while not events.sent:
                    await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        listed = json.loads(
            kubectl(
                apiserver,
                "get",
                "events",
                "-A",
                "--field-selector",
                "involvedObject.kind=Node,involvedObject.name=n1",
                "-o",
                "json",
            )
        )["items"]
        found = [(e["reason"], e["type"], e["metadata"]["namespace"]) for e in listed]
        assert ("ConfigurationError", "Warning", "default") in found, found
        other = event_body("n9", "DeviceUnhealthy", "not mine", True, 1, now)
        await refused(lambda: client.create_event("default", other), EVENTS_POLICY, "n1")
    finally:
        await client.close()


async def test_the_configuration_label_through_list_and_watch(apiserver: Path, daemon_kubeconfig: Path) -> None:  # noqa: F811
    kubectl(apiserver, "label", "node", "n1", "--overwrite", "cdiplug.dev/config=slow-fpga")
    client = LightkubeClient(load_kubeconfig(daemon_kubeconfig))
    seen: list[str | None] = []
    changed = asyncio.Event()

    def on_change(name: str | None) -> None:
        seen.append(name)
        changed.set()

    watch = ConfigLabelWatch(lambda: client, "n1", on_change, backoff=(0.1, 0.5))
    task = asyncio.create_task(watch.run())
    try:
        assert await watch.first(30) == "slow-fpga"
        changed.clear()
        kubectl(apiserver, "label", "node", "n1", "--overwrite", "cdiplug.dev/config=fast-fpga")
        await asyncio.wait_for(changed.wait(), 30)
        assert seen[-1] == "fast-fpga"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


def test_the_overlay_is_accepted(apiserver: Path, daemon_kubeconfig: Path) -> None:  # noqa: F811
    # (The policies' CEL is type-checked by kube-controller-manager, which this server lacks; an
    # expression that did not compile would fail every Node write closed, which the tests above
    # would see.)
    out = kubectl(apiserver, "apply", "--dry-run=server", "-k", str(REPO / "deploy/overlays/mixed-fleet"))
    for what in (
        "validatingadmissionpolicy.admissionregistration.k8s.io/cdiplug-node-labels-own-node",
        "clusterrole.rbac.authorization.k8s.io/cdiplug-node-events",
        "daemonset.apps/cdiplug",
        "configmap/cdiplug-config",
    ):
        assert what in out, out
