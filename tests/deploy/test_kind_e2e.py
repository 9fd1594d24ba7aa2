"""``hack/kind-e2e.sh``: clean under the real shellcheck, and its dry run prints the whole plan.

The script needs Docker and kind, which these machines lack, so it is checked by running its
``--dry-run`` mode (with stand-ins for docker, kind and kubectl first on PATH that fail if
called) and comparing the printed commands, in order, with what the e2e must do; and by checking
the names it uses against the manifests (image, pod names, metrics port, CDI spec file).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cdiplug.cdi.writer import SpecWriter

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "kind-e2e.sh"


def dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # docker, kind and kubectl that must never run: they leave a mark and fail.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("docker", "kind", "kubectl"):
        stub = bin_dir / tool
        stub.write_text(f"#!/bin/sh\necho called >> {tmp_path}/called-{tool}\nexit 99\n")
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run([str(SCRIPT), "--dry-run", *args], env=env, capture_output=True, text=True, timeout=60)
    assert not list(tmp_path.glob("called-*")), "the dry run ran a tool"
    return result


def commands(output: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in output.splitlines() if line.startswith("+ ")]


def test_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is installed by CI"
    result = subprocess.run([shellcheck, "--severity=style", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_dry_run_prints_the_plan_in_order(tmp_path: Path) -> None:
    result = dry_run(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [" ".join(c) for c in commands(result.stdout)]
    image = yaml.safe_load((ROOT / "deploy/base/daemonset.yaml").read_text())["spec"]["template"]["spec"]["containers"][0][
        "image"
    ]
    node = "cdiplug-e2e-control-plane"
    expected = [
        r"kind create cluster --name cdiplug-e2e --config \S+/kind.yaml",
        rf"docker build -f deploy/Containerfile -t {re.escape(image)} \.$",
        rf"kind load docker-image {re.escape(image)} --name cdiplug-e2e$",
        r"kubectl --context kind-cdiplug-e2e apply -k deploy/overlays/fake$",
        r"kubectl --context kind-cdiplug-e2e -n cdiplug-system rollout status ds/cdiplug",
        rf"kubectl --context kind-cdiplug-e2e get node {node} -o jsonpath=\{{\.status\.allocatable\.example\\\.com/fpga\}}$",
        rf"docker exec {node} cat {re.escape(str(SpecWriter(Path('/var/run/cdi')).path_for('example.com/fpga')))}$",
        r"kubectl --context kind-cdiplug-e2e apply -k deploy/examples$",
        r"kubectl --context kind-cdiplug-e2e get pod fpga-pod-1 -o jsonpath=\{\.status\.phase\}",
        r"kubectl --context kind-cdiplug-e2e get pod fpga-pod-2 -o jsonpath=\{\.status\.phase\}",
        r"kubectl --context kind-cdiplug-e2e exec fpga-pod-1 -- printenv FAKE_FPGA_DEVICES$",
        r"kubectl --context kind-cdiplug-e2e exec fpga-pod-2 -- printenv FAKE_FPGA_DEVICES$",
        r"kubectl --context kind-cdiplug-e2e get pod fpga-pod-greedy .*PodScheduled",
        rf"docker exec {node} systemctl restart kubelet$",
        r"kubectl --context kind-cdiplug-e2e get --raw /api/v1/namespaces/cdiplug-system/pods/\S+:9765/proxy/metrics$",
        rf"kubectl --context kind-cdiplug-e2e get node {node} ",
        r"kubectl --context kind-cdiplug-e2e delete pod fpga-pod-1 ",
        r"kubectl --context kind-cdiplug-e2e apply -f deploy/examples/fpga-pod-1.yaml$",
        r"kubectl --context kind-cdiplug-e2e get pod fpga-pod-1 ",
        r"kubectl --context kind-cdiplug-e2e exec fpga-pod-1 -- printenv FAKE_FPGA_DEVICES$",
        r"kind delete cluster --name cdiplug-e2e$",
    ]
    at = 0
    for pattern in expected:
        while at < len(lines) and not re.match(pattern, lines[at]):
            at += 1
        assert at < len(lines), f"{pattern!r} not found in order in:\n" + "\n".join(lines)
        at += 1
    assert lines[-1] == "kind delete cluster --name cdiplug-e2e"
    assert "all checks passed" in result.stdout


def test_names_match_the_manifests(tmp_path: Path) -> None:
    lines = commands(dry_run(tmp_path).stdout)
    # Every repository path the plan uses exists.
    for command in lines:
        for word in command:
            if word.startswith("deploy/"):
                assert (ROOT / word).exists(), word
    pods = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in (ROOT / "deploy/examples").glob("fpga-pod-*.yaml")}
    assert pods == {"fpga-pod-1", "fpga-pod-2", "fpga-pod-greedy"}
    daemonset = yaml.safe_load((ROOT / "deploy/base/daemonset.yaml").read_text())
    (port,) = [
        p["containerPort"] for p in daemonset["spec"]["template"]["spec"]["containers"][0]["ports"] if p["name"] == "metrics"
    ]
    assert any(f":{port}/proxy/metrics" in " ".join(c) for c in lines)


def test_options(tmp_path: Path) -> None:
    kept = dry_run(tmp_path, "--keep", "--name", "demo")
    assert kept.returncode == 0
    lines = [" ".join(c) for c in commands(kept.stdout)]
    assert lines[0].startswith("kind create cluster --name demo ")
    assert not [line for line in lines if line.startswith("kind delete")]
    assert "docker exec demo-control-plane systemctl restart kubelet" in lines
    bad = dry_run(tmp_path, "--frobnicate")
    assert bad.returncode == 2 and "unknown argument --frobnicate" in bad.stderr
    helped = dry_run(tmp_path, "--help")
    assert helped.returncode == 0 and "--dry-run" in helped.stdout and "set -euo" not in helped.stdout


@pytest.mark.parametrize("tool", ["docker", "kind", "kubectl"])
def test_without_dry_run_it_asks_for_the_tools(tmp_path: Path, tool: str) -> None:
    # Only the other two tools on PATH (as stubs): the missing one is named and nothing runs.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for other in {"docker", "kind", "kubectl"} - {tool}:
        (bin_dir / other).write_text("#!/bin/sh\nexit 99\n")
        (bin_dir / other).chmod(0o755)
    for needed in ("bash", "sed", "dirname", "mktemp", "rm", "cat"):
        (bin_dir / needed).symlink_to(shutil.which(needed))  # type: ignore[arg-type]
    result = subprocess.run([str(SCRIPT)], env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"{tool} is needed" in result.stderr
