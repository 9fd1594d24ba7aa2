"""A resource configured ``allocate: [cdi-cri]`` on a real node: the kubelet passes cdiplug's CDI
names to containerd 2.x in the CRI ``CDIDevices`` field, and containerd applies the CDI spec, so
the container's environment comes from the spec alone — checked inside the running container
(``FAKE_CDI_FPGA_DEVICE_0`` from the spec is there; ``FAKE_CDI_FPGA_DEVICES``, which only the
answer's envvar part would carry, is not).

The resource is served by a second, test-only cdiplug (``tests/cluster/overlays/cdi-cri``: the fake
overlay with another config, CDI folder /etc/cdi and its own state folder, in its own namespace)
beside the fake overlay's, which keeps running; the test deletes it and the files it wrote.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The first test's setup may bring the node up and build the image (minutes from scratch).
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

OVERLAY = Path(__file__).resolve().parent / "overlays" / "cdi-cri"
NAMESPACE = "cdiplug-cdi-cri-test"
TEST_NAMESPACE = "cdiplug-cluster-test"
RESOURCE = "example.com/cdi-fpga"
SPEC = Path("/etc/cdi/cdiplug-example.com-cdi-fpga.json")
STATE = Path("/var/lib/cdiplug-cdi-cri-test")


@pytest.fixture
def cdi_cri_daemon(kube: Any, cdiplug: dict[str, Any]) -> Iterator[dict[str, Any]]:
    kube("apply", "--validate=false", "-k", str(OVERLAY))
    try:
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=120s", timeout=130)
        yield kube.daemon_pod(NAMESPACE)
    finally:
        kube.remove_daemonset(NAMESPACE)
        SPEC.unlink(missing_ok=True)
        shutil.rmtree(STATE, ignore_errors=True)


def test_cdi_cri_only_container_env_comes_from_the_cdi_spec(kube: Any, cdi_cri_daemon: dict[str, Any], pods: Any) -> None:
    kube.wait_node("allocatable", RESOURCE, "1")
    spec = json.loads(SPEC.read_text())
    assert spec["kind"] == RESOURCE
    (device,) = spec["devices"]
    assert device == {"name": "cdi-fpga-0", "containerEdits": {"env": ["FAKE_CDI_FPGA_DEVICE_0=cdi-fpga-0"]}}

    pods("cdi-only", {RESOURCE: 1})
    env = kube.env_of("cdi-only", TEST_NAMESPACE)
    assert env.get("FAKE_CDI_FPGA_DEVICE_0") == "cdi-fpga-0", "containerd did not apply the CDI spec"
    assert "FAKE_CDI_FPGA_DEVICES" not in env, "the Allocate answer carried env although allocate is [cdi-cri]"
    assert not [k for k in env if k.startswith("FAKE_") and k != "FAKE_CDI_FPGA_DEVICE_0"], env
