"""One Helm release for a heterogeneous fleet (``hack/local-cluster.sh up --nodes 3``): named
configurations chosen by the node label ``cdiplug.dev/config``.

The release's ``config.configurations`` holds each node's configuration of the node file
(``hack/nodes/default.yaml``: FPGAs on node-a and node-b, a CDI-only FPGA on the CRI-O node-c,
accelerators as a DRA driver with different speeds everywhere) under the node's name, and an empty
``default``; each node is labelled with its own name. Each node then advertises exactly its own
device-plugin resources (capacity and allocatable) and its own DRA devices in its own slice. The
release is uninstalled and the labels removed at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..deploy.chart import CHART, helm
from .test_multinode import DRIVER, NAMESPACE, dra_devices, plugin_resources

pytestmark = [pytest.mark.cluster, pytest.mark.multinode, pytest.mark.timeout(900)]

RELEASE, RELEASE_NS = "fleet", "cdiplug-fleet"
CONFIG_LABEL = "cdiplug.dev/config"


@pytest.fixture(scope="module")
def fleet(
    multinode: tuple[Any, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    kube, nodes = multinode
    env = {"KUBECONFIG": str(kube.kubeconfig)}
    # The kustomize deployment of test_multinode serves the same resources: not beside this release.
    kube(
        "delete",
        "daemonset",
        "cdiplug",
        "-n",
        NAMESPACE,
        "--ignore-not-found",
        "--cascade=foreground",
        "--wait=true",
        timeout=120,
    )
    # Not helm --create-namespace: Helm validates that one against the OpenAPI document this API
    # server cannot serve.
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": RELEASE_NS, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
        }
    )
    values = tmp_path_factory.mktemp("fleet") / "values.yaml"
    # default: nodes without the label (none here); a configuration needs a resource, none found.
    nothing = {"resources": [{"name": "example.com/fpga", "backend": "fake", "options": {"count": 0}}]}
    configurations = {"default": nothing} | {n["name"]: n["cdiplug"] for n in nodes}
    # Every taint tolerated, as test_multinode's kustomize deployment does: the chart's default
    # tolerates none, and this cluster's nodes may keep the kubelet's not-ready taint.
    # Pods reach this cluster's API server on the host network only (127.0.0.1:6443, as the
    # multinode kustomize deployment does); each node has its own address for the metrics port.
    values.write_text(
        yaml.safe_dump(
            {
                "config": {"configurations": configurations},
                "tolerations": [{"operator": "Exists"}],
                "hostNetwork": True,
                "extraEnv": [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
                ],
            }
        )
    )
    for n in nodes:
        kube("label", "node", n["name"], f"{CONFIG_LABEL}={n['name']}", "--overwrite")
    # --disable-openapi-validation: this kube-apiserver build cannot serve its OpenAPI document.
    result = helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        RELEASE_NS,
        "--disable-openapi-validation",
        "-f",
        str(values),
        "--wait",
        "--timeout=300s",
        env=env,
        timeout=330,
    )
    if result.returncode != 0:
        pods = kube("get", "pods", "-n", RELEASE_NS, "-o", "wide", check=False)
        logs = kube("logs", "-n", RELEASE_NS, "-l", "app.kubernetes.io/instance=fleet", "--tail=20", "--prefix", check=False)
        events = kube("get", "events", "-n", RELEASE_NS, check=False)
        raise AssertionError(f"{result.stderr}\npods:\n{pods}\nlogs:\n{logs[-4000:]}\nevents:\n{events[-3000:]}")
    yield kube, nodes
    helm("uninstall", RELEASE, "-n", RELEASE_NS, "--no-hooks", "--wait", "--timeout=180s", env=env, timeout=200)
    kube("delete", "resourceslices", "--field-selector", f"spec.driver={DRIVER}", "--ignore-not-found", check=False)
    for n in nodes:
        kube("label", "node", n["name"], f"{CONFIG_LABEL}-", check=False)


def test_each_node_advertises_only_its_own_resources(fleet: tuple[Any, list[dict[str, Any]]]) -> None:
    kube, nodes = fleet
    daemons = {
        p["spec"]["nodeName"]: p
        for p in kube.get("pods", RELEASE_NS)["items"]
        if p["metadata"]["labels"].get("app.kubernetes.io/instance") == RELEASE
    }
    assert sorted(daemons) == sorted(n["name"] for n in nodes)
    for node in nodes:
        name = node["name"]
        expected = plugin_resources(node)

        def own(n: dict[str, Any], field: str) -> dict[str, str]:
            allocatable = n["status"].get("allocatable", {})
            return {
                k: v
                for k, v in n["status"].get(field, {}).items()
                if k.startswith("example.com/") and (k in expected or allocatable.get(k, "0") != "0")
            }

        kube.watch(
            f"node/{name}",
            lambda n: own(n, "allocatable") == expected,
            what=f"{name}'s allocatable = {expected} (its configuration {name})",
            timeout=120,
        )
        wanted = dra_devices(node)
        got = kube.watch(
            "resourceslices",
            lambda s: (
                s["spec"]["driver"] == DRIVER
                and s["spec"]["nodeName"] == name
                and len(s["spec"].get("devices") or []) == len(wanted)
            ),
            what=f"{name}'s {DRIVER} slice with {len(wanted)} devices",
            timeout=120,
        )
        assert sorted(d["name"] for d in got["spec"]["devices"]) == sorted(wanted), name
        for device in got["spec"]["devices"]:
            for key, value in wanted[device["name"]].items():
                assert device["attributes"][key] == {"int" if isinstance(value, int) else "string": value}, (name, device, key)
    # One DeviceClass for the one DRA driver of every configuration.
    (device_class,) = [c for c in kube.get("deviceclasses")["items"] if c["metadata"]["name"] == DRIVER]
    assert device_class["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    print(f"one release, {len(nodes)} nodes, each its own configuration by label: {[Path(n['name']).name for n in nodes]}")
