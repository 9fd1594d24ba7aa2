"""deploy/overlays/mixed-fleet: named configurations, node labels and Events, and only the rights they need.

Rendered with test_manifests' kustomize subset (its generic checks run on this overlay too).
Checks: every named configuration parses, labels are on, the nodes without FPGAs register none;
the Node rights are exactly get/list/watch/patch on nodes (not nodes/status) and create on events,
each write held by an admission policy matched to the daemon's service account; the DaemonSet
rolls one pod at a time (it serves device-plugin resources) and reaches the kubelet's PodResources. The policies' effect is checked
against the real API server in tests/e2e/test_node_labels_apiserver.py.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import yaml

from cdiplug.config import parse_config
from cdiplug.models.world import DEFAULT_POD_RESOURCES_SOCKET

from .test_manifests import DEPLOY, _find, daemon, render

OVERLAY = DEPLOY / "overlays/mixed-fleet"


def test_every_named_configuration_parses() -> None:
    data = yaml.safe_load((OVERLAY / "config.yaml").read_text())
    names = list(data["configurations"])
    assert names == ["default", "slow-fpga", "fast-fpga"]
    for name in names:
        config = parse_config(data, "mixed-fleet/config.yaml", configuration=name)
        assert config.node_labels and config.name == name
        (fpga,) = config.resources
        assert not fpga.settings.register_when_empty
    assert parse_config(data, "mixed-fleet/config.yaml").resources[0].options.count == 0  # type: ignore[attr-defined]


def test_the_node_rights_come_with_their_policies() -> None:
    objects = render(OVERLAY)
    assert _find(objects, "ClusterRole", "cdiplug-node-labels")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
    ]
    assert _find(objects, "ClusterRole", "cdiplug-node-events")["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    ]
    account = _find(objects, "ServiceAccount", "cdiplug")["metadata"]
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    for role, policy in (
        ("cdiplug-node-labels", "cdiplug-node-labels-own-node"),
        ("cdiplug-node-events", "cdiplug-node-events-own-node"),
    ):
        (subject,) = _find(objects, "ClusterRoleBinding", role)["subjects"]
        assert (subject["name"], subject["namespace"]) == (account["name"], account["namespace"])
        spec = _find(objects, "ValidatingAdmissionPolicy", policy)["spec"]
        assert spec["failurePolicy"] == "Fail" and username in spec["matchConditions"][0]["expression"]
        binding = _find(objects, "ValidatingAdmissionPolicyBinding", policy)["spec"]
        assert binding["policyName"] == policy and binding["validationActions"] == ["Deny"]
    rules = _find(objects, "ValidatingAdmissionPolicy", "cdiplug-node-labels-own-node")["spec"]["matchConstraints"][
        "resourceRules"
    ]
    assert rules[0]["resources"] == ["nodes"] and set(rules[0]["operations"]) >= {"UPDATE"}


def test_classic_fpga_pods_can_be_served_through_dra_where_a_node_moves_the_fpgas_there() -> None:
    # The device plugin wins where it advertises example.com/fpga (KEP-5004); on a node whose
    # configuration serves the FPGAs by DRA, classic pods keep being admitted through the class.
    (device_class,) = [o for o in render(OVERLAY) if o["kind"] == "DeviceClass"]
    assert device_class["spec"]["extendedResourceName"] == "example.com/fpga"
    data = yaml.safe_load((OVERLAY / "config.yaml").read_text())
    fpgas = {r.name for name in data["configurations"] for r in parse_config(data, "config.yaml", configuration=name).resources}
    assert fpgas == {device_class["spec"]["extendedResourceName"]}


def test_it_rolls_one_pod_at_a_time_and_reads_pod_resources() -> None:
    d = daemon("overlays/mixed-fleet")
    socket = PurePosixPath(d.flags.get("pod-resources-socket", str(DEFAULT_POD_RESOURCES_SOCKET)))
    assert d.host_path_of(socket.parent) == socket.parent  # the handover between the APIs asks the kubelet
    assert d.daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert d.pod["serviceAccountName"] == "cdiplug"
