"""deploy/scheduler/kube-scheduler-config.yaml: the default profile left as Kubernetes has it, and
the cdiplug-device-first profile whose DynamicResources score outweighs the default score plugins
together (tests/cluster/test_multinode.py checks it on a real scheduler, idle and busy)."""

from __future__ import annotations

from pathlib import Path

import yaml

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
# kube-scheduler 1.36's default score plugins and weights (besides DynamicResources, weight 1).
DEFAULT_SCORE_WEIGHTS = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
    "InterPodAffinity": 2,
    "PodTopologySpread": 2,
}


def test_profiles() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    default, device_first = config["profiles"]
    assert default == {"schedulerName": "default-scheduler"}
    assert device_first["schedulerName"] == "cdiplug-device-first"
    (plugin,) = device_first["plugins"]["score"]["enabled"]
    assert plugin["name"] == "DynamicResources"
    # Resource-driven scores (fit, balance, image locality) can differ by at most 100 x 3 between
    # nodes; the device rank must be able to outweigh that.
    assert plugin["weight"] * 100 > 100 * sum(
        DEFAULT_SCORE_WEIGHTS[p] for p in ("NodeResourcesFit", "NodeResourcesBalancedAllocation", "ImageLocality")
    )
    # The local cluster substitutes its kubeconfig for this line.
    assert "\n  kubeconfig: " in CONFIG.read_text()
