"""The manifests in deploy/: they parse, deserialize into the Kubernetes API models, and agree.

Against the real ``kubernetes`` Python client models (every object is deserialized and serialized
back; a key the API does not know, a wrong type or a missing required field fails) and the real
config parser (``cdiplug.config.parse_config`` on the ConfigMap's config, with the installed
backends). kubectl is not installed here, so the kustomizations are rendered by the small subset
of kustomize they use (resources, namespace, configMapGenerator with create/replace, patches as
strategic merge keyed by name/mountPath); a kustomization using anything else fails the test
instead of rendering wrongly. Checks: overlays keep the base's objects and settings, the DaemonSet
mounts every folder the config and the command line point at, the probes hit the metrics port,
the example pods, the RBAC and the Containerfile.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import attrs
import pytest
import yaml
from kubernetes.client import ApiClient

from cdiplug.cli import build_parser
from cdiplug.config import Config, parse_config
from cdiplug.models.world import DEFAULT_CDI_DIR, DEFAULT_KUBELET_DIR, DEFAULT_POD_RESOURCES_SOCKET, DEFAULT_STATE_DIR

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUSTOMIZATIONS = [
    "base",
    "overlays/fake",
    "overlays/hardware",
    "overlays/dra",
    "overlays/node-config",
    "overlays/mixed-fleet",
    "examples",
    "examples/dra",
]
DAEMON_KUSTOMIZATIONS = ["base", "overlays/fake", "overlays/hardware", "overlays/dra"]
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
    "DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}  # fmt: skip
# patchMergeKey of the lists the patches touch (k8s.io/api/core/v1/types.go); other lists replace.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name", "volumeMounts": "mountPath"}
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator", "patches"}
# Steady RSS of `cdiplug serve` with the fake backend, measured (process_resident_memory_bytes).
MEASURED_RSS_MI = 49


# -- the Kubernetes models ------------------------------------------------------------------------

_api = ApiClient()


def quantities_as_strings(obj: Any) -> Any:
    """``example.com/fpga: 1`` -> ``"1"``: the API server reads a quantity from a JSON number or
    string alike, the client's models take strings only."""
    if isinstance(obj, list):
        return [quantities_as_strings(v) for v in obj]
    if not isinstance(obj, Mapping):
        return obj
    return {
        k: {q: str(n) if isinstance(n, int | float) and not isinstance(n, bool) else n for q, n in v.items()}
        if k in ("limits", "requests") and isinstance(v, Mapping)
        else quantities_as_strings(v)
        for k, v in obj.items()
    }


def to_model(obj: Mapping[str, Any]) -> Any:
    """Deserialize into the client's model class (``apps/v1`` ``DaemonSet`` -> ``V1DaemonSet``)."""
    version = obj["apiVersion"].rpartition("/")[2]
    model = f"{version.capitalize()}{obj['kind']}"
    if obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceClaim":
        model = "ResourceV1ResourceClaim"  # the client's name: core/v1 has a ResourceClaim (a pod's) too
    return _api._ApiClient__deserialize(quantities_as_strings(obj), model)  # type: ignore[attr-defined]


def assert_round_trips(obj: Mapping[str, Any], where: str) -> None:
    obj = quantities_as_strings(obj)
    back = _api.sanitize_for_serialization(to_model(obj))
    assert back == obj, f"{where}: {obj['kind']} {obj['metadata'].get('name')} has fields the API does not know or mistypes"


# -- kustomize, the subset used here --------------------------------------------------------------


def strategic_merge(base: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(base.get(key), dict):
            strategic_merge(base[key], value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(base.get(key), list):
            merge_key = MERGE_KEYS[key]
            for item in value:
                match = next((b for b in base[key] if b.get(merge_key) == item.get(merge_key)), None)
                if match is None:
                    base[key].append(copy.deepcopy(item))
                else:
                    strategic_merge(match, item)
        else:
            base[key] = copy.deepcopy(value)


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def render(folder: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    assert not unknown, f"{folder}: the test's kustomize subset does not render {sorted(unknown)}"
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        objects += render(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for generator in kustomization.get("configMapGenerator", []):
        assert set(generator) <= {"name", "files", "behavior"}, generator
        data = {Path(f).name: (folder / f).read_text() for f in generator["files"]}
        behavior = generator.get("behavior", "create")
        if behavior == "create":
            assert not [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == generator["name"]]
            objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data})
        else:
            assert behavior == "replace", behavior
            _find(objects, "ConfigMap", generator["name"])["data"] = data
    for entry in kustomization.get("patches", []):
        assert set(entry) == {"path"}, f"{folder}: only file patches are rendered here: {entry}"
        patch = yaml.safe_load((folder / entry["path"]).read_text())
        strategic_merge(_find(objects, patch["kind"], patch["metadata"]["name"]), patch)
    if "namespace" in kustomization:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = kustomization["namespace"]
    return objects


@attrs.frozen
class Daemon:
    """The rendered DaemonSet, its container, its config and its command line."""

    objects: list[dict[str, Any]]
    daemonset: dict[str, Any]
    pod: dict[str, Any]
    container: dict[str, Any]
    flags: dict[str, str]
    config: Config

    def mounts(self) -> Iterator[tuple[PurePosixPath, PurePosixPath | None, bool]]:
        """(container path, host path or None when not a hostPath, read only) per volume mount."""
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        for mount in self.container["volumeMounts"]:
            host = volumes[mount["name"]].get("hostPath")
            yield PurePosixPath(mount["mountPath"]), PurePosixPath(host["path"]) if host else None, bool(mount.get("readOnly"))

    def host_path_of(self, path: str | Path) -> PurePosixPath | None:
        """Where ``path`` (seen in the container) lies on the node, or None when not on a hostPath."""
        path = PurePosixPath(path)
        best = None
        for container_path, host_path, _ in self.mounts():
            if path.is_relative_to(container_path) and (best is None or len(container_path.parts) > len(best[0].parts)):
                best = (container_path, host_path)
        if best is None or best[1] is None:
            return None
        return best[1] / path.relative_to(best[0])


def daemon(name: str) -> Daemon:
    objects = render(DEPLOY / name)
    daemonset = _find(objects, "DaemonSet", "cdiplug")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "serve"
    flags = dict(a.removeprefix("--").split("=", 1) for a in args[1:])
    config_map = _find(objects, "ConfigMap", next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v))
    config_path = PurePosixPath(flags["config"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert config_path.parent == PurePosixPath(mount["mountPath"])
    text = config_map["data"][config_path.name]
    config = parse_config(yaml.safe_load(text), f"{name}/{config_path.name}")
    return Daemon(objects, daemonset, pod, container, flags, config)


# -- every file -----------------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    # deploy/scheduler holds a component config, not an API object (tests/deploy/test_scheduler_config.py);
    # deploy/prometheus rule files (tests/deploy/test_prometheus_rules.py); deploy/helm templates and
    # values, checked rendered (tests/deploy/test_chart.py).
    return sorted(
        p
        for p in DEPLOY.rglob("*.yaml")
        if p.name not in ("kustomization.yaml", "config.yaml")
        and p.parent.name not in ("scheduler", "prometheus")
        and not p.is_relative_to(DEPLOY / "helm")
    )


def test_the_manifests_are_found() -> None:
    assert len(manifest_files()) >= 5, f"the manifests under {DEPLOY} were not found"


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_deserializes(path: Path) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert documents
    for doc in documents:
        if path.name.endswith("-patch.yaml") and doc["kind"] == "DeviceClass":
            # A partial object of an overlay's own (no base has it): as its overlay renders it.
            assert_round_trips(_find(render(path.parent), doc["kind"], doc["metadata"]["name"]), str(path))
        elif path.name.endswith("-patch.yaml"):
            # A partial object: check it merged onto the base's.
            target = copy.deepcopy(_find(render(DEPLOY / "base"), doc["kind"], doc["metadata"]["name"]))
            strategic_merge(target, doc)
            assert_round_trips(target, str(path))
        else:
            assert_round_trips(doc, str(path))


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomization_renders_to_valid_objects(name: str) -> None:
    objects = render(DEPLOY / name)
    assert objects
    for obj in objects:
        assert_round_trips(obj, name)
        if obj["kind"] not in CLUSTER_SCOPED and not name.startswith("examples"):
            assert obj["metadata"]["namespace"] == "cdiplug-system"


def test_config_files_parse() -> None:
    paths = sorted(DEPLOY.rglob("config.yaml"))
    assert paths, f"no config.yaml under {DEPLOY}"
    for path in paths:
        parse_config(yaml.safe_load(path.read_text()), str(path))


def test_strategic_merge_subset() -> None:
    base = {"a": {"b": 1, "c": 2}, "containers": [{"name": "x", "args": ["1"], "env": [{"name": "E", "value": "1"}]}]}
    strategic_merge(
        base,
        {"a": {"c": None}, "containers": [{"name": "x", "args": ["2"], "env": [{"name": "F", "value": "2"}]}, {"name": "y"}]},
    )
    assert base == {
        "a": {"b": 1},
        "containers": [
            {"name": "x", "args": ["2"], "env": [{"name": "E", "value": "1"}, {"name": "F", "value": "2"}]},
            {"name": "y"},
        ],
    }


# -- the DaemonSet --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DAEMON_KUSTOMIZATIONS)
def test_daemonset_mounts_every_folder_it_uses(name: str) -> None:
    d = daemon(name)
    # The kubelet and the runtime look at these on the node: same path in the pod and on the node.
    for flag, default in (("kubelet-dir", DEFAULT_KUBELET_DIR), ("cdi-dir", DEFAULT_CDI_DIR), ("state-dir", DEFAULT_STATE_DIR)):
        path = d.flags.get(flag, str(default))
        assert d.host_path_of(path) == PurePosixPath(path), f"{name}: --{flag} {path} is not the node's folder"
        assert not [ro for c, _, ro in d.mounts() if c == PurePosixPath(path) and ro], f"{name}: --{flag} is mounted read-only"
    assert d.host_path_of(d.flags.get("cdi-dir", str(DEFAULT_CDI_DIR))) in (
        PurePosixPath("/var/run/cdi"),
        PurePosixPath("/etc/cdi"),
    )

    backends = {r.backend for r in d.config.resources}
    if backends & {"pci", "nvidia"}:
        assert d.host_path_of(d.flags["sysfs-root"]) == PurePosixPath("/sys")
    if "pci" in backends:
        socket = PurePosixPath(d.flags.get("pod-resources-socket", str(DEFAULT_POD_RESOURCES_SOCKET)))
        assert d.host_path_of(socket.parent) == socket.parent
        assert d.host_path_of("/dev/vfio") == PurePosixPath("/dev/vfio")

    # Every path in a backend's options (health files, mount tables, driver roots) must be the
    # node's: on a hostPath, or in /proc when the pod shares the node's PID namespace.
    for resource in d.config.resources:
        for field in attrs.fields(type(resource.options)):
            value = getattr(resource.options, field.name)
            if not isinstance(value, Path):
                continue
            if value.is_relative_to("/proc"):
                assert d.pod.get("hostPID"), f"{name}: {resource.name} options.{field.name} {value} needs hostPID"
            else:
                assert d.host_path_of(value) is not None, (
                    f"{name}: {resource.name} options.{field.name} {value} is on no hostPath"
                )


@pytest.mark.parametrize("name", DAEMON_KUSTOMIZATIONS)
def test_probes_point_at_the_metrics_port(name: str) -> None:
    d = daemon(name)
    port = int(d.flags["metrics-address"].rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in d.container["ports"]}
    assert ports["metrics"] == port
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = d.container[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == port
        # The daemon waits up to 2 s for its event loop to answer /healthz.
        assert d.container[probe]["timeoutSeconds"] > 2
    annotations = d.daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)


@pytest.mark.parametrize("name", DAEMON_KUSTOMIZATIONS)
def test_metrics_listen_on_the_pod_ip_only(name: str) -> None:
    """The endpoint has no authentication; never every interface of the node."""
    d = daemon(name)
    assert d.flags["metrics-address"].rpartition(":")[0] == "$(POD_IP)"
    env = {e["name"]: e for e in d.container.get("env", [])}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.mark.parametrize("name", DAEMON_KUSTOMIZATIONS)
def test_command_line_is_what_cdiplug_serve_accepts(name: str) -> None:
    d = daemon(name)
    parsed = build_parser().parse_args(d.container["args"])
    assert parsed.command == "serve"
    assert parsed.config == d.flags["config"]


@pytest.mark.parametrize("name", DAEMON_KUSTOMIZATIONS)
def test_scheduling_and_resources(name: str) -> None:
    d = daemon(name)
    assert d.pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in d.pod["tolerations"], "must tolerate every taint"
    resources = d.container["resources"]
    request = int(resources["requests"]["memory"].removesuffix("Mi"))
    limit = int(resources["limits"]["memory"].removesuffix("Mi"))
    assert MEASURED_RSS_MI < request < limit
    assert "cpu" not in resources["limits"], "a CPU limit throttles Allocate"
    security = d.container["securityContext"]
    # The API server refuses privileged together with allowPrivilegeEscalation: false.
    assert not (security.get("privileged") and security.get("allowPrivilegeEscalation") is False)
    assert security["runAsUser"] == 0


def test_overlays_stay_consistent_with_the_base() -> None:
    base = daemon("base")
    base_ids = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in base.objects}
    for name in ("overlays/fake", "overlays/hardware", "overlays/dra"):
        overlay = daemon(name)
        ids = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in overlay.objects}
        # The DRA overlay adds its RBAC and DeviceClass; the others add nothing.
        assert ids >= base_ids if name == "overlays/dra" else ids == base_ids
        # The DRA overlay surges (test_dra_manifests: seamless upgrade); the others keep the base's.
        for key in ("selector",) if name == "overlays/dra" else ("selector", "updateStrategy"):
            assert overlay.daemonset["spec"][key] == base.daemonset["spec"][key], f"{name}: {key}"
        assert overlay.daemonset["spec"]["template"]["metadata"] == base.daemonset["spec"]["template"]["metadata"]
        for key in ("priorityClassName", "tolerations", "volumes"):
            for item in base.pod[key] if isinstance(base.pod[key], list) else [base.pod[key]]:
                assert item in (overlay.pod[key] if isinstance(overlay.pod[key], list) else [overlay.pod[key]]), (
                    f"{name}: {key} {item}"
                )
        for key in ("image", "ports", "livenessProbe", "readinessProbe"):
            assert overlay.container[key] == base.container[key], f"{name}: container {key}"
        # An overlay may give more memory, never less.
        for kind in ("requests", "limits"):
            mine, theirs = overlay.container["resources"][kind], base.container["resources"][kind]
            assert set(mine) == set(theirs), f"{name}: resources.{kind}"
            for quantity in theirs:
                assert int(str(mine[quantity]).rstrip("Mim")) >= int(str(theirs[quantity]).rstrip("Mim")), (
                    f"{name}: {kind}.{quantity}"
                )
        for mount in base.container["volumeMounts"]:
            assert mount in overlay.container["volumeMounts"], f"{name}: lost mount {mount}"
        # An overlay may add flags, never change the base's.
        for flag, value in base.flags.items():
            assert overlay.flags.get(flag) == value, f"{name}: --{flag}"


def test_base_is_unprivileged_and_hardware_documents_its_privileges() -> None:
    base = daemon("base")
    security = base.container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert not base.pod.get("hostNetwork") and not base.pod.get("hostPID")
    assert {r.backend for r in base.config.resources} == {"fake"}

    hardware = daemon("overlays/hardware")
    assert hardware.container["securityContext"]["privileged"] is True
    assert {r.backend for r in hardware.config.resources} == {"pci", "nvidia"}
    # Each thing the hardware overlay adds carries a comment saying why, on the line above.
    lines = (DEPLOY / "overlays/hardware/daemonset-patch.yaml").read_text().splitlines()
    commented = 0
    for i, line in enumerate(lines):
        adds = re.match(r"^\s+(hostNetwork|hostPID|privileged):", line) or (
            re.match(r"^\s+- name: ", line) and i + 1 < len(lines) and "mountPath:" in lines[i + 1]
        )
        if adds:
            assert lines[i - 1].strip().startswith("#"), f"no comment above {line.strip()!r}"
            commented += 1
    assert commented == 6  # hostNetwork, hostPID, privileged, /sys, /dev/vfio, pod-resources


def test_fake_overlay_serves_two_fpgas_with_a_health_file_on_the_node() -> None:
    fake = daemon("overlays/fake")
    (resource,) = fake.config.resources
    assert (resource.name, resource.options.count) == ("example.com/fpga", 2)
    assert fake.host_path_of(resource.options.health_file) == PurePosixPath(resource.options.health_file)


# -- examples, RBAC, image ------------------------------------------------------------------------


def test_example_pods_make_the_classic_experiment() -> None:
    pods = render(DEPLOY / "examples")
    asked = sorted(int(c["resources"]["limits"]["example.com/fpga"]) for p in pods for c in p["spec"]["containers"])
    assert asked == [1, 1, 3]
    (fpga,) = daemon("overlays/fake").config.resources
    assert asked[0] + asked[1] <= fpga.options.count < asked[2], "two fit, the third stays Pending"
    for pod in pods:
        assert pod["spec"]["restartPolicy"] == "Never"


def test_rbac_grants_only_patching_node_status() -> None:
    objects = {o["kind"]: o for o in yaml.safe_load_all((DEPLOY / "rbac-node-capacity.yaml").read_text())}
    assert objects["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    (subject,) = binding["subjects"]
    account = objects["ServiceAccount"]["metadata"]
    assert (subject["kind"], subject["name"], subject["namespace"]) == ("ServiceAccount", account["name"], account["namespace"])
    namespace = yaml.safe_load((DEPLOY / "base/namespace.yaml").read_text())["metadata"]["name"]
    assert account["namespace"] == namespace


def test_containerfile() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    # The base image is a build argument (hack/local-cluster.sh passes a Debian one made with
    # debootstrap); its default, what users get, is the public slim Python image.
    args = dict(line.split(None, 1)[1].split("=", 1) for line in instructions if line.startswith("ARG ") and "=" in line)
    froms = [
        re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], line.split()[1]) for line in instructions if line.startswith("FROM ")
    ]
    assert froms and all(re.fullmatch(r"docker\.io/library/python:3\.11-slim(-\w+)?", f) for f in froms)
    assert re.search(r"pip install [^\n]*\.\s", text)
    assert 'ENTRYPOINT ["cdiplug"]' in instructions
    assert "USER 0:0" in instructions
    assert re.search(r"^# It runs as root on purpose\..*socket.*vfio", text, re.S | re.M | re.I)
    image = daemon("base").container["image"]
    assert image.split(":")[0] == "cdiplug"
