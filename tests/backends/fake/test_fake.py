"""The fake backend (cdiplug_backends.fake): IDs, env, NUMA spread, options errors and the health file.

Health-file tests run the backend for real against files in a temporary folder, watched through
the real inotify FolderWatch; each change is awaited as the next published snapshot, with a
deadline. Options are parsed through the real config loader, so errors carry their real paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdiplug.config import parse_config
from cdiplug.errors import ConfigError, InputError
from cdiplug.models.devices import Health, HealthCause
from cdiplug_backends.fake import FakeBackend, plugin
from cdiplug_backends.fake.backend import read_health_file

DEADLINE = 5.0


def resources(*options: dict, names=("example.com/fpga",)):
    data = {"resources": [{"name": n, "backend": "fake", "options": o} for n, o in zip(names, options)]}
    return parse_config(data, "test.yaml").resources


class QueueSink:
    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def publish(self, snapshot) -> None:
        self.queue.put_nowait(snapshot)

    async def next(self):
        return await asyncio.wait_for(self.queue.get(), DEADLINE)


@contextlib.asynccontextmanager
async def running(backend: FakeBackend) -> AsyncIterator[QueueSink]:
    sink = QueueSink()
    task = asyncio.create_task(backend.run(sink), name="fake-under-test")
    try:
        yield sink
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def unhealthy(snapshot) -> list[str]:
    return [d.id for d in snapshot.devices if d.health is Health.UNHEALTHY]


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ErrorLogged(logging.Handler):
    """Sets an asyncio.Event when the fake backend logs an error (it logs from the event loop)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.event = asyncio.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.event.set()


@pytest.fixture
def error_logged():
    handler = ErrorLogged()
    logger = logging.getLogger("cdiplug_backends.fake.backend")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


# -- devices ------------------------------------------------------------------------------------


async def test_ids_env_and_no_device_files(world):
    backend = plugin.create(resources({"count": 3}), world)
    async with running(backend) as sink:
        snap = await sink.next()
    assert snap.resource == "example.com/fpga"
    assert snap.ids == ("fpga-0", "fpga-1", "fpga-2")
    assert snap.ids_env == "FAKE_FPGA_DEVICES"
    assert dict(snap.devices[2].edits.env) == {"FAKE_FPGA_DEVICE_2": "fpga-2"}
    assert all(d.edits.device_nodes == () and d.edits.mounts == () for d in snap.devices)
    assert all(d.healthy and d.numa_nodes == () for d in snap.devices)
    assert snap.common_edits.is_empty()


async def test_numa_nodes_round_robin(world):
    [r] = resources({"count": 5, "numa_nodes": [1, 0]})
    snap = FakeBackend([r], world).snapshot(r, {})
    assert [d.numa_nodes for d in snap.devices] == [(1,), (0,), (1,), (0,), (1,)]


async def test_a_health_change_keeps_every_other_device_the_same_object(world):
    [r] = resources({"count": 64, "numa_nodes": [0, 1]})
    backend = FakeBackend([r], world)
    first = backend.snapshot(r, {})
    down = backend.snapshot(r, {"fpga-7": (Health.UNHEALTHY, None)})
    changed = [d.id for a, d in zip(first.devices, down.devices) if a is not d]
    assert changed == ["fpga-7"]
    assert down.get("fpga-7").health is Health.UNHEALTHY and down.get("fpga-7").edits == first.get("fpga-7").edits
    again = backend.snapshot(r, {})
    assert all(a is b for a, b in zip(first.devices, again.devices))
    assert backend.snapshot(r, {"fpga-7": (Health.UNHEALTHY, None)}).get("fpga-7") is down.get("fpga-7")
    hot = backend.snapshot(r, {"fpga-7": (Health.UNHEALTHY, HealthCause("thermal", "85C"))}).get("fpga-7")
    assert hot is not down.get("fpga-7") and hot.cause == HealthCause("thermal", "85C")


async def test_every_resource_is_published(world):
    rs = resources({"count": 1}, {"count": 0}, names=("example.com/fpga", "vendor.io/nic-vf"))
    async with running(plugin.create(rs, world)) as sink:
        first, second = await sink.next(), await sink.next()
    assert (first.resource, first.ids) == ("example.com/fpga", ("fpga-0",))
    assert (second.resource, second.ids, second.ids_env) == ("vendor.io/nic-vf", (), "FAKE_NIC_VF_DEVICES")


# -- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message", "path"),
    [
        ({"count": -1}, "must be between 0 and 65536, got -1", "$.resources[0].options.count"),
        ({"count": 65537}, "must be between 0 and 65536, got 65537", "$.resources[0].options.count"),
        ({"count": "2"}, "expected an integer, got str '2'", "$.resources[0].options.count"),
        ({"numa_nodes": [0, -1]}, "a NUMA node is between 0 and 2147483647, got -1", "$.resources[0].options.numa_nodes[1]"),
        (
            {"numa_nodes": [2**31]},
            "a NUMA node is between 0 and 2147483647, got 2147483648",
            "$.resources[0].options.numa_nodes[0]",
        ),
        ({"numa_nodes": 0}, "expected a list, got int 0", "$.resources[0].options.numa_nodes"),
        ({"health_file": 3}, "expected a path, got int 3", "$.resources[0].options.health_file"),
        (
            {"cout": 3},
            "unknown key 'cout' (allowed: count, numa_nodes, health_file, attributes, prepared_dir, shared, capacity, partitions)",
            "$.resources[0].options",
        ),
    ],
)
def test_options_errors_name_their_path(options, message, path):
    with pytest.raises(ConfigError) as info:
        resources(options)
    assert (info.value.message, info.value.path, info.value.source) == (message, path, "test.yaml")


def test_health_file_errors_name_the_entry_and_file(short_tmp):
    path = short_tmp / "health.yaml"
    path.write_text("fpga-0: Sick\n")
    with pytest.raises(InputError) as info:
        read_health_file(path)
    assert (info.value.path, info.value.source) == ("$.fpga-0", str(path))
    assert "Healthy or Unhealthy, got 'Sick'" in info.value.message
    path.write_text("- fpga-0\n")
    with pytest.raises(InputError, match="must map device IDs"):
        read_health_file(path)
    path.write_text("fpga-0: [\n")
    with pytest.raises(InputError, match="not valid YAML/JSON"):
        read_health_file(path)
    assert read_health_file(short_tmp / "missing.yaml") == {}
    path.write_text("")
    assert read_health_file(path) == {}
    (short_tmp / "h.json").write_text('{"fpga-1": "Unhealthy"}')
    assert read_health_file(short_tmp / "h.json") == {"fpga-1": (Health.UNHEALTHY, None)}
    path.write_text("fpga-0: Unhealthy Thermal=hot\n")
    with pytest.raises(InputError, match="health cause 'Thermal'") as info:
        read_health_file(path)
    assert info.value.path == "$.fpga-0"


def test_the_health_file_names_causes(short_tmp):
    # A cause (and code) after the state: DRA's per-cause taint (cdiplug.dev/<cause>=<code>).
    path = short_tmp / "health.yaml"
    path.write_text("fpga-0: Unhealthy thermal=85C\nfpga-1: Unhealthy link-down\nfpga-2: Healthy ecc-corrected=3\n")
    assert read_health_file(path) == {
        "fpga-0": (Health.UNHEALTHY, HealthCause("thermal", "85C")),
        "fpga-1": (Health.UNHEALTHY, HealthCause("link-down")),
        "fpga-2": (Health.HEALTHY, HealthCause("ecc-corrected", "3")),
    }


# -- the health file, watched ----------------------------------------------------------------


async def test_health_file_is_applied_at_start_and_on_every_change(world, short_tmp):
    health = short_tmp / "health.yaml"
    health.write_text("fpga-1: Unhealthy\n")
    backend = plugin.create(resources({"count": 3, "health_file": str(health)}), world)
    async with running(backend) as sink:
        assert unhealthy(await sink.next()) == ["fpga-1"]
        write_atomically(health, "fpga-0: Unhealthy\nfpga-2: Unhealthy\nfpga-9: Unhealthy\n")
        assert unhealthy(await sink.next()) == ["fpga-0", "fpga-2"]
        write_atomically(health, "fpga-0: Healthy\nfpga-2: Unhealthy\n")
        assert unhealthy(await sink.next()) == ["fpga-2"]
        health.unlink()  # gone: every device Healthy
        assert unhealthy(await sink.next()) == []
        (short_tmp / "unrelated").write_text("x")
        # Written in place (truncated first): the empty file between is "all Healthy" too, so
        # whenever it is read, nothing changes and nothing is published until the content lands.
        health.write_text("{}\n")
        health.write_text("fpga-1: Unhealthy\n")
        assert unhealthy(await sink.next()) == ["fpga-1"]
        assert sink.queue.empty()


async def test_broken_health_file_keeps_the_last_state(world, short_tmp, error_logged):
    health = short_tmp / "health.yaml"
    health.write_text("fpga-0: Unhealthy\n")
    backend = plugin.create(resources({"count": 2, "health_file": str(health)}), world)
    async with running(backend) as sink:
        assert unhealthy(await sink.next()) == ["fpga-0"]
        write_atomically(health, "fpga-0: [unclosed\n")
        await asyncio.wait_for(error_logged.event.wait(), DEADLINE)
        assert "not valid YAML/JSON" in error_logged.messages[0] and str(health) in error_logged.messages[0]
        error_logged.event.clear()
        write_atomically(health, "fpga-1: Broken\n")
        await asyncio.wait_for(error_logged.event.wait(), DEADLINE)
        assert "$.fpga-1" in error_logged.messages[1]
        # Nothing was published for either broken file: the next snapshot is the next good one.
        write_atomically(health, "fpga-1: Unhealthy\n")
        assert unhealthy(await sink.next()) == ["fpga-1"]


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param(lambda p: p.write_bytes(b"fpga-1: Unhealthy\n\xff\xfe\n"), id="not-utf8"),
        pytest.param(lambda p: p.write_text("x: " + "[" * 500 + "]" * 500 + "\n"), id="deep"),
        pytest.param(lambda p: p.write_text("fpga-0: " + "9" * 10_000 + "\n"), id="huge-int"),
        pytest.param(lambda p: p.write_bytes(b"#" * (2 << 20)), id="too-big"),
        pytest.param(lambda p: p.mkdir(), id="folder"),
        pytest.param(lambda p: os.mkfifo(p), id="fifo"),
        pytest.param(lambda p: p.symlink_to("/dev/zero"), id="dev-zero"),
        pytest.param(
            lambda p: p.write_text(
                "a: &a [x, x, x, x, x, x, x, x, x]\n"
                + "".join(f"{n}: &{n} [{', '.join(['*' + m] * 9)}]\n" for m, n in zip("abcdefgh", "bcdefghi"))
            ),
            id="billion-laughs",
        ),
    ],
)
async def test_hostile_health_file_is_logged_and_the_last_state_kept(world, short_tmp, error_logged, hostile):
    """One bad byte (or a FIFO, /dev/zero, a bomb) must not stop anything."""
    folder = short_tmp / "h"
    folder.mkdir()
    health = folder / "health.yaml"
    health.write_text("fpga-0: Unhealthy\n")
    backend = plugin.create(resources({"count": 2, "health_file": str(health)}), world)
    async with running(backend) as sink:
        assert unhealthy(await sink.next()) == ["fpga-0"]
        health.unlink()
        assert unhealthy(await sink.next()) == []
        await asyncio.to_thread(hostile, folder / "tmp")
        (folder / "tmp").rename(health)  # in one step: a half-written file is another test
        await asyncio.wait_for(error_logged.event.wait(), DEADLINE)
        assert str(health) in error_logged.messages[-1] and len(error_logged.messages[-1]) < 500
        assert "Traceback" not in error_logged.messages[-1]
        assert sink.queue.empty()  # the last state stands
        if health.is_dir() and not health.is_symlink():
            health.rmdir()
        else:
            health.unlink()
        (folder / "new").write_text("fpga-1: Unhealthy\n")
        (folder / "new").rename(health)
        assert unhealthy(await sink.next()) == ["fpga-1"]


async def test_broken_health_file_at_start_means_healthy(world, short_tmp, error_logged):
    health = short_tmp / "health.yaml"
    health.write_text(": : :\n")
    backend = plugin.create(resources({"count": 2, "health_file": str(health)}), world)
    async with running(backend) as sink:
        assert unhealthy(await sink.next()) == []
    assert error_logged.messages


async def test_health_file_in_a_folder_that_appears_later(world, short_tmp):
    folder = short_tmp / "later"
    health = folder / "health.yaml"
    backend = plugin.create(resources({"count": 2, "health_file": str(health)}), world)
    async with running(backend) as sink:
        assert unhealthy(await sink.next()) == []
        folder.mkdir()
        health.write_text("fpga-1: Unhealthy\n")
        assert unhealthy(await sink.next()) == ["fpga-1"]


async def test_health_file_from_a_configmap_volume(world, short_tmp):
    """A ConfigMap volume: health.yaml -> ..data/health.yaml, updated by swapping ..data."""
    folder = short_tmp / "cm"
    folder.mkdir()

    def publish_version(n: int, text: str) -> None:
        version = folder / f"..v{n}"
        version.mkdir()
        (version / "health.yaml").write_text(text)
        tmp = folder / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, folder / "..data")

    publish_version(1, "fpga-0: Unhealthy\n")
    (folder / "health.yaml").symlink_to("..data/health.yaml")
    backend = plugin.create(resources({"count": 2, "health_file": str(folder / "health.yaml")}), world)
    async with running(backend) as sink:
        assert unhealthy(await sink.next()) == ["fpga-0"]
        publish_version(2, "fpga-1: Unhealthy\n")
        assert unhealthy(await sink.next()) == ["fpga-1"]
