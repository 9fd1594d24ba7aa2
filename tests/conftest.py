"""Fixtures shared by every test: a World of short-lived folders.

Unix socket paths are limited to 107 bytes, and pytest's ``tmp_path`` can be longer than that with
long test names, so the folders live under a short, fresh ``mkdtemp`` folder instead.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdiplug.models.world import World


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cdp-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def world(short_tmp: Path) -> World:
    """A World whose folders are fresh and empty (sysfs and dev roots point at empty folders)."""
    folders = {name: short_tmp / name for name in ("kubelet", "cdi", "state", "sys", "dev")}
    for path in folders.values():
        path.mkdir()
    return World(
        kubelet_dir=folders["kubelet"],
        cdi_dir=folders["cdi"],
        state_dir=folders["state"],
        sysfs_root=folders["sys"],
        dev_root=folders["dev"],
        pod_resources_socket=short_tmp / "pod-resources.sock",
    )
