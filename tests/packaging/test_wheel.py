"""The distribution as users install it: the wheel's top-level names and entry points, and a
daemon started from a folder that holds a ``backends/`` folder of its own.

Builds the real wheel with pip (no dependencies, offline) into a temporary folder.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_cdiplug_and_cdiplug_backends_only(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("cdiplug-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry_points).decode()
    assert top == {"cdiplug", "cdiplug_backends"}
    for name in ("fake", "pci", "nvidia"):
        assert f"{name} = cdiplug_backends.{name}:plugin" in text
    assert "cdiplug/api/deviceplugin_v1beta1.proto" in names and "cdiplug/py.typed" in names


def test_a_backends_folder_in_the_working_directory_changes_nothing(tmp_path: Path) -> None:
    # Before, the wheel installed a top-level "backends" package: run from a folder holding a
    # backends/ of someone else's, python -m cdiplug could not load its own fake backend.
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "__init__.py").write_text("raise ImportError('not cdiplug backends')\n")
    result = subprocess.run(
        [sys.executable, "-m", "cdiplug", "discover", "-o", "json"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert '"fpga-0"' in result.stdout and '"fpga-1"' in result.stdout
