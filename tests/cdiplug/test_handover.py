"""The handover (cdiplug.handover) on its own: a resource handed to DRA while the kubelet's
PodResources does not answer and before its backend has reported holds every device until the
kubelet answers, instead of being declared done with nothing held.

In-test backend and listener (as tests/cdiplug/host); tests/integration/test_handover.py runs the
handover in the node against the kubelet, DRA kubelet and PodResources stand-ins.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from cdiplug.backend import BackendPlugin
from cdiplug.deviceplugin.pod_resources import AllocatedDevices
from cdiplug.errors import KubeletError
from cdiplug.handover import HELD, Handover
from cdiplug.host import BackendHost
from cdiplug.models.world import World
from cdiplug.toolkit.supervisor import Supervisor

from .host.test_backends import Backend, Listener, Options, rc


async def test_a_kubelet_silent_before_the_backend_reports_keeps_every_device_held(world: World, tmp_path: Path) -> None:
    Backend.created = []
    supervisor = Supervisor()
    host = BackendHost(world, supervisor, plugins={"test": BackendPlugin("test", Options, Backend)})
    host.create([rc("example.com/a", count=2)])  # recreated by the same reload: nothing reported yet

    async def silent(socket: Path) -> AllocatedDevices:
        raise KubeletError(f"{socket}: no answer")

    handover = Handover(host, tmp_path / "kubelet.sock", supervisor, "node-a", interval=3600, lister=silent)
    try:
        await handover.begin(["example.com/a"])
        assert handover.moving == ["example.com/a"]  # not done: which devices pods hold is not known
        listener = Listener()
        host.attach("example.com/a", listener)
        host.start()
        await asyncio.wait_for(listener.event.wait(), 5)
        (first,) = listener.seen
        assert [(d.id, d.healthy, d.health_cause) for d in first.devices] == [("d0", False, HELD), ("d1", False, HELD)]
    finally:
        await supervisor.close()
