"""The backend host's node-wide hooks: observers see every snapshot; held devices are offered Unhealthy.

In-test backend and listener (as test_backends). Covers: an observer sees each resource's
snapshots after its front end; :meth:`BackendHost.hold` offers the held devices Unhealthy with the
cause (the taint DRA publishes) to the front end at once and in every later snapshot, leaves the
snapshot observers and ``latest`` as the backend reported it, and releasing the hold offers them as
reported again; :meth:`BackendHost.hold_all` offers every device Unhealthy until a hold names which.
"""

from __future__ import annotations

import asyncio

from cdiplug.backend import BackendPlugin
from cdiplug.host import BackendHost
from cdiplug.models.devices import DeviceSnapshot, HealthCause
from cdiplug.models.world import World
from cdiplug.toolkit.supervisor import Supervisor

from .test_backends import Backend, Listener, Options, rc

CAUSE = HealthCause("device-plugin-pod")


async def test_held_devices_are_offered_unhealthy_until_released(world: World) -> None:
    Backend.created = []
    host = BackendHost(world, Supervisor(), plugins={"test": BackendPlugin("test", Options, Backend)})
    observed: list[DeviceSnapshot] = []
    host.observe(observed.append)
    host.create([rc("example.com/a", count=2)])
    host.hold("example.com/a", frozenset({"d1"}), CAUSE)  # before anything reported: the first offer holds it
    listener = Listener()
    host.attach("example.com/a", listener)
    host.start()
    try:
        await asyncio.wait_for(listener.event.wait(), 5)
        (first,) = listener.seen
        assert [(d.id, d.healthy, d.health_cause) for d in first.devices] == [("d0", True, None), ("d1", False, CAUSE)]
        assert [d.healthy for d in observed[0].devices] == [True, True]  # observers see what the backend said
        latest = host.latest("example.com/a")
        assert latest is not None and all(d.healthy for d in latest.devices)
        assert host.held("example.com/a") == {"d1"}

        host.hold("example.com/a", frozenset(), CAUSE)
        assert [d.healthy for d in listener.seen[-1].devices] == [True, True] and len(listener.seen) == 2
        host.hold("example.com/a", frozenset(), CAUSE)  # nothing held: nothing offered again
        assert len(listener.seen) == 2 and host.held("example.com/a") == frozenset()
    finally:
        await host.supervisor.close()


async def test_hold_all_offers_every_device_unhealthy_until_told_which(world: World) -> None:
    Backend.created = []
    host = BackendHost(world, Supervisor(), plugins={"test": BackendPlugin("test", Options, Backend)})
    host.create([rc("example.com/a", count=2)])
    host.hold_all("example.com/a", CAUSE)  # at start: claims use some device, which is not known yet
    assert host.held("example.com/a") == frozenset()  # nothing reported: no IDs to name
    listener = Listener()
    host.attach("example.com/a", listener)
    host.start()
    try:
        await asyncio.wait_for(listener.event.wait(), 5)
        (first,) = listener.seen
        assert [(d.id, d.healthy, d.health_cause) for d in first.devices] == [("d0", False, CAUSE), ("d1", False, CAUSE)]
        assert host.held("example.com/a") == {"d0", "d1"}
        host.hold("example.com/a", frozenset({"d1"}), CAUSE)  # now known: only that one
        assert [d.healthy for d in listener.seen[-1].devices] == [True, False]
    finally:
        await host.supervisor.close()
