"""deploy/examples/dra: the per-claim configuration and admin-access examples and their cdiplug configuration.

Read as files (the real server's view is tests/e2e/test_dra_examples_apiserver.py). Checks: the
examples' ConfigMap holds the DRA overlay's fpga resource with only ``prepared_dir`` added, so the
examples and the overlay cannot drift apart; the patch its comment gives points the overlay's
DaemonSet's config volume at it; every opaque entry of the examples names the driver that resource
is served as; the admin-access example's claims live in its own labelled namespace, the monitor's
alone asking admin access, both selecting the same device; configured.yaml is in the kustomization,
admin-access.yaml (which brings a namespace) not.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from cdiplug.config import parse_config

from .test_manifests import DEPLOY, daemon

EXAMPLES = DEPLOY / "examples" / "dra"


def objects(name: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all((EXAMPLES / name).read_text()) if o]


def examples_config() -> dict[str, Any]:
    (configmap,) = objects("cdiplug-config.yaml")
    return dict(yaml.safe_load(configmap["data"]["config.yaml"]))


def test_the_examples_config_is_the_overlays_fpga_with_a_prepared_dir() -> None:
    ours = {r["name"]: r for r in examples_config()["resources"]}["example.com/fpga"]
    (theirs,) = [
        r
        for r in yaml.safe_load((DEPLOY / "overlays/dra/config.yaml").read_text())["resources"]
        if r["name"] == "example.com/fpga"
    ]
    options = dict(ours["options"])
    assert options.pop("prepared_dir") == "/var/lib/cdiplug/prepared"
    assert {**ours, "options": options} == theirs
    assert (
        parse_config(examples_config(), "cdiplug-config.yaml").by_name()["example.com/fpga"].settings.dra_driver
        == "fpga.example.com"
    )


def test_the_config_patch_points_the_daemonset_at_the_examples_configmap() -> None:
    (configmap,) = objects("cdiplug-config.yaml")
    text = (EXAMPLES / "cdiplug-config.yaml").read_text()
    patch = json.loads(re.search(r"'(\{.*\})'", text).group(1))  # type: ignore[union-attr]
    (volume,) = patch["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"] and configmap["metadata"]["namespace"] == "cdiplug-system"
    names = [v["name"] for v in daemon("overlays/dra").pod["volumes"] if "configMap" in v]
    assert names == [volume["name"]]  # the overlay's config volume, by its name (a strategic merge key)


def test_opaque_entries_name_the_served_driver() -> None:
    found = []
    for o in objects("configured.yaml"):
        spec = o.get("spec", {})
        for entry in spec.get("config", []) + spec.get("spec", {}).get("devices", {}).get("config", []):
            found.append(entry["opaque"]["driver"])
            assert entry["opaque"]["parameters"]["apiVersion"] == "cdiplug.dev/v1alpha1"
            assert entry["opaque"]["parameters"]["kind"] == "FakeConfig"
    assert found == ["fpga.example.com", "fpga.example.com"]  # the class's and the claim's


def test_the_admin_access_example() -> None:
    items = objects("admin-access.yaml")
    (namespace,) = [o for o in items if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"] == {"resource.kubernetes.io/admin-access": "true"}
    templates = {o["metadata"]["name"]: o for o in items if o["kind"] == "ResourceClaimTemplate"}
    assert {o["metadata"]["namespace"] for o in items if o["kind"] != "Namespace"} == {namespace["metadata"]["name"]}
    requests = {n: t["spec"]["spec"]["devices"]["requests"][0]["exactly"] for n, t in templates.items()}
    assert {n: r.get("adminAccess", False) for n, r in requests.items()} == {"fpga-0-monitor": True, "fpga-0": False}
    assert requests["fpga-0-monitor"]["selectors"] == requests["fpga-0"]["selectors"]  # the same device
    kustomization = yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())["resources"]
    assert "configured.yaml" in kustomization and "admin-access.yaml" not in kustomization
