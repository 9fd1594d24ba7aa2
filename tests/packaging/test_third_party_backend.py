"""Adding a backend needs no edit outside its package: a backend written against ``cdiplug.sdk``
alone, installed beside cdiplug with nothing but its ``cdiplug.backends`` entry point, is found,
configured (its options checked as strictly as the built-in ones) and run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

BACKEND = textwrap.dedent(
    """
    from __future__ import annotations

    import asyncio
    from collections.abc import Sequence

    import attrs

    from cdiplug.sdk import Backend, BackendPlugin, Device, DeviceSnapshot, ResourceConfig, SnapshotSink, World


    @attrs.frozen
    class TinyOptions:
        count: int = 1


    class TinyBackend(Backend):
        def __init__(self, resources: Sequence[ResourceConfig[TinyOptions]]) -> None:
            self._resources = resources

        async def run(self, sink: SnapshotSink) -> None:
            for r in self._resources:
                devices = tuple(Device(id=f"tiny-{i}") for i in range(r.options.count))
                sink.publish(DeviceSnapshot(resource=r.name, devices=devices))
            await asyncio.Event().wait()


    def create(resources: Sequence[ResourceConfig[TinyOptions]], world: World) -> Backend:
        return TinyBackend(resources)


    plugin = BackendPlugin(name="tiny", options_type=TinyOptions, create=create)
    """
)


def _install(site: Path) -> None:
    """What ``pip install`` of a package with one entry point leaves: the module and its dist-info."""
    (site / "acme_tiny").mkdir(parents=True)
    (site / "acme_tiny" / "__init__.py").write_text(BACKEND)
    info = site / "acme_tiny-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-tiny\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[cdiplug.backends]\ntiny = acme_tiny:plugin\n")


def _discover(site: Path, config: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    env = {**os.environ, "PYTHONPATH": str(site)}
    cmd = [sys.executable, "-m", "cdiplug", "discover", "--config", str(path), "-o", "json"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_backend_installed_beside_cdiplug_is_found_configured_and_run(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install(site)
    config = "resources:\n  - name: acme.example/widget\n    backend: tiny\n    options: {count: 3}\n"
    done = _discover(site, config, tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["acme.example/widget"]
    assert [d["id"] for d in found["devices"]] == ["tiny-0", "tiny-1", "tiny-2"]


def test_its_options_are_checked_like_the_built_in_ones(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install(site)
    config = "resources:\n  - name: acme.example/widget\n    backend: tiny\n    options: {cuont: 3}\n"
    done = _discover(site, config, tmp_path)
    assert done.returncode == 2
    assert "cuont" in done.stderr and "$.resources[0].options" in done.stderr
