"""``cdiplug discover`` shows the node labels it would write, for a named configuration as a node's label picks it.

Run as a user runs it (a subprocess, the fake backend): JSON and table name the cdiplug.dev/
labels; ``--configuration`` picks a named configuration, an unknown one exits 2 naming those the
file has; without ``node_labels: true`` the table says they are not written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CONFIG = """\
node_labels: true
configurations:
  default:
    resources: [{name: example.com/fpga, backend: fake, options: {count: 0}}]
  fast-fpga:
    resources:
      - name: example.com/fpga
        backend: fake
        options: {count: 2, attributes: {fpga-0: {speed: 9}, fpga-1: {speed: 9}}}
"""


def discover(tmp_path: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    command = [sys.executable, "-m", "cdiplug", "discover", "--config", str(path), "--state-dir", str(tmp_path), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_the_labels_of_a_named_configuration(tmp_path: Path) -> None:
    done = discover(tmp_path, CONFIG, "--configuration", "fast-fpga", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["example.com/fpga"]["node_labels"] == {
        "cdiplug.dev/example.com.fpga.model": "fake-fpga",
        "cdiplug.dev/example.com.fpga.speed": "9",
        "cdiplug.dev/example.com.fpga.count": "2",
    }
    default = json.loads(discover(tmp_path, CONFIG, "-o", "json").stdout)
    assert default["example.com/fpga"]["node_labels"] == {}  # no devices: no labels (and not registered)
    table = discover(tmp_path, CONFIG, "--configuration", "fast-fpga").stdout
    assert "node labels: cdiplug.dev/example.com.fpga.model=fake-fpga" in table
    assert "(named configuration 'fast-fpga' of default, fast-fpga)" in table


def test_an_unknown_name_and_labels_switched_off(tmp_path: Path) -> None:
    done = discover(tmp_path, CONFIG, "--configuration", "gpu-node")
    assert done.returncode == 2
    assert "no configuration named 'gpu-node' (the file has: default, fast-fpga) @ $.configurations" in done.stderr
    flat = discover(tmp_path, "resources: [{name: example.com/fpga, backend: fake}]\n").stdout
    assert "node labels: cdiplug.dev/example.com.fpga.model=fake-fpga cdiplug.dev/example.com.fpga.count=2" in flat
    assert "(node labels are not written: the configuration has no node_labels: true)" in flat
