"""Chaos at the daemon's edges: the CDI folder tampered with while it runs, and the metrics
endpoint flooded with slow, silent, greedy and junk clients.

Tampering: an in-process daemon (real inotify, real gRPC to the kubelet stand-in) takes 60 random
tamperings of its spec (delete, edit, truncate, chmod, symlink, folder, FIFO, the whole folder),
some in bursts; after each, the spec must be back byte for byte without an Allocate, obstacles
moved aside, no temporary file left. Bound: 60 tamperings, ~10 s.

Clients: a real daemon process with ``--metrics-address 127.0.0.1:0`` gets 80 silent connections
(256 may wait, 2 s each), a slow-loris client, huge headers and junk;
they are dropped after the 2 s deadline for a request's head; afterwards /healthz is 200, the
process alive, its open files back where they were. Bound: ~15 s.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import socket
import stat
import statistics
import time
from pathlib import Path

import yaml

from cdiplug.daemon import Daemon
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn
from cdiplug.testing.process import daemon_process
from cdiplug.toolkit.filewatch import FolderWatch

from .conftest import SCALE, figure, proc_figures, write_config

FPGA = "example.com/fpga"
SPEC = "cdiplug-example.com-fpga.json"


def spec_is(path: Path, good: bytes) -> bool:
    try:
        st = path.lstat()
        return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and path.read_bytes() == good
    except OSError:
        return False


async def until_right(folder: Path, good: bytes) -> None:
    async with asyncio.timeout(10):
        while not spec_is(folder / SPEC, good):
            watched = folder if folder.is_dir() else folder.parent
            async with FolderWatch(watched) as watch:
                if not spec_is(folder / SPEC, good):
                    await anext(aiter(watch))


def tamper(folder: Path, how: str) -> None:
    path = folder / SPEC
    if how == "delete":
        path.unlink(missing_ok=True)
    elif how == "edit":
        with path.open("r+b") as f:
            f.write(b"#")
    elif how == "truncate":
        os.truncate(path, 0)
    elif how == "chmod":
        path.chmod(0o600)
    elif how == "symlink":
        path.unlink()
        path.symlink_to("/etc/hostname")
    elif how == "folder":
        path.unlink()
        path.mkdir()
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "whole-folder":
        shutil.rmtree(folder)


async def test_random_tampering_of_the_cdi_folder(world: World, short_tmp: Path) -> None:
    rng = random.Random(4)
    rounds = 60 * SCALE
    kinds = ["delete", "edit", "truncate", "chmod", "symlink", "folder", "fifo", "whole-folder"]
    config = short_tmp / "config.yaml"
    config.write_text(yaml.safe_dump({"resources": [{"name": FPGA, "backend": "fake", "options": {"count": 2}}]}))
    took: list[float] = []
    async with KubeletStandIn(world.kubelet_dir) as kubelet:
        daemon = Daemon(config, world)
        task = asyncio.create_task(daemon.run(handle_signals=False), name="daemon under test")
        await asyncio.wait_for(daemon.started.wait(), 10)
        await kubelet.wait_registered(FPGA)
        await kubelet.allocate(FPGA, ["fpga-0"])
        good = (world.cdi_dir / SPEC).read_bytes()
        for _ in range(rounds):
            burst = rng.choice([1, 1, 1, 3])
            for _ in range(burst):
                if (world.cdi_dir / SPEC).exists() or (world.cdi_dir / SPEC).is_symlink():
                    try:
                        tamper(world.cdi_dir, rng.choice(kinds))
                    except OSError:
                        pass  # the keeper, or the burst's last step, changed what is there
            started = time.monotonic()
            await until_right(world.cdi_dir, good)
            took.append(time.monotonic() - started)
            assert not task.done()
        daemon.request_stop()
        assert await asyncio.wait_for(task, 10) == 0
    names = os.listdir(world.cdi_dir)
    assert not [n for n in names if n.endswith(".tmp")] and SPEC in names
    figure("CDI tamperings put right without an Allocate", rounds)
    figure("CDI repair time median/max (ms)", f"{statistics.median(took) * 1e3:.1f}/{max(took) * 1e3:.1f}")


async def test_slow_silent_and_junk_metrics_clients(chaos_world: World, short_tmp: Path) -> None:
    world = chaos_world
    config = write_config(short_tmp / "config.yaml", {FPGA: 2})
    async with (
        KubeletStandIn(world.kubelet_dir) as kubelet,
        daemon_process(world, config, "--metrics-address", "127.0.0.1:0") as daemon,
    ):
        await kubelet.wait_registered(FPGA, timeout=30)
        await daemon.wait_for("serving /metrics")
        url = next(re.search(r"http://\S+", e["message"]).group(0) for e in daemon.entries if "serving /metrics" in e["message"])  # type: ignore[union-attr]
        port = int(url.rpartition(":")[2])
        before = proc_figures(daemon.pid)

        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=30)

        silent = [await asyncio.to_thread(connect) for _ in range(80)]
        loris = await asyncio.to_thread(connect)
        loris.sendall(b"GET /metrics HTTP/1.1\r\n")
        junk_answers = []
        for request in (b"\x16\x03\x01 tls hello", b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"):
            s = await asyncio.to_thread(connect)
            s.sendall(request)
            junk_answers.append(s)
        started = time.monotonic()

        def drained(s: socket.socket) -> bytes:
            try:
                return s.recv(1000)
            except OSError:
                return b""

        results = await asyncio.gather(*(asyncio.to_thread(drained, s) for s in silent + [loris]))
        dropped_after = time.monotonic() - started
        assert all(r == b"" for r in results)  # closed without an answer: refused or timed out
        for s in silent + [loris] + junk_answers:
            s.close()
        status = await asyncio.to_thread(lambda: _get(url + "/healthz"))
        assert status == 200
        after = proc_figures(daemon.pid)
        assert daemon.proc.returncode is None
        assert after["open_fds"] <= before["open_fds"] + 2
        assert await daemon.stop() == 0
    daemon.check_log(str(config))
    figure("metrics clients dropped (80 silent, 1 slow-loris)", f"all, the last after {dropped_after:.1f} s")
    figure("metrics flood RSS/open files before -> after", f"{before} -> {after}")


def _get(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return int(response.status)
