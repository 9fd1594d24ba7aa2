"""deploy/overlays/dra and deploy/examples/dra: what the DRA front end needs, and the example claims.

Rendered with test_manifests' kustomize subset. Checks: the DaemonSet mounts the kubelet's plugin
folders at the node's paths and passes them, the node name comes from the downward API, the
token is mounted; the RBAC grants exactly the slice, claim and node calls the daemon makes and the
admission policy ties slice writes to the daemon's own node; one DeviceClass per DRA resource of
the config, selecting its driver, with its extendedResourceName; the examples: a claim template
for one device, the "fastest" prioritized list over the speed attribute the config gives, and a
classic pod on the extended resource; the DRA DaemonSet rolls with maxSurge 1 / maxUnavailable 0 and
passes metadata.uid as CDIPLUG_POD_UID, serves DRA resources only, and holds nothing two pods on
one node could not share; every device-plugin DaemonSet keeps maxSurge 0.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import yaml

from cdiplug.config import parse_config
from cdiplug.models.resource import Api

from .test_manifests import DEPLOY, _find, daemon, render


def dra_config():  # type: ignore[no-untyped-def]
    return parse_config(yaml.safe_load((DEPLOY / "overlays/dra/config.yaml").read_text()), "overlays/dra/config.yaml")


def test_daemonset_reaches_the_kubelet_plugin_folders() -> None:
    d = daemon("overlays/dra")
    for flag in ("plugins-registry-dir", "plugins-dir"):
        path = d.flags[flag]
        assert d.host_path_of(path) == PurePosixPath(path)
    env = {e["name"]: e for e in d.container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert d.pod["automountServiceAccountToken"] is True
    assert d.pod["serviceAccountName"] == "cdiplug"


def test_rbac_is_what_the_daemon_calls() -> None:
    objects = render(DEPLOY / "overlays/dra")
    role = _find(objects, "ClusterRole", "cdiplug-dra")
    assert role["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch", "create", "update", "delete"],
        },
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["patch", "update"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "resourceNames": ["fpga.example.com"],  # the overlay's driver (config.yaml)
            "verbs": ["associated-node:patch", "associated-node:update"],
        },
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]
    (subject,) = _find(objects, "ClusterRoleBinding", "cdiplug-dra")["subjects"]
    account = _find(objects, "ServiceAccount", "cdiplug")["metadata"]
    assert (subject["name"], subject["namespace"]) == (account["name"], account["namespace"])
    policy = _find(objects, "ValidatingAdmissionPolicy", "cdiplug-resourceslices-own-node")
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert username in policy["spec"]["matchConditions"][0]["expression"]
    assert any("userNodeName == variables.objectNodeName" in v["expression"] for v in policy["spec"]["validations"])
    binding = _find(objects, "ValidatingAdmissionPolicyBinding", "cdiplug-resourceslices-own-node")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and binding["spec"]["validationActions"] == ["Deny"]


def test_one_device_class_per_dra_resource() -> None:
    config = dra_config()
    dra = [r for r in config.resources if r.api is Api.DRA]
    assert dra
    classes = [o for o in render(DEPLOY / "overlays/dra") if o["kind"] == "DeviceClass"]
    assert {c["metadata"]["name"]: c["spec"] for c in classes} == {
        r.settings.dra_driver: {
            "selectors": [{"cel": {"expression": f'device.driver == "{r.settings.dra_driver}"'}}],
            "extendedResourceName": r.name,
        }
        for r in dra
    }


def test_examples() -> None:
    objects = render(DEPLOY / "examples/dra")
    one = _find(objects, "ResourceClaimTemplate", "one-fpga")["spec"]["spec"]["devices"]["requests"]
    assert one == [{"name": "fpga", "exactly": {"deviceClassName": "fpga.example.com"}}]
    (fastest,) = _find(objects, "ResourceClaimTemplate", "fastest-fpga")["spec"]["spec"]["devices"]["requests"]
    fast, anything = fastest["firstAvailable"]
    assert fast["selectors"] == [{"cel": {"expression": 'device.attributes["fpga.example.com"].speed >= 5'}}]
    assert "selectors" not in anything
    speeds = dict(dra_config().resources[0].options.attributes)
    assert speeds == {"fpga-0": {"speed": 1}, "fpga-1": {"speed": 9}}  # exactly one device passes the selector
    pods = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Pod"}
    assert [c["resourceClaimTemplateName"] for c in pods["dra-fastest-1"]["resourceClaims"]] == ["fastest-fpga"]
    assert pods["dra-classic-pod"]["containers"][0]["resources"]["limits"] == {"example.com/fpga": 1}


def test_the_cluster_tests_config_is_the_overlays_plus_a_renamed_dongle() -> None:
    test_copy = DEPLOY.parent / "tests" / "cluster" / "overlays" / "dra" / "config.yaml"
    ours, theirs = (yaml.safe_load(p.read_text()) for p in (test_copy, DEPLOY / "overlays/dra/config.yaml"))
    assert ours["resources"][: len(theirs["resources"])] == theirs["resources"]
    assert [r["name"] for r in ours["resources"][len(theirs["resources"]) :]] == ["example.com/dra-dongle"]


def test_the_dra_daemonset_upgrades_side_by_side_and_serves_dra_only() -> None:
    d = daemon("overlays/dra")
    strategy = d.daemonset["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    env = {e["name"]: e for e in d.container["env"]}
    assert env["CDIPLUG_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert "--pod-uid" not in d.flags  # from the environment: the downward API has no args form for it
    # Surging is safe for DRA only: the kubelet's device-plugin manager has no takeover.
    assert [r.name for r in dra_config().resources if r.api is not Api.DRA] == []
    # Two pods on one node at once: nothing in the pod that only one of them can hold.
    assert not d.pod.get("hostNetwork")
    assert all("hostPort" not in p for c in d.pod["containers"] for p in c.get("ports", []))


def test_device_plugin_daemonsets_never_surge() -> None:
    for overlay in ("base", "overlays/fake", "overlays/hardware"):
        rolling = daemon(overlay).daemonset["spec"]["updateStrategy"]["rollingUpdate"]
        assert rolling["maxSurge"] == 0, overlay
