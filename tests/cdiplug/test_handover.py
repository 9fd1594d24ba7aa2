"""The handover (cdiplug.handover) on its own: a resource handed from the device plugin to DRA
while the kubelet's PodResources does not answer (no socket) and before its backend has reported
holds every device until the kubelet answers, instead of being declared done with nothing held.

In-test backend and listener (as tests/cdiplug/host); tests/integration/test_handover.py runs the
handover in the node against the kubelet, DRA kubelet and PodResources stand-ins.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs

from cdiplug.backend import BackendPlugin
from cdiplug.deviceplugin.settings import HELD
from cdiplug.handover import Handover, Move
from cdiplug.host import BackendHost
from cdiplug.models.resource import Api
from cdiplug.models.world import World
from cdiplug.toolkit.supervisor import Supervisor

from .host.test_backends import Backend, Listener, Options, rc


async def test_a_kubelet_silent_before_the_backend_reports_keeps_every_device_held(world: World, tmp_path: Path) -> None:
    Backend.created = []
    supervisor = Supervisor()
    host = BackendHost(world, supervisor, plugins={"test": BackendPlugin("test", Options, Backend)})
    resource = rc("example.com/a", count=2)
    host.create([resource])  # recreated by the same reload: nothing reported yet
    silent = attrs.evolve(world, pod_resources_socket=tmp_path / "kubelet.sock")  # nothing serves it

    handover = Handover(host, silent, supervisor, interval=3600)
    try:
        await handover.begin([Move(resource, Api.DRA)])
        assert handover.moving == ["example.com/a"]  # not done: which devices pods hold is not known
        listener = Listener()
        host.attach("example.com/a", listener)
        host.start()
        await asyncio.wait_for(listener.event.wait(), 5)
        (first,) = listener.seen
        assert [(d.id, d.healthy, d.health_cause) for d in first.devices] == [("d0", False, HELD), ("d1", False, HELD)]
    finally:
        await supervisor.close()
