"""The per-claim configuration and admin-access examples against a REAL kube-apiserver 1.36.

The API server of tests/e2e/test_dra_apiserver.py (etcd and kube-apiserver on free loopback
ports in a temporary folder; its fixture, a server of this module's own). Covers: the objects of
``deploy/examples/dra/configured.yaml`` and ``admin-access.yaml`` are accepted (server dry run)
with what cdiplug reads kept as written: the DeviceClass's and the claim template's opaque
configuration, the request's ``adminAccess``; an admin-access claim outside a namespace labelled
``resource.kubernetes.io/admin-access: "true"`` is refused by the server; the examples'
parameters, as the server keeps them, decode strictly with the fake backend (so the examples
cannot drift from what cdiplug accepts) and merge as configured.yaml says; the ConfigMap of
``cdiplug-config.yaml`` is accepted and its config.yaml loads with the real config loader.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdiplug.config import parse_config
from cdiplug.dra import claim_config
from cdiplug.dra.claims import AllocatedClaim, AllocatedDevice, ClaimRef, ConfigEntry, ConfigSource
from cdiplug.models.devices import ContainerEdits, Device
from cdiplug.models.world import World
from cdiplug_backends.fake.backend import FakeBackend

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples" / "dra"
DRIVER = "fpga.example.com"

# The real API server fixture, from its module (test modules cannot import each other under importlib mode).
_spec = importlib.util.spec_from_file_location("_dra_apiserver", Path(__file__).with_name("test_dra_apiserver.py"))
assert _spec is not None and _spec.loader is not None
_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server)
apiserver = _server.apiserver
kubectl = _server.kubectl


def objects(name: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all((EXAMPLES / name).read_text()) if o]


def dry_run(kubeconfig: Path, items: list[dict[str, Any]], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "apply", "--validate=false", "--dry-run=server", "-o", "json", "-f", "-"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert not check or done.returncode == 0, done.stderr
    return done


def answered(done: subprocess.CompletedProcess[str]) -> dict[tuple[str, str], dict[str, Any]]:
    out = json.loads(done.stdout)
    items = out["items"] if out.get("kind") == "List" else [out]
    return {(i["kind"], i["metadata"]["name"]): i for i in items}


def service_account(kubeconfig: Path, namespace: str) -> None:
    """The namespace's default service account, which pods need (no controller manager makes it here)."""
    if not kubectl(kubeconfig, "get", "serviceaccounts", "-n", namespace, "--ignore-not-found", "-o", "name").strip():
        kubectl(kubeconfig, "create", "serviceaccount", "default", "-n", namespace)


def test_the_configured_example_is_accepted_and_its_parameters_decode(apiserver: Path, world: World) -> None:
    service_account(apiserver, "default")
    got = answered(dry_run(apiserver, objects("configured.yaml")))
    cls = got[("DeviceClass", "fpga-configured.example.com")]
    template = got[("ResourceClaimTemplate", "configured-fpga")]
    assert ("Pod", "dra-configured-pod") in got
    # What the scheduler copies into the allocation: the class's entries, then the claim's.
    entries = tuple(
        ConfigEntry(source, tuple(c.get("requests") or ()), c["opaque"]["parameters"])
        for source, configs in (
            (ConfigSource.CLASS, cls["spec"]["config"]),
            (ConfigSource.CLAIM, template["spec"]["spec"]["devices"]["config"]),
        )
        for c in configs
        if c["opaque"]["driver"] == DRIVER
    )
    assert len(entries) == 2
    claim = AllocatedClaim(ClaimRef("default", "configured-fpga-x", "u1"), (AllocatedDevice("fpga", "n1", "fpga-0"),), entries)
    device = Device("fpga-0", edits=ContainerEdits(env={"FAKE_FPGA_DEVICE_0": "fpga-0"}))
    shaped = claim_config.configure(claim, {"fpga-0": device}, "example.com/fpga", FakeBackend([], world))["fpga-0"]
    env = dict(shaped.device.edits.env)
    assert (env["FAKE_FPGA_DEVICE_0_MODE"], env["LOG_LEVEL"], env["TEAM"]) == ("shared", "debug", "red")  # as its comment says


def test_the_admin_access_example_is_accepted_in_its_labelled_namespace_only(apiserver: Path) -> None:
    items = objects("admin-access.yaml")
    (namespace,) = [o for o in items if o["kind"] == "Namespace"]
    kubectl(apiserver, "apply", "-f", "-", input=namespace)  # real: the server checks the claim's namespace label
    service_account(apiserver, "cdiplug-admin")
    got = answered(dry_run(apiserver, [o for o in items if o["kind"] != "Namespace"]))
    monitor = got[("ResourceClaimTemplate", "fpga-0-monitor")]
    (request,) = monitor["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["adminAccess"] is True
    assert ("Pod", "dra-fpga-monitor") in got and ("Pod", "dra-fpga-workload") in got

    kubectl(apiserver, "create", "namespace", "cdiplug-unlabelled")
    elsewhere = next(o for o in items if o["metadata"]["name"] == "fpga-0-monitor")
    elsewhere = {**elsewhere, "metadata": {**elsewhere["metadata"], "namespace": "cdiplug-unlabelled"}}
    refused = dry_run(apiserver, [elsewhere], check=False)
    assert refused.returncode != 0 and "adminAccess: Forbidden: admin access to devices requires" in refused.stderr, (
        refused.stderr
    )


def test_the_cdiplug_config_of_the_examples_is_accepted_and_loads(apiserver: Path) -> None:
    (configmap,) = objects("cdiplug-config.yaml")
    kubectl(apiserver, "create", "namespace", "cdiplug-system")
    got = answered(dry_run(apiserver, [configmap]))
    text = got[("ConfigMap", "cdiplug-examples-config")]["data"]["config.yaml"]
    config = parse_config(yaml.safe_load(text), "cdiplug-config.yaml")
    fpga = config.by_name()["example.com/fpga"]
    assert fpga.settings.dra_driver == DRIVER  # what configured.yaml and admin-access.yaml name
