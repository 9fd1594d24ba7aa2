"""The command line's copies of the default folders equal cdiplug.world's (the CLI keeps its own
copies so that ``import cdiplug.cli`` stays cheap until the early signal handlers are in)."""

from __future__ import annotations

import subprocess
import sys

from cdiplug import cli, world


def test_cli_defaults_equal_the_worlds() -> None:
    assert cli.DEFAULT_KUBELET_DIR == world.DEFAULT_KUBELET_DIR
    assert cli.DEFAULT_CDI_DIR == world.DEFAULT_CDI_DIR
    assert cli.DEFAULT_STATE_DIR == world.DEFAULT_STATE_DIR
    assert cli.DEFAULT_POD_RESOURCES_SOCKET == world.DEFAULT_POD_RESOURCES_SOCKET
    assert cli.DEFAULT_PLUGINS_REGISTRY_DIR == world.DEFAULT_PLUGINS_REGISTRY_DIR
    assert cli.DEFAULT_PLUGINS_DIR == world.DEFAULT_PLUGINS_DIR


def test_importing_the_command_line_imports_neither_attrs_nor_grpc() -> None:
    code = "import sys, cdiplug.cli; print(sorted(m for m in ('attr', 'attrs', 'grpc', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
