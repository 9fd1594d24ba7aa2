"""kill -9 of the DRA claim machinery at every step of a prepare and of an unprepare, 20 cycles each.

Each cycle is one process (forked by the zygote ``dra_kill_child.py``, so a cycle costs a fork,
not an interpreter start): the real ClaimPreparer, ClaimStore and BackendHost with the fake
backend's visible preparation (a marker file per prepared device) on the same folders every
cycle. It starts as the daemon does (roll back what was left started, restore), the test checks
the folders, then it prepares or unprepares a claim (the seed picks which, and sometimes another
claim whole first) with ``CDIPLUG_DRA_PAUSE_AFTER`` at the step, and is killed there with SIGKILL.
The steps are :class:`cdiplug.dra.prepare.Step`: PrepareStarted checkpointed, the backend
prepared, the spec written, PrepareCompleted checkpointed; the spec removed, the devices
released. (Before PrepareStarted nothing is touched; the PCI subset runs in the QEMU VM.)

After every restart every claim is prepared whole (record PrepareCompleted, spec, every device's
marker) or released whole (no record, no spec, no marker a completed claim does not hold) —
never half. Four claims on four devices, one claim sharing a device with another, so rollbacks
meet devices still held. Seeds are fixed: the same cycles every run. Bound: 120 cycles, ~20 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from cdiplug.dra.rollback import Step

from .conftest import SCALE, figure

CHILD = Path(__file__).with_name("dra_kill_child.py")
CYCLES = 20 * SCALE


def check(root: Path) -> tuple[int, int]:
    """Every claim whole or gone; (claims prepared, devices prepared)."""
    path = root / "state" / "dra-claims.json"
    claims: dict[str, Any] = json.loads(path.read_text())["claims"] if path.exists() else {}
    specs = {p.name for p in (root / "cdi").glob("cdiplug-claim-*.json")}
    marks = {p.name for p in (root / "prepared").glob("*")} if (root / "prepared").exists() else set()
    held: set[str] = set()
    for uid, record in claims.items():
        assert record["state"] == "PrepareCompleted", f"claim {uid} left {record['state']} after the restart"
        assert record["spec_file"] in specs, f"claim {uid} is complete without its spec"
        devices = {d["device_id"] for d in record["devices"]}
        assert devices <= marks, f"claim {uid} is complete but {sorted(devices - marks)} not prepared"
        held |= devices
    assert specs == {c["spec_file"] for c in claims.values()}, f"specs of no claim: {sorted(specs)}"
    assert marks <= held, f"devices prepared for no claim: {sorted(marks - held)}"
    return len(claims), len(marks)


class Zygote:
    def __init__(self, proc: asyncio.subprocess.Process, errors: Path) -> None:
        self.proc, self.errors = proc, errors
        self.child = 0  # the cycle's process

    async def end(self) -> None:
        """Kill the cycle's process (it holds the zygote's stdout) and the zygote."""
        if self.child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()

    async def line(self) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), 20)
        text = raw.decode().strip()
        assert text and not text.startswith(("failed", "not paused")), f"{text!r}; stderr:\n{self.errors.read_text()[-3000:]}"
        return text

    async def expect(self, prefix: str) -> str:
        text = await self.line()
        assert text.startswith(prefix), f"expected {prefix!r}, got {text!r}; stderr:\n{self.errors.read_text()[-3000:]}"
        return text

    async def cycle(self, step: str, seed: str, root: Path) -> tuple[int, int]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{step} {seed}\n".encode())
        await self.proc.stdin.drain()
        pid = self.child = int((await self.expect("pid ")).split()[1])
        await self.expect("recovered")
        found = check(root)
        if seed == "none":
            assert await self.expect("exit ") == "exit 0"
            return found
        os.kill(pid, signal.SIGUSR1)
        await self.expect("step ")
        await self.expect("paused")
        os.kill(pid, signal.SIGKILL)
        assert await self.expect("exit ") == f"exit {signal.SIGKILL}"
        return found


async def test_kill_9_at_every_step_leaves_claims_whole_or_released(short_tmp: Path) -> None:
    root = short_tmp / "kill"
    for name in ("kubelet", "cdi", "state"):
        (root / name).mkdir(parents=True)
    errors = short_tmp / "zygote.stderr"
    with errors.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), str(root), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    zygote = Zygote(proc, errors)
    started = time.monotonic()
    seen: dict[str, set[tuple[int, int]]] = {}
    try:
        for n, step in enumerate(Step):
            for cycle in range(CYCLES):
                found = await zygote.cycle(step.value, str(1000 * n + cycle), root)
                seen.setdefault(step.value, set()).add(found)
        await zygote.cycle("none", "none", root)
    finally:
        await zygote.end()
    took = time.monotonic() - started
    total = CYCLES * len(Step)
    # The runs reached different states (claims prepared, devices held), not one state again and again.
    assert len(set().union(*seen.values())) >= 4, seen
    figure(
        "DRA kill -9 at every step of prepare and unprepare (whole or released after restart)",
        f"{total} cycles ({CYCLES} at each of {', '.join(s.value for s in Step)}) in {took:.1f} s",
    )
