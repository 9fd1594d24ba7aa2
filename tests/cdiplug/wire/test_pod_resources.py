"""The PodResources v1 client (cdiplug.wire.pod_resources) against a real grpc.aio PodResourcesLister
stand-in (cdiplug.testing.PodResourcesStandIn) on a unix socket: devices folded per resource
over pods and containers, replica IDs, an empty node, a failing and an absent kubelet."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from cdiplug.errors import KubeletError
from cdiplug.testing import PodResourcesStandIn
from cdiplug.wire.pod_resources import AllocatedDevices, list_allocated


async def test_devices_per_resource_over_pods_and_containers(short_tmp: Path) -> None:
    socket = short_tmp / "kubelet.sock"
    async with PodResourcesStandIn(socket) as kubelet:
        kubelet.hold("default", "vm-0", "compute", "example.com/nic-vfio", ["0000:3b:02.0"])
        kubelet.hold("default", "vm-0", "sidecar", "example.com/nic-vfio", ["0000:3b:02.1"])
        kubelet.hold("kube-system", "dpdk", "app", "example.com/nic-vfio", ["0000:3b:02.2"])
        kubelet.hold("kube-system", "dpdk", "app", "example.com/fpga", ["fpga-0::1", "fpga-0::2"])
        held = await list_allocated(socket)
        assert kubelet.list_calls == 1
    assert held.of("example.com/nic-vfio") == {"0000:3b:02.0", "0000:3b:02.1", "0000:3b:02.2"}
    assert held.of("example.com/fpga") == {"fpga-0::1", "fpga-0::2"}
    assert held.underlying("example.com/fpga") == {"fpga-0"}
    assert held.of("example.com/other") == frozenset()
    assert held == AllocatedDevices(
        {"example.com/nic-vfio": {"0000:3b:02.0", "0000:3b:02.1", "0000:3b:02.2"}, "example.com/fpga": {"fpga-0::1", "fpga-0::2"}}
    )
    assert held != AllocatedDevices() and hash(held) == hash(AllocatedDevices(dict(held.by_resource)))
    with pytest.raises(TypeError):
        held.by_resource["x"] = frozenset()  # type: ignore[index]


async def test_released_pod_no_longer_holds(short_tmp: Path) -> None:
    socket = short_tmp / "kubelet.sock"
    async with PodResourcesStandIn(socket) as kubelet:
        kubelet.hold("default", "vm-0", "compute", "example.com/nic-vfio", ["0000:3b:02.0"])
        kubelet.release_pod("default", "vm-0")
        assert await list_allocated(socket) == AllocatedDevices()


async def test_kubelet_error_names_the_socket_and_status(short_tmp: Path) -> None:
    socket = short_tmp / "kubelet.sock"
    async with PodResourcesStandIn(socket) as kubelet:
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(KubeletError, match=rf"PodResources List at {socket} failed: UNAVAILABLE"):
            await list_allocated(socket)


async def test_no_kubelet_is_a_kubelet_error(short_tmp: Path) -> None:
    with pytest.raises(KubeletError, match="UNAVAILABLE"):
        await list_allocated(short_tmp / "absent.sock", timeout=2)
