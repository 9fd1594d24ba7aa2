"""``cdiplug serve`` as a real process, for tests: :func:`serve_process`.

The daemon runs with ``--log-format json`` writing to a log file of the caller's; the yielded
:class:`ServeProcess` reads it back (``lines``, ``messages``, ``wait_log``) and the block's end
kills a daemon still running. Folders come from the :class:`~cdiplug.models.world.World`; extra
flags (``--instance``, ``--metrics-address``) go after them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from cdiplug.models.world import World

LOG_WAIT = 10.0
POLL = 0.02


class ServeProcess:
    """A running (or ended) ``cdiplug serve`` and its JSON log."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    def lines(self) -> list[dict[str, str]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def messages(self) -> str:
        return "\n".join(e.get("message", "") for e in self.lines())

    async def wait_log(self, text: str, timeout: float = LOG_WAIT) -> None:
        """Until a log message holds ``text``; AssertionError (with the log) when the daemon ends or time is up."""
        deadline = time.monotonic() + timeout
        while text not in self.messages():
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"no log line with {text!r}; log:\n{self.log.read_text()}")
            await asyncio.sleep(POLL)  # another process's file: nothing to wait on but time

    async def stop(self, timeout: float = LOG_WAIT) -> int:
        """SIGTERM, then the exit status (bounded)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout)


def serve_args(world: World, config: Path | None, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "cdiplug", "serve", "--kubelet-dir", str(world.kubelet_dir), "--cdi-dir", str(world.cdi_dir)]
    args += ["--state-dir", str(world.state_dir), "--log-format", "json", *extra]
    return args + (["--config", str(config)] if config is not None else [])


@contextlib.asynccontextmanager
async def serve_process(config: Path | None, world: World, log: Path, *extra: str) -> AsyncIterator[ServeProcess]:
    """Run ``cdiplug serve`` on ``world``'s folders, logging to ``log``, until the block ends."""
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *serve_args(world, config, *extra), stdout=out, stderr=out, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        yield ServeProcess(proc, log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
