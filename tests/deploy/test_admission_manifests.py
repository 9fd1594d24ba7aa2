"""deploy/admission: the kustomize installation of the admission webhook (the chart's is
tests/deploy/test_chart_observe.py; on a real node: tests/cluster/test_admission.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from cdiplug.config import parse_config
from cdiplug.models.resource import Api

ROOT = Path(__file__).resolve().parents[2]


def test_admission_manifests_judge_the_dra_overlay_drivers() -> None:
    """deploy/admission's configuration is the DRA overlay's, and its webhooks list its drivers."""
    admission = ROOT / "deploy" / "admission"
    assert (admission / "config.yaml").read_bytes() == (ROOT / "deploy" / "overlays" / "dra" / "config.yaml").read_bytes()
    config = parse_config(yaml.safe_load((admission / "config.yaml").read_text()), "deploy/admission/config.yaml")
    drivers = {r.settings.dra_driver for r in config.resources if r.api == Api.DRA}
    hooks = yaml.safe_load((admission / "webhook.yaml").read_text())["webhooks"]
    for hook in hooks:
        listed = hook["matchConditions"][0]["expression"].split(" in [", 1)[1].split("]", 1)[0]
        assert {d.strip(" '") for d in listed.split(",")} == drivers
        assert hook["failurePolicy"] == "Ignore"
