"""``cdiplug doctor`` on the local cluster's real node (``hack/local-cluster.sh``): the real kubelet's
folders and sockets, the running containerd found through /proc with its own config.toml.

The healthy node passes; the same node judged against a copy of containerd's configuration with
CDI turned off is reported (containerd itself is left running as it is). Only the node is needed
(no cdiplug image, no deployment), so the cluster is brought up here when it is not, and down
again afterwards unless it was up before (or ``CDIPLUG_CLUSTER_KEEP=1``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import SCRIPT, script

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def containerd_config() -> Iterator[Path]:
    """The node up; the path of its containerd's config.toml."""
    if os.geteuid() != 0:
        pytest.fail("the cluster tests run a kubelet and containerd: run them as root", pytrace=False)
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False).returncode == 0
    script("up")
    env = dict(line.removeprefix("export ").split("=", 1) for line in script("env").splitlines() if "=" in line)
    yield Path(env["CDIPLUG_CLUSTER_DIR"]) / "containerd" / "config.toml"
    if not was_up and not os.environ.get("CDIPLUG_CLUSTER_KEEP"):
        script("down")


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDIPLUG_")}
    return subprocess.run(
        [sys.executable, "-m", "cdiplug", "doctor", *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_the_healthy_node_passes(containerd_config: Path) -> None:
    done = doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # found through /proc: the running containerd's --config, not /etc/containerd/config.toml
    assert f"ok: containerd CDI: CDI is on (enable_cdi = true in {containerd_config})" in lines
    assert "ok: kubelet registration socket: /var/lib/kubelet/device-plugins/kubelet.sock is there" in lines
    assert "ok: PodResources socket: /var/lib/kubelet/pod-resources/kubelet.sock is there" in lines
    assert "ok: plugin registration folder: /var/lib/kubelet/plugins_registry is there" in lines
    assert not [line for line in lines if line.startswith("problem: ")]


def test_cdi_turned_off_in_containerd_is_reported(containerd_config: Path, tmp_path: Path) -> None:
    text = containerd_config.read_text()
    assert "enable_cdi = true" in text
    copy = tmp_path / "config.toml"
    copy.write_text(text.replace("enable_cdi = true", "enable_cdi = false"))
    done = doctor("--containerd-config", str(copy))
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("problem: ")]
    assert line.startswith(
        f'problem: containerd CDI: CDI is turned off: enable_cdi = false in [plugins."io.containerd.cri.v1.runtime"] of {copy}'
    )
    assert "(fix: set enable_cdi = true in" in line and "and restart containerd)" in line
    assert "1 problems" in done.stderr
