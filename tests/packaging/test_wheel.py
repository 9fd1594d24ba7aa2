"""The distribution as users install it: the wheel's packages, names and entry points, the wheel
installed and every backend loaded from it, and a daemon started from a folder that holds a
``backends/`` folder of its own.

Builds the real wheel with pip (no dependencies, offline) into a temporary folder and installs it
(``pip install --target``) where a fresh interpreter finds it before the editable checkout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds and installs a wheel (hack/test.sh --fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [built] = out.glob("cdiplug-*.whl")
    return built


def _packages_in_repository() -> set[str]:
    """Every package folder of the checkout, under the name it installs as."""
    found = set()
    for top, name in (("cdiplug", "cdiplug"), ("backends", "cdiplug_backends")):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((name, *parts)))
    return found


def test_the_wheel_installs_cdiplug_and_cdiplug_backends_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry_points).decode()
    assert top == {"cdiplug", "cdiplug_backends"}
    for name in ("fake", "pci", "nvidia"):
        assert f"{name} = cdiplug_backends.{name}:plugin" in text
    assert "cdiplug/api/deviceplugin_v1beta1.proto" in names and "cdiplug/py.typed" in names
    # found, not listed: every package folder is in the wheel (the backends' testing fakes too)
    packaged = {n.removesuffix("/__init__.py").replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packaged == _packages_in_repository()
    assert {"cdiplug_backends.nvidia.testing", "cdiplug_backends.pci.testing"} <= packaged


_PROBE = """
import importlib.metadata, json, sys
import cdiplug_backends.nvidia.testing as nvidia_fakes, cdiplug_backends.pci.testing as pci_fakes
from cdiplug.backend import load_plugins
plugins = load_plugins()
loaded = {}
for ep in importlib.metadata.entry_points(group="cdiplug.backends"):
    plugin = plugins[ep.name]
    loaded[ep.name] = {"name": plugin.name, "file": sys.modules[ep.module].__file__}
print(json.dumps({
    "loaded": loaded,
    "cdiplug": sys.modules["cdiplug"].__file__,
    "fakes": [nvidia_fakes.FakeNvml.__module__, pci_fakes.SysfsTree.__module__],
}))
"""


def test_every_backend_entry_point_loads_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    backends = sorted(p.parent.name for p in (site / "cdiplug_backends").glob("*/__init__.py") if p.parent.name != "testing")
    assert backends == ["fake", "generic", "nvidia", "pci"]
    # PYTHONPATH comes before site-packages (and the checkout's editable finder): the wheel's files answer
    result = subprocess.run(
        [sys.executable, "-s", "-c", _PROBE],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert Path(found["cdiplug"]).is_relative_to(site)
    assert sorted(found["loaded"]) == backends
    for name, info in found["loaded"].items():
        assert info["name"] == name and Path(info["file"]).is_relative_to(site / "cdiplug_backends" / name)
    assert found["fakes"] == ["cdiplug_backends.nvidia.testing.nvml", "cdiplug_backends.pci.testing.sysfs"]


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
