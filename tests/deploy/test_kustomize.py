"""deploy/kustomize, the `kubectl apply -k` path: the chart's rendering, up to date, and what kustomize makes of it.

``hack/render-kustomize.sh`` run into a fresh folder must give exactly the files in deploy/kustomize
(one folder per example values file), and the real kubectl 1.36.3 (kustomize 5.8.1) must render each
folder to the objects ``helm template`` gives, plus the Namespace.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from .chart import EXAMPLES, REPO, template, tools

GENERATED = REPO / "deploy" / "kustomize"
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_deploy_kustomize_is_the_chart_rendered_now(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(REPO / "hack" / "render-kustomize.sh"), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    fresh, checked_in = tree(tmp_path), tree(GENERATED)
    stale = sorted(name for name in fresh.keys() | checked_in.keys() if fresh.get(name) != checked_in.get(name))
    assert not stale, f"deploy/kustomize is out of date (run hack/render-kustomize.sh): {stale}"
    assert sorted({name.split("/")[0] for name in fresh}) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_kubectl_kustomize_renders_the_charts_objects(name: str) -> None:
    result = subprocess.run(
        [str(tools() / "kubectl"), "kustomize", str(GENERATED / name)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    rendered = template(EXAMPLES / f"{name}.yaml", extra=["--set", "instance="])
    assert sorted((o for o in objects if o["kind"] != "Namespace"), key=key) == sorted(rendered, key=key)
    for obj in objects:
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass") and not obj["kind"].startswith(
            "Validating"
        ):
            assert obj["metadata"]["namespace"] == "cdiplug-system"
