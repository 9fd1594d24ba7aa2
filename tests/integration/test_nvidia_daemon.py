"""The NVIDIA backend through the real daemon and real gRPC over unix sockets, with the kubelet stand-in.

The daemon (``cdiplug.daemon.serve``) runs in the test's event loop with the NVIDIA plugin handed a ``FakeNvml``
on the 2x4 NVLink-pair machine, next to a fake-backend resource. Covers: GPUs registered with
their NUMA nodes; a 4-GPU pod gets the NVLink-best set with CDI names, device nodes and
NVIDIA_VISIBLE_DEVICES; an XID reaches ListAndWatch as Unhealthy and the GPU comes back after
clean probes; a node without NVML keeps serving its other resource; ``fail_on_init_error`` stops
the daemon with BackendInitError. The last tests run ``cdiplug serve`` as a process against the
real pynvml on this machine, which has no NVIDIA driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes.util
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from cdiplug.backend import BackendPlugin, load_plugins
from cdiplug.config import Config, parse_config
from cdiplug.errors import BackendInitError
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, daemon_process, running_daemon
from cdiplug_backends.nvidia import make_plugin
from cdiplug_backends.nvidia.testing import FakeNvml
from cdiplug_backends.nvidia.testing import nvml as fake_module

GPU = "nvidia.com/gpu"
KIND = "cdiplug.nvidia.com/gpu"
FPGA = "example.com/fpga"
NO_DRIVER = pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="this checks a node without the NVIDIA driver; this machine has the driver library",
)


def make_config(**gpu_options: object) -> Config:
    options = {"reprobe_interval_s": 0.05, "clean_probes": 2, **gpu_options}
    return parse_config(
        {
            "resources": [
                {"name": GPU, "backend": "nvidia", "cdi_kind": KIND, "options": options},
                {"name": FPGA, "backend": "fake", "options": {"count": 2}},
            ]
        },
        source="test_nvidia_daemon",
    )


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml.nvlink_pairs()


@pytest.fixture
def gpu_world(world: World, fake: FakeNvml) -> World:
    fake.write_sysfs(world.sysfs_root)
    fake.write_dev(world.dev_root)
    return world


def plugins(fake: FakeNvml) -> dict[str, BackendPlugin[Any]]:
    """The installed plugins, the NVIDIA one handed the fake NVML."""
    registry = load_plugins()
    return {**{name: registry[name] for name in registry}, "nvidia": make_plugin(nvml=fake)}


@contextlib.asynccontextmanager
async def daemon(config: Config, world: World, fake: FakeNvml) -> AsyncIterator[asyncio.Task[int]]:
    with contextlib.suppress(BackendInitError):
        async with running_daemon(config, world, plugins=plugins(fake)) as task:
            yield task


@contextlib.asynccontextmanager
async def node(
    config: Config, world: World, fake: FakeNvml, registered: tuple[str, ...] = (GPU, FPGA)
) -> AsyncIterator[KubeletStandIn]:
    async with KubeletStandIn(world.kubelet_dir) as kubelet, daemon(config, world, fake):
        for resource in registered:
            await kubelet.wait_registered(resource, timeout=10)
        yield kubelet


async def test_a_4_gpu_pod_gets_the_nvlink_best_set(gpu_world: World, fake: FakeNvml) -> None:
    uuids = [g.uuid for g in fake.gpus]
    async with node(make_config(), gpu_world, fake) as kubelet:
        await kubelet.wait_until(lambda: kubelet.capacity(GPU) == 8, timeout=5, what="8 GPUs listed")
        assert {d.id: d.numa_nodes for d in kubelet.devices(GPU)} == {u: ((0,) if i < 4 else (1,)) for i, u in enumerate(uuids)}
        # Take GPU 0 first, so the best 4 are not simply the first IDs.
        blocker = await kubelet.admit_pod("blocker", {GPU: 1})
        assert blocker.device_ids() == (uuids[0],)  # the best single GPU: the first of the best pair
        pod = await kubelet.admit_pod("train", {GPU: 4})
        assert pod.admitted, pod
        # GPU 0 is taken: the best 4 left are the other socket's two NVLink pairs.
        assert sorted(pod.device_ids()) == sorted(uuids[4:8])
        assert sorted(pod.cdi_devices) == sorted(f"{KIND}={u}" for u in uuids[4:8])
        assert sorted(pod.env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(uuids[4:8])
        paths = {d.path for d in pod.device_specs}
        assert {f"/dev/nvidia{i}" for i in range(4, 8)} <= paths and "/dev/nvidiactl" in paths
        assert "/dev/nvidia0" not in paths
        pair = await kubelet.admit_pod("pair", {GPU: 2})
        assert sorted(pair.device_ids()) == sorted(uuids[2:4]), pair  # the NVLink pair still whole
    spec = json.loads((gpu_world.cdi_dir / "cdiplug-cdiplug.nvidia.com-gpu.json").read_text())
    assert spec["kind"] == KIND and sorted(d["name"] for d in spec["devices"]) == sorted(uuids)
    assert {n["path"] for n in spec["containerEdits"]["deviceNodes"]} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}


async def test_an_xid_reaches_list_and_watch_and_the_gpu_recovers(gpu_world: World, fake: FakeNvml) -> None:
    sick = fake.gpus[5].uuid
    async with node(make_config(), gpu_world, fake) as kubelet:
        await kubelet.wait_until(lambda: kubelet.allocatable(GPU) == 8, timeout=5, what="8 healthy GPUs")
        assert await asyncio.to_thread(fake.wait_registered)
        fake.fail_probe(sick)
        fake.inject_xid(sick, 79)
        await kubelet.wait_until(lambda: kubelet.allocatable(GPU) == 7, timeout=5, what="the GPU to turn Unhealthy")
        assert kubelet.capacity(GPU) == 8
        assert {d.id for d in kubelet.devices(GPU) if not d.healthy} == {sick}
        pod = await kubelet.admit_pod("big", {GPU: 8})
        assert not pod.admitted and pod.reason == f"Insufficient {GPU}"
        fake.heal(sick)
        await kubelet.wait_until(lambda: kubelet.allocatable(GPU) == 8, timeout=5, what="the GPU to recover")
        assert (await kubelet.admit_pod("big-again", {GPU: 8})).admitted


@pytest.mark.parametrize("strategy", ["spread", "pack"])
async def test_replicas_share_health_and_follow_the_strategy(gpu_world: World, fake: FakeNvml, strategy: str) -> None:
    config = make_config(replica_strategy=strategy)
    config = attrs.evolve(
        config,
        resources=(
            attrs.evolve(config.resources[0], settings=attrs.evolve(config.resources[0].settings, replicas=2)),
            config.resources[1],
        ),
    )
    uuids = [g.uuid for g in fake.gpus]
    async with node(config, gpu_world, fake) as kubelet:
        await kubelet.wait_until(lambda: kubelet.capacity(GPU) == 16, timeout=5, what="16 replicas listed")
        assert {d.id for d in kubelet.devices(GPU)} == {f"{u}::{i}" for u in uuids for i in range(2)}
        pod = await kubelet.admit_pod("shared", {GPU: 2})
        used = sorted(i.partition("::")[0] for i in pod.device_ids())
        assert used == ([uuids[0], uuids[0]] if strategy == "pack" else [uuids[0], uuids[1]]), pod
        assert sorted(pod.env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(set(used))
        assert await asyncio.to_thread(fake.wait_registered)
        fake.fail_probe(uuids[7])
        fake.inject_xid(uuids[7], 48)
        await kubelet.wait_until(lambda: kubelet.allocatable(GPU) == 14, timeout=5, what="both replicas Unhealthy")
        assert {d.id for d in kubelet.devices(GPU) if not d.healthy} == {f"{uuids[7]}::0", f"{uuids[7]}::1"}


async def test_without_nvml_the_other_resource_keeps_serving(gpu_world: World, fake: FakeNvml) -> None:
    fake.fail_init(fake_module.NVML_ERROR_LIBRARY_NOT_FOUND)
    async with node(make_config(), gpu_world, fake, registered=(FPGA,)) as kubelet:
        await kubelet.wait_until(lambda: kubelet.capacity(FPGA) == 2, timeout=5, what="the FPGAs listed")
        # no GPUs: not registered at all (register_when_empty: false), so the node shows no nvidia.com/gpu
        assert not kubelet.is_registered(GPU) and kubelet.capacity(GPU) == 0
        assert (await kubelet.admit_pod("fpga", {FPGA: 2})).admitted
        assert (await kubelet.admit_pod("gpu", {GPU: 1})).reason == f"Insufficient {GPU}"


async def test_fail_on_init_error_stops_the_daemon(gpu_world: World, fake: FakeNvml) -> None:
    from cdiplug.daemon import serve

    fake.fail_init(fake_module.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendInitError, match="fail_on_init_error"):
        await asyncio.wait_for(
            serve(make_config(fail_on_init_error=True), gpu_world, plugins=plugins(fake), stop=asyncio.Event()), 10
        )
    assert list(gpu_world.kubelet_dir.glob("*.sock")) == []  # stopped cleanly: our sockets are gone


def write_config(folder: Path, **gpu_options: object) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "resources": [
                    {"name": GPU, "backend": "nvidia", "cdi_kind": KIND, "options": dict(gpu_options)},
                    {"name": FPGA, "backend": "fake", "options": {"count": 2}},
                ]
            }
        )
    )
    return path


def roots(world: World) -> tuple[str, ...]:
    return ("--sysfs-root", str(world.sysfs_root), "--dev-root", str(world.dev_root))


@NO_DRIVER
async def test_cdiplug_serve_on_a_node_without_a_driver(world: World, short_tmp: Path) -> None:
    config = write_config(short_tmp)
    async with KubeletStandIn(world.kubelet_dir) as kubelet, daemon_process(world, config, *roots(world)) as daemon:
        await kubelet.wait_registered(FPGA, timeout=20)
        await kubelet.wait_until(lambda: kubelet.capacity(FPGA) == 2, timeout=5, what="the FPGAs listed")
        assert not kubelet.is_registered(GPU) and kubelet.capacity(GPU) == 0  # the log below says it waits
        assert (await kubelet.admit_pod("fpga", {FPGA: 1})).admitted
        assert await daemon.stop() == 0, daemon.tail()
    text = daemon.messages()
    assert "NVML is not available" in text and f"resource {GPU} advertises no GPUs" in text
    assert f"{GPU}: no devices found; registering it once one appears" in text
    assert "Traceback" not in daemon.log.read_text()


@NO_DRIVER
async def test_cdiplug_serve_with_fail_on_init_error_exits_2(world: World, short_tmp: Path) -> None:
    config = write_config(short_tmp, fail_on_init_error=True)
    async with daemon_process(world, config, *roots(world)) as daemon:
        assert await daemon.wait(30) == 2, daemon.tail()
    text = daemon.messages()
    assert "NVML is not available" in text and "fail_on_init_error" in text
    assert "Traceback" not in daemon.log.read_text()
