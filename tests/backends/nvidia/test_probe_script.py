"""``hack/nvidia-probe`` as a subprocess, and the NVIDIA backend's CDI kind advice.

Against the real pynvml on a machine without an NVIDIA driver (as CI is), the script must exit 1
with one clear line and no traceback; with ``--fake`` it prints the GPU table, link matrix, a CDI
spec that passes cdiplug's own validation and preferred sets that agree with brute force.
"""

from __future__ import annotations

import ctypes.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cdiplug.cdi.spec import from_json
from cdiplug.cdi.validate import check_document, load_document
from cdiplug.models.names import kind_problem
from cdiplug_backends.nvidia.cdi_kind import NVIDIA_OWNED_KINDS, clash_problem, default_cdi_kind

pytestmark = pytest.mark.slow  # runs the probe scripts as subprocesses (hack/test.sh --fast leaves it out)

SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "nvidia-probe"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="this checks the no-driver path; this machine has the NVIDIA driver library",
)
def test_without_a_driver_it_says_so_and_exits_1() -> None:
    result = run()
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("nvidia-probe: NVML is not available:")
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("fake", "count", "best4"),
    [("nvswitch8", 8, "[0, 1, 2, 3]"), ("nvlink-pairs", 8, "[0, 1, 2, 3]"), ("pcie-box", 4, "[0, 1, 2, 3]")],
)
def test_with_a_fake_machine_it_prints_everything(fake: str, count: int, best4: str) -> None:
    result = run("--fake", fake)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{count} GPU(s)" in out
    assert out.count("/dev/nvidia") >= count
    assert "control nodes: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia-modeset" in out
    assert f"  4: GPUs {best4} score" in out
    assert "MISMATCH" not in out and out.count("(ok)") == (3 if count == 8 else 2)
    spec_text = out.split("(one resource holding every GPU; IDs env NVIDIA_VISIBLE_DEVICES):\n", 1)[1]
    spec_text = spec_text.split("\n\npreferred sets", 1)[0]
    assert check_document(load_document(spec_text)) == []
    spec = from_json(spec_text)
    assert spec.kind == "cdiplug.nvidia.com/gpu" and len(spec.devices) == count
    assert all(re.fullmatch(r"GPU-[0-9a-f-]+", d.name) for d in spec.devices)
    assert json.loads(spec_text)["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidiactl"


def test_default_kind_is_valid_and_clashes_with_nothing_nvidia_writes() -> None:
    kind = default_cdi_kind("nvidia.com/gpu")
    assert kind == "cdiplug.nvidia.com/gpu"
    assert kind_problem(kind) is None
    assert kind not in NVIDIA_OWNED_KINDS and clash_problem(kind) is None
    assert "cdiplug.nvidia.com/gpu" in (clash_problem("nvidia.com/gpu") or "")


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="this checks the no-driver path; this machine has the NVIDIA driver library",
)
def test_the_node_check_without_a_driver_says_so_and_exits_1() -> None:
    # hack/gpu-node-check.py runs the real daemon against the kubelet stand-in; without NVML the
    # GPU resource finds no devices, so it is not registered, and the script says so (on an H200 it admitted a pod).
    script = SCRIPT.parent / "gpu-node-check.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nvidia.com/gpu not registered: no GPU found" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
