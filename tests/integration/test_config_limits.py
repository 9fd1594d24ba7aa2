"""Configuration values that would break later are refused when loaded, and SIGHUP never ends the
daemon.

Covers the checks of cdiplug.config (NUMA nodes beyond 2^31-1, CDI spec file names over 255 bytes,
``count × replicas`` beyond the kubelet's 4 MiB ListAndWatch limit, socket paths beyond 107 bytes
via ``check_against``), the in-process Daemon refusing such a file at start and on reload while the
old configuration keeps serving (real gRPC, the kubelet stand-in), a reload failing with an
exception class nobody expected, and a real ``python -m cdiplug serve`` process given SIGHUPs
from its first milliseconds on, which must neither die nor miss the reload.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
import yaml

from cdiplug import daemon as daemon_module
from cdiplug.config import check_against, load_config, parse_config
from cdiplug.daemon import Daemon
from cdiplug.deviceplugin.settings import list_and_watch_size
from cdiplug.errors import ConfigError
from cdiplug.frontend import MAX_SOCKET_PATH
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, daemon_process, eventually, started_daemon

FPGA = "example.com/fpga"


def config_file(path: Path, *resources: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({"resources": list(resources)}))
    return path


def fake(name: str = FPGA, **options: object) -> dict[str, object]:
    replicas = options.pop("replicas", None)
    return {"name": name, "backend": "fake", "options": options} | ({"replicas": replicas} if replicas is not None else {})


@pytest.mark.parametrize(
    ("resource", "message", "where"),
    [
        (fake(numa_nodes=[0, 2**31]), "a NUMA node is between 0 and 2147483647, got 2147483648", "options.numa_nodes[1]"),
        (fake(count=65536, replicas=2), "65,536 devices × 2 replicas would make a ListAndWatch message of up to", "replicas"),
        (fake(count=2, replicas=10**9), "replicas must be at most 65,536", "replicas"),
        (fake(count=2, replicas=65536), "2 devices × 65,536 replicas would make", "replicas"),
        ({**fake(), "cdi_kind": "a" * 200 + ".com/" + "b" * 60}, "would be longer than 255 bytes", "cdi_kind"),
    ],
)
def test_values_that_break_later_are_refused_at_load(
    short_tmp: Path, resource: dict[str, object], message: str, where: str
) -> None:
    path = config_file(short_tmp / "c.yaml", resource)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)
    assert str(info.value).endswith(f"@ $.resources[0].{where} (in {path})")


def test_the_estimate_bounds_the_real_message() -> None:
    from cdiplug.api import deviceplugin_v1beta1_pb2 as pb

    n = 1000
    real = pb.ListAndWatchResponse(
        devices=[
            pb.Device(ID=f"fpga-{i}::7", health="Unhealthy", topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=2**31 - 1)]))
            for i in range(n)
        ]
    ).ByteSize()
    assert real <= list_and_watch_size(n, len("fpga-999::7")) <= real * 1.05
    # A count that fits stays allowed: 65,536 fake devices without replicas.
    assert parse_config({"resources": [fake(count=65536)]}).resources[0].options.count == 65536


def test_socket_paths_longer_than_a_unix_address_are_refused(short_tmp: Path) -> None:
    config = load_config(config_file(short_tmp / "c.yaml", fake(), fake("example.com/" + "n" * 60)))
    deep = short_tmp / ("k" * 40)
    with pytest.raises(ConfigError) as info:
        check_against(config, World(kubelet_dir=deep))
    assert f"is {len(str(deep)) + 1 + len('example.com-' + 'n' * 60 + '.sock')} bytes" in str(info.value)
    assert f"a unix socket path is at most {MAX_SOCKET_PATH} @ $.resources[1].name (in {short_tmp / 'c.yaml'})" in str(info.value)
    with pytest.raises(ConfigError, match=r"too long for unix sockets in it .* @ \$.resources\[0\].name"):
        check_against(config, World(kubelet_dir=short_tmp / ("k" * 90)))
    check_against(config, World(kubelet_dir=short_tmp))  # short enough
    dra = parse_config({"resources": [{**fake(), "api": "dra", "dra_driver": "d" * 50 + ".example.com"}]}, "d.yaml")
    with pytest.raises(ConfigError, match=r"socket path .* @ \$.resources\[0\].dra_driver \(in d.yaml\)"):
        check_against(dra, World(plugins_registry_dir=short_tmp / ("r" * 40), plugins_dir=short_tmp))


# -- the daemon: at start, on reload ---------------------------------------------------------------


async def test_a_socket_path_too_long_stops_the_start(short_tmp: Path) -> None:
    kubelet_dir = short_tmp / ("k" * 80)
    kubelet_dir.mkdir()
    world = World(kubelet_dir=kubelet_dir, cdi_dir=short_tmp / "cdi", state_dir=short_tmp / "state")
    with pytest.raises(ConfigError, match="too long for unix sockets"):
        await asyncio.wait_for(Daemon(config_file(short_tmp / "c.yaml", fake()), world).run(handle_signals=False), 10)
    assert list(kubelet_dir.iterdir()) == []


async def test_reloads_that_fail_in_any_way_keep_the_old_config(world: World, short_tmp: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = config_file(short_tmp / "c.yaml", fake(count=2))
    async with KubeletStandIn(world.kubelet_dir) as kubelet, started_daemon(path, world) as d:
        await kubelet.wait_registered(FPGA)
        config_file(path, fake(count=65536, replicas=64))  # too many for one ListAndWatch
        assert await d.reload() is False
        config_file(path, fake(numa_nodes=[-1]))
        assert await d.reload() is False
        for unexpected in (RecursionError("deep"), KeyError("x" * 100_000), MemoryError(), UnicodeError("odd")):

            def broken(*_args: object, exc: BaseException = unexpected) -> None:
                raise exc

            monkeypatch.setattr(daemon_module, "load_config", broken)
            assert await d.reload() is False
        monkeypatch.undo()

        async def node_fails(config: object) -> None:
            raise RuntimeError("a bug in applying")

        monkeypatch.setattr(d.node, "reload", node_fails)
        config_file(path, fake(count=3))
        assert await d.reload() is False
        monkeypatch.undo()
        assert d.reloads_done == 7 and kubelet.allocatable(FPGA) == 2  # the old one serves on
        assert await d.reload() is True
        await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 3, 5, "the good config applied")


# -- a real process, SIGHUP from its first milliseconds on ------------------------------------------


def catches_sighup(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGHUP now (``SigCgt`` in /proc/<pid>/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGHUP - 1)))


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.4])
async def test_sighup_during_start_neither_kills_nor_is_lost(world: World, short_tmp: Path, delay: float) -> None:
    """SIGHUPs from the moment the process catches them (before grpc, the config, the backends
    are loaded) plus ``delay``: none may end it, and the reload they ask for must happen.

    A signal before the interpreter runs our first line kills any Python program; how long that
    window is (about 30-60 ms here, most of it the interpreter's own start) is measured by the
    chaos suite, not asserted: it depends on the machine's load.
    """
    path = config_file(short_tmp / "c.yaml", fake(count=2))
    async with KubeletStandIn(world.kubelet_dir) as kubelet, daemon_process(world, path) as daemon:
        # no event tells us when a handler is installed: look, briefly
        await eventually(lambda: catches_sighup(daemon.pid) or daemon.proc.returncode is not None, "a handler", interval=0.005)
        assert catches_sighup(daemon.pid), daemon.tail()
        await asyncio.sleep(delay)
        config_file(path, fake(count=5))  # what the early SIGHUP asks to load
        for _ in range(5):
            daemon.proc.send_signal(signal.SIGHUP)
            await asyncio.sleep(0.01)
        await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 5, 20, "the reloaded count")
        assert daemon.proc.returncode is None
        assert await daemon.stop(15) == 0, daemon.tail()
    assert "Traceback" not in daemon.log.read_text()
