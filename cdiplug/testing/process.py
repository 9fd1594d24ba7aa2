"""A real daemon process for tests: ``python -m cdiplug serve`` with its JSON log read as it comes.

:func:`daemon_process` starts one (``async with``; killed at the end if it still runs) and yields
a :class:`DaemonProcess`: its log lines as they come (kept in ``daemon.log`` beside the
configuration, or in ``log_dir``), :meth:`~DaemonProcess.wait_for` a line (woken by each new line,
never by a timer), :meth:`~DaemonProcess.check_log` (no traceback, every error naming its source), a clean
:meth:`~DaemonProcess.stop` (SIGTERM), :meth:`~DaemonProcess.wait` for its own end, or
:meth:`~DaemonProcess.kill`. Without a configuration (``None``) it serves the built-in default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from cdiplug.models.world import World


class DaemonProcess:
    """A real daemon: ``python -m cdiplug serve`` with JSON logs read as they come (and kept in a file)."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path, config: Path | None) -> None:
        self.proc = proc
        self.log = log
        self.config = config
        self.entries: list[dict[str, Any]] = []
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read(), name=f"daemon {proc.pid} log")

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("ab") as out:
            async for line in self.proc.stdout:
                out.write(line)
                try:
                    entry = json.loads(line)
                except ValueError:
                    entry = {"level": "RAW", "message": line.decode(errors="replace")}
                async with self._changed:
                    self.entries.append(entry)
                    self._changed.notify_all()
        async with self._changed:
            self._changed.notify_all()

    def count(self, text: str) -> int:
        return sum(text in e.get("message", "") for e in self.entries)

    def messages(self) -> str:
        """Every log line's message so far, one a line."""
        return "\n".join(e.get("message", "") for e in self.entries)

    def reloads(self) -> int:
        """Reloads finished, applied or refused (one outcome line each)."""
        return sum(self.count(t) for t in ("configuration reloaded", "configuration not reloaded", "configuration not applied"))

    async def wait_for(self, text: str, count: int = 1, timeout: float = 20.0) -> None:
        """Until ``count`` log lines hold ``text`` (woken by each new line, never by a timer)."""
        await self.wait_until(lambda: self.count(text) >= count, timeout, repr(text))

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
        """Until ``predicate()`` holds, re-checked at each new log line."""
        async with asyncio.timeout(timeout), self._changed:
            while not predicate():
                if self._reader.done():
                    raise AssertionError(f"the daemon ended; waiting for {what}; log:\n{self.tail()}")
                await self._changed.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def check_log(self, *sources: str) -> None:
        """No traceback anywhere; every ERROR line names one of ``sources`` (a file, a resource)."""
        text = self.log.read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
        for entry in self.entries:
            assert entry.get("level") != "RAW", f"a line that is not JSON: {entry['message'][:300]}"
            if entry.get("level") in ("ERROR", "CRITICAL"):
                message = entry.get("message", "")
                assert any(s in message for s in sources), f"an error naming none of {sources}: {message[:300]}"
                assert len(message) < 2000, message[:300]

    async def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (unless it has ended), then :meth:`wait`."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.wait(timeout)

    async def wait(self, timeout: float = 20.0) -> int:
        """Its exit status once it ends by itself (TimeoutError after ``timeout`` s); its log read to the end."""
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        await self._reader
        return code

    async def kill(self) -> None:
        self.proc.kill()
        await self.proc.wait()
        await self._reader


@contextlib.asynccontextmanager
async def daemon_process(
    world: World, config: Path | None, *extra: str, log_dir: Path | None = None
) -> AsyncIterator[DaemonProcess]:
    """``cdiplug serve`` of ``config`` (None: no ``--config``) on ``world``, ``extra`` arguments added.

    Its log is ``daemon.log`` in ``log_dir``, by default the configuration's folder.
    """
    folder = log_dir or (config.parent if config is not None else None)
    if folder is None:
        raise ValueError("daemon_process needs a log_dir when it is given no configuration")
    log = folder / "daemon.log"
    args = [sys.executable, "-m", "cdiplug", "serve", *(["--config", str(config)] if config is not None else [])]
    args += ["--kubelet-dir", str(world.kubelet_dir), "--cdi-dir", str(world.cdi_dir), "--state-dir", str(world.state_dir)]
    args += ["--log-format", "json", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    daemon = DaemonProcess(proc, log, config)
    try:
        yield daemon
    finally:
        if proc.returncode is None:
            await daemon.kill()
