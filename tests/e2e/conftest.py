"""Fixtures of the end-to-end tests that run real podman."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/cdiplug-busybox:e2e"  # what hack/podman-setup.sh imports (the test modules name it too)


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing or not Path("/bin/busybox").exists():
        pytest.fail(
            f"the CDI e2e test needs podman, runc and busybox-static; missing: {', '.join(missing) or '/bin/busybox'} "
            "(apt-get install podman runc busybox-static)"
        )
    if os.geteuid() != 0:
        pytest.fail("the CDI e2e test needs root: podman reads CDI specs only from /etc/cdi and /var/run/cdi")
    folder = tmp_path_factory.mktemp("podman")
    setup = subprocess.run(
        [str(REPO / "hack" / "podman-setup.sh"), str(folder), IMAGE], capture_output=True, text=True, timeout=300
    )
    if setup.returncode != 0:
        pytest.fail(f"hack/podman-setup.sh failed:\n{setup.stderr}")
    env = dict(os.environ, CONTAINERS_CONF=str(folder / "containers.conf"), CONTAINERS_STORAGE_CONF=str(folder / "storage.conf"))
    try:
        yield env
    finally:
        subprocess.run(["podman", "rm", "--all", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
