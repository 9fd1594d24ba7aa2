"""docs/getting-started-fake.md, followed as a newcomer would on a real node: every ``sh`` block
of the page (except those marked as not run) runs in order, with the real Helm and kubectl that
``hack/get-tools.sh`` installs, against the one-node cluster of ``hack/local-cluster.sh``.

The session's kustomize deployment serves the same resource in the same namespace, so it is taken
away first and put back at the end. This test cluster's API server cannot serve its OpenAPI
document (a build of it, not cdiplug), which kubectl's and Helm's client-side validation fetch: the
page's commands run as written, through wrappers that add ``--validate=false`` and
``--disable-openapi-validation`` where those tools would fetch it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import FAKE_OVERLAY, NAMESPACE, REPO, Kube

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

PAGE = REPO / "docs" / "getting-started-fake.md"
BLOCK = re.compile(r"(<!--[^>]*-->\n)?```sh\n(.*?)```", re.DOTALL)


def runnable_blocks(text: str) -> list[str]:
    """The page's ``sh`` blocks in order, without those behind a ``<!-- not run ... -->`` comment."""
    return [body for marker, body in BLOCK.findall(text) if "not run" not in marker]


def test_the_page_has_blocks_to_run() -> None:
    blocks = runnable_blocks(PAGE.read_text())
    assert len(blocks) >= 6
    assert any("helm install" in b for b in blocks) and any("helm uninstall" in b for b in blocks)


@pytest.fixture
def bare_node(kube: Kube) -> Iterator[None]:
    had = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    kube("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=200)
    yield
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    subprocess.run(
        ["helm", "uninstall", "cdiplug", "-n", NAMESPACE, "--ignore-not-found", "--wait"], env=env, timeout=200, check=False
    )
    kube("delete", "-k", str(REPO / "deploy" / "examples"), "--ignore-not-found", "--wait=true", timeout=120, check=False)
    if had:
        kube("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=200)
        kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)


WRAPPER = """#!/bin/sh
# {tool} as the page types it, without what this cluster's API server cannot serve.
real={real}
case "$1" in
{cases}
esac
exec "$real" "$@"
"""
# kubectl and helm validate objects against the OpenAPI document; Helm's post-delete hook is built
# (and validated) at uninstall, so it is left out there (the daemon pods' own cleanup still runs).
FLAGS = {
    "kubectl": {"apply": "--validate=false"},
    "helm": {"install": "--disable-openapi-validation", "upgrade": "--disable-openapi-validation", "uninstall": "--no-hooks"},
}


def without_openapi(folder: Path) -> Path:
    folder.mkdir()
    for tool, flags in FLAGS.items():
        real = shutil.which(tool)
        assert real, f"{tool} is installed by hack/get-tools.sh"
        cases = "\n".join(f'  {verb}) shift; exec "$real" {verb} {flag} "$@" ;;' for verb, flag in flags.items())
        (folder / tool).write_text(WRAPPER.format(tool=tool, real=real, cases=cases))
        (folder / tool).chmod(0o755)
    return folder


def test_getting_started_with_the_fake_backend_as_written(kube: Kube, bare_node: None, tmp_path: Path) -> None:
    wrappers = without_openapi(tmp_path / "bin")
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "PATH": f"{wrappers}:{os.environ['PATH']}"}
    for block in runnable_blocks(PAGE.read_text()):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert done.returncode == 0, f"this block of {PAGE.name} failed:\n{block}\n{done.stdout}\n{done.stderr}"
        if "grep FAKE_FPGA_DEVICES" in block:
            assert re.search(r"^FAKE_FPGA_DEVICES=fpga-[01]$", done.stdout, re.MULTILINE), done.stdout
    # The release's instance name is the release name: its files are cdiplug.cdiplug.*
    leftovers = [p.name for p in Path("/var/run/cdi").glob("cdiplug.cdiplug.*")]
    assert leftovers == [], f"helm uninstall left the release's CDI specs behind: {leftovers}"
