#!/usr/bin/env python3
"""On a GPU node: the real daemon serving nvidia.com/gpu from NVML to the kubelet stand-in.

    python3 hack/gpu-node-check.py

Runs ``cdiplug serve``'s daemon in-process with the built-in NVIDIA backend (real NVML) next
to two fake FPGAs, registers both with cdiplug's kubelet stand-in in a temporary folder, admits
a pod asking for one GPU and prints what it got (device IDs, env, device nodes, CDI names) and
the CDI spec written. Exit 0 when the pod was admitted with a GPU, 1 otherwise. Complements
hack/nvidia-probe, which shows what the backend finds without serving.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from cdiplug.config import parse_config
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, running_daemon

GPU = "nvidia.com/gpu"


async def main(folder: Path) -> int:
    world = World(kubelet_dir=folder / "kubelet", cdi_dir=folder / "cdi", state_dir=folder / "state")
    config = parse_config(
        {"resources": [{"name": GPU, "backend": "nvidia"}, {"name": "example.com/fpga", "backend": "fake"}]},
        "hack/gpu-node-check.py",
    )
    async with KubeletStandIn(world.kubelet_dir) as kubelet, running_daemon(config, world):
        await kubelet.wait_registered("example.com/fpga", timeout=60)  # the daemon is up
        try:
            # A resource with no devices is not registered (register_when_empty: false).
            await kubelet.wait_registered(GPU, timeout=10)
            await kubelet.wait_until(lambda: kubelet.capacity(GPU) > 0, 10, "GPUs listed")
        except TimeoutError:
            print(f"{GPU} not registered: no GPU found (no NVIDIA driver here?); see the daemon's log above")
            return 1
        print(f"registered {GPU}: capacity {kubelet.capacity(GPU)}, allocatable {kubelet.allocatable(GPU)}")
        for device in kubelet.devices(GPU):
            print(f"  {device.id} {'Healthy' if device.healthy else 'Unhealthy'} numa {list(device.numa_nodes)}")
        pod = await kubelet.admit_pod("gpu-pod", {GPU: 1})
        print(f"pod: {pod.phase.value} {pod.reason or ''}")
        for container in pod.containers:
            for resource, answer in container.allocations:
                print(f"  {resource}: devices {list(answer.device_ids)}")
                print(f"    env {dict(answer.env)}")
                print(f"    device specs {[d.path for d in answer.device_specs]}")
                print(f"    cdi {list(answer.cdi_devices)}")
        for spec in sorted(world.cdi_dir.glob("*.json")):
            print(f"{spec.name}: {json.dumps(json.loads(spec.read_text()))}")
        return 0 if pod.admitted and pod.device_ids(GPU) else 1


with tempfile.TemporaryDirectory(prefix="cdiplug-gpu-") as tmp:
    sys.exit(asyncio.run(main(Path(tmp))))
