"""The daemon's lifecycle with the kubelet: start, kubelet restarts, reload, signals, stop.

Real gRPC over unix sockets in a short temporary folder, the fake backend, and the kubelet stand-in
of ``cdiplug.testing``. The daemon runs in the test's event loop (:class:`cdiplug.daemon.Daemon`)
except for the signal tests, which run ``python -m cdiplug serve`` as a real subprocess and send it
real SIGHUP, SIGTERM and SIGINT. Covers: several resources from one process; a kubelet restart
with its folder wiped; a kubelet absent at start that appears later; a stale socket replaced and a
live one refused (exit status 1); a bad configuration (exit status 2); SIGHUP reloading a good and
refusing a bad configuration; SIGTERM/SIGINT stopping cleanly with status 0 and our sockets removed.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from cdiplug.daemon import Daemon
from cdiplug.errors import SocketInUse
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, daemon_process, eventually, started_daemon

FPGA, NIC, ACC, NEW = "example.com/fpga", "example.com/nic", "example.com/acc", "example.com/new"


def sock(world: World, resource: str) -> Path:
    return world.kubelet_dir / (resource.replace("/", "-") + ".sock")


def write_config(path: Path, resources: dict[str, int]) -> Path:
    path.write_text(
        yaml.safe_dump({"resources": [{"name": n, "backend": "fake", "options": {"count": c}} for n, c in resources.items()]})
    )
    return path


def registrations(kubelet: KubeletStandIn, resource: str) -> int:
    return sum(r.resource == resource for r in kubelet.registrations)


# -- in-process ----------------------------------------------------------------------------------


async def test_several_resources_from_one_process(world: World, short_tmp: Path) -> None:
    config = write_config(short_tmp / "config.yaml", {FPGA: 2, NIC: 4, ACC: 1})
    async with KubeletStandIn(world.kubelet_dir) as kubelet, started_daemon(config, world):
        for name in (FPGA, NIC, ACC):
            registration = await kubelet.wait_registered(name)
            assert registration.endpoint == sock(world, name).name
            assert sock(world, name).is_socket()
            assert oct(sock(world, name).stat().st_mode & 0o777) == oct(0o600)
        assert (kubelet.capacity(FPGA), kubelet.capacity(NIC), kubelet.capacity(ACC)) == (2, 4, 1)
    assert sorted(p.name for p in world.kubelet_dir.iterdir()) == []  # stand-in and daemon gone


async def test_kubelet_restart_with_the_folder_wiped(world: World, short_tmp: Path) -> None:
    config = write_config(short_tmp / "config.yaml", {FPGA: 2, NIC: 4, ACC: 1})
    async with KubeletStandIn(world.kubelet_dir) as kubelet, started_daemon(config, world):
        for name in (FPGA, NIC, ACC):
            await kubelet.wait_registered(name)
        pod = await kubelet.admit_pod("before", {FPGA: 1})
        assert pod.admitted
        await kubelet.restart(wipe=True)
        restarted = time.monotonic()
        for name in (FPGA, NIC, ACC):
            await kubelet.wait_until(
                lambda n=name: registrations(kubelet, n) == 2 and kubelet.is_registered(n), 5, f"{name} again"
            )
        took = time.monotonic() - restarted
        assert took < 2.0, f"re-registration took {took:.3f} s"  # the goal is 0.5 s; CI machines vary
        for name in (FPGA, NIC, ACC):
            assert sock(world, name).is_socket()
        assert kubelet.allocatable(FPGA) == 2
        # Allocation works against the new kubelet and the re-served socket.
        assert (await kubelet.admit_pod("after", {FPGA: 1})).admitted


async def test_kubelet_absent_at_start_then_appearing(world: World, short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(short_tmp / "config.yaml", {FPGA: 2, NIC: 1})
    async with started_daemon(config, world):
        # Serving already, waiting for the kubelet (no crash, a log line).
        assert sock(world, FPGA).is_socket() and sock(world, NIC).is_socket()
        await eventually(lambda: any("waiting for the kubelet" in r.getMessage() for r in caplog.records), "the log line")
        appeared = time.monotonic()
        async with KubeletStandIn(world.kubelet_dir) as kubelet:  # wipes the folder, as a kubelet does
            for name in (FPGA, NIC):
                await kubelet.wait_registered(name, timeout=5)
            assert time.monotonic() - appeared < 2.0
            assert kubelet.allocatable(FPGA) == 2


async def test_a_missing_kubelet_folder_is_created(world: World, short_tmp: Path) -> None:
    world.kubelet_dir.rmdir()  # a node still booting: no kubelet, no folder
    config = write_config(short_tmp / "config.yaml", {FPGA: 1})
    async with started_daemon(config, world):
        assert sock(world, FPGA).is_socket()
        async with KubeletStandIn(world.kubelet_dir) as kubelet:
            await kubelet.wait_registered(FPGA, timeout=5)


async def test_a_stale_socket_is_replaced(world: World, short_tmp: Path) -> None:
    config = write_config(short_tmp / "config.yaml", {FPGA: 2})
    async with KubeletStandIn(world.kubelet_dir) as kubelet:
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(sock(world, FPGA)))
        stale.close()  # left behind by a crashed run: the file stays, nobody answers
        async with started_daemon(config, world):
            await kubelet.wait_registered(FPGA)
            assert (await kubelet.admit_pod("p", {FPGA: 2})).admitted


async def test_a_live_socket_is_refused_in_process(world: World, short_tmp: Path) -> None:
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(sock(world, FPGA)))
    live.listen()
    try:
        config = write_config(short_tmp / "config.yaml", {FPGA: 2, NIC: 1})
        with pytest.raises(SocketInUse, match="another process is serving"):
            await asyncio.wait_for(Daemon(config, world).run(handle_signals=False), 10)
        assert sock(world, FPGA).is_socket()  # still the other process's
        assert not sock(world, NIC).exists()  # what did start was cleaned up
    finally:
        live.close()


# -- a real process, real signals ----------------------------------------------------------------


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_sigterm_stops_cleanly_with_status_0(world: World, short_tmp: Path) -> None:
    config = write_config(short_tmp / "config.yaml", {FPGA: 2, NIC: 1})
    metrics = ("--metrics-address", "127.0.0.1:0")
    async with KubeletStandIn(world.kubelet_dir) as kubelet, daemon_process(world, config, *metrics) as daemon:
        for name in (FPGA, NIC):
            await kubelet.wait_registered(name, timeout=15)
        # The metrics endpoint runs and knows both resources are registered.
        await daemon.wait_for("serving /metrics")
        url = re.search(r"http://\S+", daemon.messages()).group(0)  # type: ignore[union-attr]
        await eventually(lambda: http_get(url + "/readyz")[0] == 200, "/readyz to answer 200", timeout=5, in_thread=True)
        status, text = await asyncio.to_thread(http_get, url + "/metrics")
        assert status == 200 and f'cdiplug_devices{{health="healthy",resource="{FPGA}"}} 2.0' in text
        assert await daemon.stop(10) == 0
        assert sorted(p.name for p in world.kubelet_dir.iterdir()) == ["kubelet.sock"]  # ours removed
        assert "stopped cleanly" in daemon.messages()
        # The kubelet saw the streams end: the devices are no longer allocatable.
        await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 0, 5, "FPGA streams ended")


async def test_sigint_stops_cleanly_too(world: World, short_tmp: Path) -> None:
    async with KubeletStandIn(world.kubelet_dir) as kubelet, daemon_process(world, None, log_dir=short_tmp) as daemon:
        await kubelet.wait_registered(FPGA, timeout=15)  # the built-in default
        daemon.proc.send_signal(signal.SIGINT)
        assert await daemon.wait(10) == 0
        assert not sock(world, FPGA).exists()


async def test_sighup_reloads_and_keeps_a_bad_config_out(world: World, short_tmp: Path) -> None:
    config = write_config(short_tmp / "config.yaml", {FPGA: 2, NIC: 1})
    async with KubeletStandIn(world.kubelet_dir) as kubelet, daemon_process(world, config) as daemon:
        for name in (FPGA, NIC):
            await kubelet.wait_registered(name, timeout=15)
        fpga_registration = kubelet.registration(FPGA)

        write_config(config, {FPGA: 2, NIC: 3, NEW: 5})  # FPGA unchanged, NIC changed, NEW added
        daemon.proc.send_signal(signal.SIGHUP)
        await kubelet.wait_registered(NEW, timeout=10)
        await kubelet.wait_until(lambda: kubelet.capacity(NIC) == 3 and kubelet.capacity(NEW) == 5, 10, "reloaded")
        assert kubelet.registration(FPGA) is fpga_registration  # untouched, stream kept
        assert registrations(kubelet, NIC) == 1  # changed in place, no second Register

        write_config(config, {NEW: 5})  # FPGA and NIC removed
        daemon.proc.send_signal(signal.SIGHUP)
        # a socket file going away is no change the kubelet stand-in sees: poll it
        await eventually(lambda: not sock(world, FPGA).exists() and not sock(world, NIC).exists(), "the sockets removed")
        await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 0 and kubelet.allocatable(NIC) == 0, 10, "streams ended")
        assert kubelet.allocatable(NEW) == 5

        config.write_text("resources:\n  - name: example.com/new\n    backend: fake\n    options: {count: many}\n")
        daemon.proc.send_signal(signal.SIGHUP)
        await daemon.wait_for("configuration not reloaded")
        [error] = [e for e in daemon.entries if "configuration not reloaded" in e["message"]]
        assert error["level"] == "ERROR"
        assert "$.resources[0].options.count" in error["message"] and str(config) in error["message"]
        assert daemon.proc.returncode is None
        assert kubelet.allocatable(NEW) == 5 and registrations(kubelet, NEW) == 1  # the old one runs on

        assert await daemon.stop(10) == 0
        assert sorted(p.name for p in world.kubelet_dir.iterdir()) == ["kubelet.sock"]


async def test_a_live_socket_exits_1_with_the_reason(world: World, short_tmp: Path) -> None:
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(sock(world, FPGA)))
    live.listen()
    try:
        async with daemon_process(world, None, log_dir=short_tmp) as daemon:
            assert await daemon.wait(15) == 1
            assert "another process is serving on " + str(sock(world, FPGA)) in daemon.messages()
    finally:
        live.close()


async def test_a_bad_config_exits_2_naming_field_and_file(world: World, short_tmp: Path) -> None:
    config = short_tmp / "bad.yaml"
    config.write_text("resources:\n  - name: example.com/fpga\n    backend: fake\n    options: {count: -1}\n")
    async with daemon_process(world, config) as daemon:
        assert await daemon.wait(15) == 2
        text = daemon.log.read_text()
        assert "$.resources[0].options.count" in text and str(config) in text
        assert not any(world.kubelet_dir.iterdir())
