"""The command line's default folders are cdiplug.models.world's (one source), and importing the
command line stays cheap (no attrs, grpc or yaml) until the early signal handlers are in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cdiplug import cli
from cdiplug.models.world import World


def test_serve_without_folder_flags_builds_the_default_world(monkeypatch: pytest.MonkeyPatch) -> None:
    for flag in ("KUBELET_DIR", "CDI_DIR", "STATE_DIR", "SYSFS_ROOT", "DEV_ROOT", "POD_RESOURCES_SOCKET"):
        monkeypatch.delenv(f"CDIPLUG_{flag}", raising=False)
    for flag in ("PLUGINS_REGISTRY_DIR", "PLUGINS_DIR", "NODE_NAME", "KUBECONFIG"):
        monkeypatch.delenv(f"CDIPLUG_{flag}", raising=False)
    args = cli.build_parser("serve").parse_args(["serve"])
    assert cli.world_from_args(args) == World()


def test_importing_the_command_line_imports_neither_attrs_nor_grpc() -> None:
    code = "import sys, cdiplug.cli; print(sorted(m for m in ('attr', 'attrs', 'grpc', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
