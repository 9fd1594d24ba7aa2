"""Device health on a real node: a device turned Unhealthy through the fake backend's health file
(``deploy/overlays/fake`` reads ``/var/lib/cdiplug/fake-health.yaml``, a hostPath the test writes on
the node) drops the node's allocatable ``example.com/fpga`` to 1 and back to 2, capacity staying 2,
and the running pod holding it shows it in ``status.containerStatuses[].allocatedResourcesStatus``
(KEP-4680, ``ResourceHealthStatus``: beta and on by default in 1.36).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import HEALTH_FILE, write_health

# The first test's setup may bring the node up and build the image (minutes from scratch).
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

TEST_NAMESPACE = "cdiplug-cluster-test"
FPGA = "example.com/fpga"


@pytest.fixture
def health_file(cdiplug: dict[str, Any]) -> Iterator[None]:
    HEALTH_FILE.unlink(missing_ok=True)
    yield
    HEALTH_FILE.unlink(missing_ok=True)


def device_health(pod: dict[str, Any]) -> dict[str, str]:
    """resource ID -> health, from the pod's allocatedResourcesStatus for example.com/fpga."""
    (status,) = pod["status"]["containerStatuses"]
    return {
        r["resourceID"]: r["health"]
        for entry in status.get("allocatedResourcesStatus") or []
        if entry["name"] == FPGA
        for r in entry.get("resources") or []
    }


def test_unhealthy_device_drops_allocatable_and_shows_in_the_pod_status(kube: Any, pods: Any, health_file: None) -> None:
    pods("holds-both", {FPGA: 2})
    kube.watch(
        "pod/holds-both",
        lambda p: device_health(p) == {"fpga-0": "Healthy", "fpga-1": "Healthy"},
        namespace=TEST_NAMESPACE,
        what="both devices Healthy in allocatedResourcesStatus",
    )

    write_health("fpga-1: Unhealthy\n")
    node = kube.wait_node("allocatable", FPGA, "1")
    assert node["status"]["capacity"][FPGA] == "2"
    kube.watch(
        "pod/holds-both",
        lambda p: device_health(p) == {"fpga-0": "Healthy", "fpga-1": "Unhealthy"},
        namespace=TEST_NAMESPACE,
        what="fpga-1 Unhealthy in allocatedResourcesStatus",
    )

    write_health("fpga-1: Healthy\n")
    node = kube.wait_node("allocatable", FPGA, "2")
    assert node["status"]["capacity"][FPGA] == "2"
    pod = kube.watch(
        "pod/holds-both",
        lambda p: device_health(p) == {"fpga-0": "Healthy", "fpga-1": "Healthy"},
        namespace=TEST_NAMESPACE,
        what="fpga-1 Healthy again in allocatedResourcesStatus",
    )
    # The pod was never disturbed: same container, still running.
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 0 and "running" in status["state"]
