"""Shared pieces of the chaos suite: a real ``python -m cdiplug serve`` process,
checks on its log, and the figures the suite reports.

Every test here is marked ``chaos`` and states its bound; the whole suite stays under 5 minutes on
a 2-core machine. Hypothesis runs derandomized with ``max_examples`` set per test, so CI sees the
same inputs every time. Figures (inputs tried, cycles survived, latencies, RSS and open files) are
printed at the end of the run and, when ``CDIPLUG_CHAOS_FIGURES`` names a file, written there as JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdiplug.models.world import World

FIGURES: dict[str, Any] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.chaos)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("chaos figures")
    for key in sorted(FIGURES):
        terminalreporter.write_line(f"{key}: {FIGURES[key]}")
    target = os.environ.get("CDIPLUG_CHAOS_FIGURES")
    if target:
        Path(target).write_text(json.dumps(FIGURES, indent=1, sort_keys=True) + "\n")


def figure(key: str, value: Any) -> None:
    """Record one figure for the summary."""
    FIGURES[key] = value


def write_config(path: Path, resources: dict[str, int], **extra: Any) -> Path:
    items = [{"name": n, "backend": "fake", "options": {"count": c, **extra}} for n, c in resources.items()]
    temp = path.with_name(path.name + ".new")
    temp.write_text(yaml.safe_dump({"resources": items}))
    temp.replace(path)  # as a ConfigMap update would: whole, never half
    return path


def proc_figures(pid: int) -> dict[str, int]:
    """RSS in KiB, open file descriptors and how many of them are sockets, of ``pid``, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed between the listing and the read
            continue
    sockets = sum(t.startswith("socket:") for t in targets)
    return {"rss_kib": rss, "open_fds": len(targets), "sockets": sockets}


SCALE = max(1, int(os.environ.get("CDIPLUG_CHAOS_SCALE", "1")))
"""Multiplies every cycle count: 1 in CI (the bounded run), more for the figures of a long run."""


@pytest.fixture
def chaos_world(short_tmp: Path) -> Iterator[World]:
    folders = {name: short_tmp / name for name in ("kubelet", "cdi", "state")}
    for folder in folders.values():
        folder.mkdir()
    yield World(kubelet_dir=folders["kubelet"], cdi_dir=folders["cdi"], state_dir=folders["state"])
