"""``cdiplug demo`` as a user runs it: a subprocess, its output lines and its exit status.

Real: the daemon with the built-in default, the kubelet stand-in, gRPC over unix sockets in a
temporary folder, the fake backend's health file and the CDI writer, all inside the subprocess.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdiplug.config import Config


def run_demo(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cdiplug", "demo", *args], capture_output=True, text=True, timeout=60, check=False
    )
    return done, time.monotonic() - started


def test_demo_shows_the_classic_experiment_and_exits_0() -> None:
    done, seconds = run_demo()
    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.splitlines()
    text = done.stdout
    assert "1. node advertises example.com/fpga: 2" in lines
    pods = re.findall(r"^2\. (pod-[ab]) got (fpga-\d)   env: (.*)$", text, re.M)
    assert [p[0] for p in pods] == ["pod-a", "pod-b"]
    assert sorted(p[1] for p in pods) == ["fpga-0", "fpga-1"]
    for _, device, env in pods:
        assert f"FAKE_FPGA_DEVICES={device}" in env.split()
    assert "3. pod-c asks for 3: Pending (Insufficient example.com/fpga)" in lines
    assert re.search(r"^4\. fpga-\d Unhealthy: allocatable example.com/fpga: 1; Healthy again: 2$", text, re.M)
    cdi = re.search(r"^5\. CDI spec (\S+) \(cdiVersion [\d.]+\): (.*); pods use (.*)$", text, re.M)
    assert cdi, text
    assert cdi.group(1) == "cdiplug-example.com-fpga.json"
    assert cdi.group(2) == "example.com/fpga=fpga-0, example.com/fpga=fpga-1"
    assert cdi.group(3) == "example.com/fpga=fpga-0, example.com/fpga=fpga-1"
    assert lines[-1].startswith("OK:")
    assert seconds < 15, f"the demo took {seconds:.1f} s"
    folder = re.search(r"kubelet stand-in in (\S+)$", lines[0])
    assert folder and not Path(folder.group(1)).exists(), "the temporary folder is left behind"


def test_demo_keep_leaves_the_folder_for_a_look() -> None:
    done, _ = run_demo("--keep")
    assert done.returncode == 0, done.stderr + done.stdout
    kept = re.search(r"^\(kept (\S+)\)$", done.stdout, re.M)
    assert kept, done.stdout
    folder = Path(kept.group(1))
    try:
        assert (folder / "cdi" / "cdiplug-example.com-fpga.json").is_file()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_step_that_goes_wrong_fails_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process, with the demo's configuration swapped for one of three devices."""
    from cdiplug.cli import demo, main
    from cdiplug.config import parse_config

    def three_devices(health_file: Path) -> Config:
        options = {"count": 3, "health_file": str(health_file)}
        return parse_config({"resources": [{"name": "example.com/fpga", "backend": "fake", "options": options}]})

    monkeypatch.setattr(demo, "demo_config", three_devices)
    assert main(["demo"]) == 1
    err = capsys.readouterr().err
    assert "cdiplug demo: FAILED: expected example.com/fpga: 2, got capacity 3, allocatable 3" in err
