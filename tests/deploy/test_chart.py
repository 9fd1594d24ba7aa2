"""The Helm chart, rendered by real Helm (4.2.3, from hack/get-tools.sh): lint, derived objects, schema.

Every example values file passes ``helm lint --strict``; its rendered objects deserialize into the
Kubernetes models, its ConfigMap holds a configuration cdiplug's own parser accepts, and what the
chart derives from that configuration is checked against cdiplug's reading of it: the DeviceClasses
and RBAC name exactly the DRA drivers the daemon publishes, the update strategy follows the APIs,
the privileges follow the backends, the admission policies name the release's service account
whatever the namespace and release name. The schema refuses bad values, naming the value.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from cdiplug.cli import build_parser
from cdiplug.config import parse_config
from cdiplug.models.resource import Api
from cdiplug.toolkit.safeload import _NOT_JSON, _as_json

from .chart import CHART, EXAMPLES, find, helm, one, template
from .test_manifests import Daemon, assert_round_trips

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
NAMES = [p.stem for p in EXAMPLE_FILES]


def daemon_of(objects: list[dict[str, Any]], where: str) -> Daemon:
    daemonset = one(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"][1:])
    config_map = one(objects, "ConfigMap", next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v))
    text = config_map["data"]["config.yaml"]
    assert _as_json(text) is not _NOT_JSON, f"{where}: the daemon would need PyYAML to read the ConfigMap's configuration"
    data = yaml.safe_load(text)
    return Daemon(objects, daemonset, pod, container, flags, parse_config(data, where))


def all_resources(objects: list[dict[str, Any]], where: str) -> list[Any]:
    """Every resource of every named configuration, as cdiplug reads them."""
    config_map = next(o for o in find(objects, "ConfigMap") if "config.yaml" in o["data"])
    data = yaml.safe_load(config_map["data"]["config.yaml"])
    names = list(data.get("configurations", {None: None}))
    return [r for name in names for r in parse_config(data, where, configuration=name).resources]


@functools.cache
def _example(name: str) -> str:
    return yaml.safe_dump_all(template(EXAMPLES / f"{name}.yaml"))


def example(name: str) -> list[dict[str, Any]]:
    """The example rendered (once per session; each caller gets its own copy)."""
    return [d for d in yaml.safe_load_all(_example(name)) if d]


def test_every_example_is_there() -> None:
    assert set(NAMES) == {
        "fake-device-plugin",
        "fake-dra",
        "pci-vfio",
        "nvidia-device-plugin",
        "nvidia-dra",
        "mixed-fleet",
        "generic",
    }


@pytest.mark.parametrize("values", [*NAMES, "defaults"])
def test_lint_strict(values: str) -> None:
    args = [] if values == "defaults" else ["-f", str(EXAMPLES / f"{values}.yaml")]
    result = helm("lint", "--strict", str(CHART), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("name", NAMES)
def test_rendered_objects_are_valid_and_cdiplug_accepts_the_command_line(name: str) -> None:
    objects = example(name)
    for obj in objects:
        assert_round_trips(obj, name)
    d = daemon_of(objects, name)
    parsed = build_parser().parse_args(d.container["args"])
    assert parsed.command == "serve" and parsed.config == "/etc/cdiplug/config.yaml"
    # Every path the configuration names is the node's (a hostPath, or /proc with hostPID).
    for resource in all_resources(objects, name):
        for key, value in vars(resource.options).items() if hasattr(resource.options, "__dict__") else []:
            if isinstance(value, Path) and not value.is_relative_to("/proc"):
                assert d.host_path_of(value) is not None, f"{name}: options.{key} {value} is on no hostPath"


@pytest.mark.parametrize("name", NAMES)
def test_device_classes_and_rbac_name_exactly_the_drivers(name: str) -> None:
    objects = example(name)
    drivers = {r.settings.dra_driver for r in all_resources(objects, name) if r.api is Api.DRA}
    classes = find(objects, "DeviceClass")
    assert {c["metadata"]["name"] for c in classes} == drivers
    for c in classes:
        driver = c["metadata"]["name"]
        assert c["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    roles = [r for r in find(objects, "ClusterRole") if any("resourceslices" in rule["resources"] for rule in r["rules"])]
    policies = [p for p in find(objects, "ValidatingAdmissionPolicy") if "resourceslices" in str(p["spec"]["matchConstraints"])]
    if not drivers:
        assert not roles and not policies, f"{name}: DRA RBAC without a DRA resource"
        return
    (role,) = roles
    (rule,) = [rule for rule in role["rules"] if rule["resources"] == ["resourceclaims/driver"]]
    assert set(rule["resourceNames"]) == drivers
    (policy,) = policies
    (check,) = [v for v in policy["spec"]["validations"] if "spec.driver in" in v["expression"]]
    assert set(yaml.safe_load(check["expression"].split(" in ", 1)[1])) == drivers


def test_a_configured_driver_name_is_followed(tmp_path: Path) -> None:
    objects = template(
        {"config": {"resources": [{"name": "example.com/fpga", "backend": "fake", "api": "dra", "dra_driver": "fpga.acme.dev"}]}},
        tmp=tmp_path,
    )
    assert [c["metadata"]["name"] for c in find(objects, "DeviceClass")] == ["fpga.acme.dev"]
    assert one(objects, "DeviceClass")["spec"]["extendedResourceName"] == "example.com/fpga"


@pytest.mark.parametrize("name", NAMES)
def test_update_strategy_follows_the_apis(name: str) -> None:
    objects = example(name)
    apis = {r.api for r in all_resources(objects, name)}
    d = daemon_of(objects, name)
    rolling = d.daemonset["spec"]["updateStrategy"]["rollingUpdate"]
    env = {e["name"] for e in d.container["env"]}
    if apis == {Api.DRA} and not d.pod.get("hostNetwork"):
        assert rolling == {"maxSurge": 1, "maxUnavailable": 0}
        assert "CDIPLUG_POD_UID" in env, "a surging DRA pod needs its own socket names"
    else:
        assert rolling == {"maxSurge": 0, "maxUnavailable": 1}
    assert ("CDIPLUG_POD_UID" in env) == (Api.DRA in apis)


def host_paths(d: Daemon) -> set[str]:
    return {str(host) for _, host, _ in d.mounts() if host}


@pytest.mark.parametrize("name", NAMES)
def test_privileges_follow_the_backends(name: str) -> None:
    objects = example(name)
    backends = {r.backend for r in all_resources(objects, name)}
    d = daemon_of(objects, name)
    security = d.container["securityContext"]
    assert security["runAsUser"] == 0 and security["readOnlyRootFilesystem"] is True
    if "pci" in backends:
        assert security["privileged"] is True
        assert d.pod["hostNetwork"] is True and d.pod["hostPID"] is True
        assert {"/sys", "/dev/vfio"} <= host_paths(d)
        assert d.host_path_of(d.flags["sysfs-root"]) == PurePosixPath("/sys")
        assert d.pod["nodeSelector"] or d.pod["affinity"], "a privileged pod on every node"
    else:
        assert "privileged" not in security
        assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
        # The generic backend alone: the node's network for udev's netlink events, nothing more.
        assert bool(d.pod.get("hostNetwork")) == ("generic" in backends) and not d.pod.get("hostPID")
        assert "/dev/vfio" not in host_paths(d)
    if "generic" in backends:
        assert {"/sys", "/dev"} <= host_paths(d)
        assert d.host_path_of(d.flags["sysfs-root"]) == PurePosixPath("/sys")
        assert d.flags["dev-root"] == "/host" and d.host_path_of("/host/dev") == PurePosixPath("/dev")
    if backends == {"fake"}:
        assert host_paths(d) <= {
            "/var/lib/kubelet/device-plugins",
            "/var/run/cdi",
            "/var/lib/cdiplug",
            "/var/lib/kubelet/plugins_registry",
            "/var/lib/kubelet/plugins",
            "/var/lib/kubelet/pod-resources",
        }
        assert "sysfs-root" not in d.flags
    nvidia_env = {e["name"]: e.get("value") for e in d.container["env"]}.get("NVIDIA_VISIBLE_DEVICES")
    assert (nvidia_env == "all") == ("nvidia" in backends)
    for key in d.container["resources"]["limits"]:
        assert key != "cpu", "a CPU limit throttles Allocate"


@pytest.mark.parametrize("name", NAMES)
def test_node_rbac_only_for_named_configurations_and_node_labels(name: str) -> None:
    objects = example(name)
    data = yaml.safe_load(next(o for o in find(objects, "ConfigMap"))["data"]["config.yaml"])
    labels = bool(data.get("node_labels")) or any(c.get("node_labels") for c in data.get("configurations", {}).values())
    node_verbs = {
        v for r in find(objects, "ClusterRole") for rule in r["rules"] if rule["resources"] == ["nodes"] for v in rule["verbs"]
    }
    assert ("patch" in node_verbs) == labels
    assert bool(find(objects, "ClusterRole", "cdiplug-node-events")) == labels
    assert ({"list", "watch"} <= node_verbs) == ("configurations" in data or labels)
    policies = {p["metadata"]["name"] for p in find(objects, "ValidatingAdmissionPolicy")}
    assert ("cdiplug-node-labels-own-node" in policies) == labels


@pytest.mark.parametrize(
    ("release", "namespace", "account"),
    [("cdiplug", "cdiplug-system", ""), ("gpus", "kube-system", ""), ("x", "team-a", "devices")],
)
def test_policies_and_bindings_name_the_release_service_account(release: str, namespace: str, account: str) -> None:
    objects = template(
        EXAMPLES / "mixed-fleet.yaml",
        release=release,
        namespace=namespace,
        extra=["--set", f"serviceAccount.name={account}"] if account else [],
    )
    (sa,) = find(objects, "ServiceAccount")
    name = sa["metadata"]["name"]
    assert sa["metadata"]["namespace"] == namespace
    assert name == (account or ("cdiplug" if release == "cdiplug" else f"{release}-cdiplug"))
    assert one(objects, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == name
    username = f"system:serviceaccount:{namespace}:{name}"
    policies = find(objects, "ValidatingAdmissionPolicy")
    assert len(policies) == 3  # slices (the dra-fpga configuration), node labels, node events
    for policy in policies:
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == f'request.userInfo.username == "{username}"'
        (binding,) = [
            b for b in find(objects, "ValidatingAdmissionPolicyBinding") if b["spec"]["policyName"] == policy["metadata"]["name"]
        ]
        assert binding["spec"]["validationActions"] == ["Deny"]
    for binding in find(objects, "ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
        assert one(objects, "ClusterRole", binding["roleRef"]["name"])
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == release


def test_node_selection_values_and_no_toleration_of_every_taint(tmp_path: Path) -> None:
    d = daemon_of(template(), "defaults")
    assert "tolerations" not in d.pod, "the default tolerates no taint"
    assert "nodeSelector" not in d.pod and "affinity" not in d.pod
    objects = template(
        {
            "nodeSelector": {"example.com/fpga": "yes"},
            "tolerations": [{"key": "fpga", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]
                    }
                }
            },
            "image": {"repository": "registry.example/cdiplug", "tag": "9.9", "pullPolicy": "Always"},
            "imagePullSecrets": [{"name": "regcred"}],
            "priorityClassName": "devices",
            "resources": {"requests": {"memory": "80Mi"}, "limits": {"memory": "160Mi"}},
            "commonLabels": {"team": "hw"},
            "commonAnnotations": {"owner": "hw@example.com"},
            "podAnnotations": {"scrape": "yes"},
        },
        tmp=tmp_path,
    )
    d = daemon_of(objects, "values")
    assert d.pod["nodeSelector"] == {"example.com/fpga": "yes"}
    assert d.pod["tolerations"] == [{"key": "fpga", "operator": "Exists", "effect": "NoSchedule"}]
    assert "nodeAffinity" in d.pod["affinity"]
    assert d.container["image"] == "registry.example/cdiplug:9.9" and d.container["imagePullPolicy"] == "Always"
    assert d.pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert d.pod["priorityClassName"] == "devices"
    assert d.container["resources"]["limits"] == {"memory": "160Mi"}
    assert d.daemonset["spec"]["template"]["metadata"]["annotations"]["scrape"] == "yes"
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "hw" and obj["metadata"]["annotations"]["owner"] == "hw@example.com"


def test_default_image_is_the_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    d = daemon_of(template(), "defaults")
    assert d.container["image"] == f"cdiplug:{chart['appVersion']}"
    assert chart["apiVersion"] == "v2"


def test_metrics_service_selects_the_pods_by_port_name() -> None:
    objects = template()
    service = one(objects, "Service")
    d = daemon_of(objects, "defaults")
    assert service["spec"]["selector"].items() <= d.daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9765, "targetPort": "metrics", "protocol": "TCP"}]


def test_pods_on_the_host_network_never_surge(tmp_path: Path) -> None:
    """Two pods of a surge on one node's network would both bind the metrics port (a host port
    there: the scheduler would never place the new pod): DRA alone surges off the host network only."""
    dra = {"config": {"resources": [{"name": "example.com/fpga", "backend": "fake", "api": "dra"}]}}
    assert daemon_of(template(dra, tmp=tmp_path), "dra").daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 1
    d = daemon_of(template({**dra, "hostNetwork": True}, tmp=tmp_path), "dra on the host network")
    assert d.pod["hostNetwork"] is True
    assert d.daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert d.flags["metrics-address"] == "$(POD_IP):9765"


# -- the schema: each bad values file refused, Helm's message naming the value ------------------

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("wrong type", {"image": {"tag": 1}}, "/image/tag"),
    ("unknown top-level key", {"replicas": 2}, "'replicas' not allowed"),
    ("unknown key in config", {"config": {"resource": []}}, "'resource' not allowed"),
    ("resources and configurations", {"config": {"resources": [], "configurations": {"default": {"resources": []}}}}, "/config"),
    ("no default configuration", {"config": {"configurations": {"fast": {"resources": []}}}}, "/config/configurations"),
    (
        "unknown backend",
        {"config": {"resources": [{"name": "example.com/x", "backend": "magic"}]}},
        "/config/resources/0/backend",
    ),
    ("bad resource name", {"config": {"resources": [{"name": "fpga", "backend": "fake"}]}}, "/config/resources/0/name"),
    (
        "unknown api",
        {"config": {"resources": [{"name": "example.com/x", "backend": "fake", "api": "both"}]}},
        "/config/resources/0/api",
    ),
    (
        "replicas with dra",
        {"config": {"resources": [{"name": "example.com/x", "backend": "fake", "api": "dra", "replicas": 2}]}},
        "/config/resources/0",
    ),
    (
        "dra_driver without dra",
        {"config": {"resources": [{"name": "example.com/x", "backend": "fake", "dra_driver": "x.example.com"}]}},
        "/config/resources/0",
    ),
    (
        "bad driver name",
        {"config": {"resources": [{"name": "example.com/x", "backend": "fake", "api": "dra", "dra_driver": "X_Y"}]}},
        "/config/resources/0/dra_driver",
    ),
    ("bad instance name", {"instance": "Not A Name"}, "/instance"),
    ("pull policy", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("node selector value", {"nodeSelector": {"gpu": True}}, "/nodeSelector/gpu"),
    ("no service account", {"serviceAccount": {"create": False}}, "/serviceAccount/name"),
    (
        "service monitor without service",
        {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
        "/metrics/service/enabled",
    ),
    ("metrics port", {"metrics": {"port": 70000}}, "/metrics/port"),
    ("no resource", {"config": {"configurations": {"default": {"resources": []}}}}, "/config/configurations/default/resources"),
    ("relative path", {"paths": {"cdi": "run/cdi"}}, "/paths/cdi"),
    (
        "configuration name",
        {"config": {"configurations": {"default": {"resources": []}, "Fast FPGA": {"resources": []}}}},
        "Fast FPGA",
    ),
    (
        "privileged everywhere",
        {"config": {"resources": [{"name": "example.com/nic", "backend": "pci"}]}},
        "nodeSelector or affinity",
    ),
]


@pytest.mark.parametrize(("what", "values", "named"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_schema_refuses_bad_values_naming_the_value(what: str, values: dict[str, Any], named: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    result = helm("install", "--dry-run=client", "cdiplug", str(CHART), "-f", str(path))
    assert result.returncode != 0, f"{what}: helm install accepted {values}"
    assert named in result.stderr, f"{what}: the error does not name {named!r}:\n{result.stderr}"


@pytest.mark.parametrize(
    ("release", "values", "instance"),
    [
        ("cdiplug", {}, "cdiplug"),
        ("gpu.nodes", {}, "gpu-nodes"),
        ("x", {"instance": "lab"}, "lab"),
        ("x", {"instance": ""}, None),
    ],
)
def test_instance_name_is_the_release_name_unless_given(
    release: str, values: dict[str, Any], instance: str | None, tmp_path: Path
) -> None:
    d = daemon_of(template(values, release=release, tmp=tmp_path), release)
    assert d.flags.get("instance") == instance
    parsed = build_parser().parse_args(d.container["args"])
    assert (parsed.instance or None) == instance


# -- uninstall --------------------------------------------------------------------------------------


def wrapper_run(tmp_path: Path, gone: bool) -> tuple[list[str], int]:
    """Run the DaemonSet's container command with stand-ins for cdiplug (serve waits for SIGTERM)
    and python (uninstall.py says whether the DaemonSet is gone); SIGTERM it like the kubelet.
    Returns the command lines the stand-ins saw and the exit status."""
    d = daemon_of(template(EXAMPLES / "fake-dra.yaml", release="lab"), "fake-dra")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    (bin_dir / "cdiplug").write_text(
        f'#!/bin/sh\necho "cdiplug $*" >> {log}\n'
        'if [ "$1" = serve ]; then trap "exit 0" TERM; touch '
        + str(tmp_path / "serving")
        + "; while :; do sleep 0.05; done; fi\n"
    )
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "python $*" >> {log}\nexit {0 if gone else 1}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    proc = subprocess.Popen(
        [*d.container["command"], *d.container["args"]], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, start_new_session=True
    )
    deadline = time.monotonic() + 20
    while not (tmp_path / "serving").exists():  # a bounded wait for the stand-in to start serving
        assert time.monotonic() < deadline and proc.poll() is None, "the wrapper never started cdiplug serve"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    status = proc.wait(20)
    return log.read_text().splitlines(), status


def test_the_container_cleans_its_node_when_its_daemonset_is_gone(tmp_path: Path) -> None:
    calls, status = wrapper_run(tmp_path, gone=True)
    assert status == 0
    serve, check, cleanup = calls
    assert serve.startswith("cdiplug serve --config=/etc/cdiplug/config.yaml")
    assert check == "python /etc/cdiplug/uninstall.py daemonset-gone cdiplug-system lab-cdiplug"
    args = cleanup.split()
    assert args[:3] == ["cdiplug", "cleanup", "--wait=20"]
    # The same folders and instance as serve, nothing of serve's own.
    assert set(args[3:]) == {
        a for a in serve.split()[2:] if not a.startswith(("--config=", "--log-format=", "--metrics-address="))
    }
    assert "--instance=lab" in args
    parsed = build_parser().parse_args(args[1:])
    assert parsed.command == "cleanup" and parsed.instance == "lab"


def test_the_container_leaves_its_node_alone_while_its_daemonset_stands(tmp_path: Path) -> None:
    calls, status = wrapper_run(tmp_path, gone=False)
    assert status == 0
    assert [c.split()[:2] for c in calls] == [["cdiplug", "serve"], ["python", "/etc/cdiplug/uninstall.py"]]


@pytest.mark.parametrize("name", NAMES)
def test_uninstall_rights_and_the_post_delete_hook(name: str) -> None:
    objects = template(EXAMPLES / f"{name}.yaml", hooks=True)
    (role,) = find(objects, "Role")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["cdiplug"], "verbs": ["get"]}]
    resources = all_resources(objects, name)
    drivers = sorted({r.settings.dra_driver for r in resources if r.api is Api.DRA})
    hooks = [o for o in objects if o["metadata"].get("annotations", {}).get("helm.sh/hook") == "post-delete"]
    data = yaml.safe_load(next(o for o in find(objects, "ConfigMap") if "config.yaml" in o["data"])["data"]["config.yaml"])
    labels = bool(data.get("node_labels"))
    if not drivers and not labels:
        assert not hooks
        return
    (job,) = [o for o in hooks if o["kind"] == "Job"]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--drivers={','.join(drivers)}" in command
    assert ("--labels" in command) == labels
    assert {o["kind"] for o in hooks} == {"Job", "ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding"}
    uninstall = (CHART / "files" / "uninstall.py").read_text()
    assert one(hooks, "ConfigMap")["data"]["uninstall.py"] == uninstall
    # Hooks are not part of what install creates.
    assert not [o for o in template(EXAMPLES / f"{name}.yaml") if o["metadata"].get("annotations", {}).get("helm.sh/hook")]
