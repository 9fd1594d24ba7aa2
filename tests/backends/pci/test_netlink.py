"""Network checks through real netlink (pyroute2): in-use rules (cdiplug_backends.pci.safety) and link-state
health (cdiplug_backends.pci.links) on veth and bridge interfaces in a network namespace each test creates
and removes; the host's own interfaces are never touched. A fake sysfs tree names the same
interfaces as a PCI function's netdevs, so the backend ties them to devices as it does on a node."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from pyroute2 import AsyncIPRoute, netns

from cdiplug.models.devices import Health
from cdiplug.models.world import World
from cdiplug_backends.pci.discovery import LINK_DOWN
from cdiplug_backends.pci.safety import NetUse, SafetyChecker, net_use
from cdiplug_backends.pci.sysfs import PciSysfs
from cdiplug_backends.pci.testing import SysfsTree

from .conftest import make_backend, running


@pytest.fixture
async def ns() -> AsyncIterator[str]:
    """A fresh network namespace holding a veth pair v0/v1 (both down)."""
    name = f"cdp-{uuid.uuid4().hex[:10]}"
    netns.create(name)
    try:
        async with AsyncIPRoute(netns=name) as ipr:
            await ipr.link("add", ifname="v0", kind="veth", peer="v1")
        yield name
    finally:
        netns.remove(name)


async def ip(ns: str, *calls: tuple) -> None:
    """Make ``calls`` (idempotent link and address changes) in ``ns``.

    pyroute2 reaches a namespace through a forked helper, and a fork while gRPC threads run in
    this test process can leave the helper stuck (gRPC: "skipping fork() handlers"; once in CI, a
    test waited out its 300 s): each try is bounded and a stuck one is made again afresh.
    """
    for attempt in range(3):
        try:
            async with asyncio.timeout(15):
                await _ip(ns, *calls)
            return
        except TimeoutError:
            if attempt == 2:
                raise AssertionError(f"netlink calls in namespace {ns} did not answer within 15 s, three times") from None


async def _ip(ns: str, *calls: tuple) -> None:
    async with AsyncIPRoute(netns=ns) as ipr:
        for method, *args, kwargs in calls:
            if "ifname" in kwargs and (method, *args) != ("link", "add"):
                kwargs = {**kwargs, "index": (await ipr.link_lookup(ifname=kwargs.pop("ifname")))[0]}
            if "oif_name" in kwargs:
                kwargs = {**kwargs, "oif": (await ipr.link_lookup(ifname=kwargs.pop("oif_name")))[0]}
            if "master_name" in kwargs:
                kwargs = {**kwargs, "master": (await ipr.link_lookup(ifname=kwargs.pop("master_name")))[0]}
            await getattr(ipr, method)(*args, **kwargs)


async def test_down_interface_is_free(ns: str) -> None:
    uses = await net_use(["v0", "nonexistent"], ns)
    assert uses["v0"] == NetUse("v0") and uses["v0"].problem() is None
    assert uses["nonexistent"] is None


async def test_up_with_only_link_local_addresses_is_free(ns: str) -> None:
    await ip(ns, ("link", "set", {"ifname": "v0", "state": "up"}), ("link", "set", {"ifname": "v1", "state": "up"}))
    use = (await net_use(["v0"], ns))["v0"]
    assert use.up and use.addresses == () and use.problem() is None


async def test_up_with_an_address_is_in_use(ns: str) -> None:
    await ip(
        ns,
        ("addr", "add", {"ifname": "v0", "address": "192.0.2.5", "prefixlen": 24}),
        ("link", "set", {"ifname": "v0", "state": "up"}),
    )
    use = (await net_use(["v0"], ns))["v0"]
    assert use.problem() == "network interface v0 is up with addresses 192.0.2.5/24"


async def test_down_with_an_address_is_free(ns: str) -> None:
    await ip(ns, ("addr", "add", {"ifname": "v0", "address": "192.0.2.5", "prefixlen": 24}))
    assert (await net_use(["v0"], ns))["v0"].problem() is None


async def test_default_route_is_in_use(ns: str) -> None:
    await ip(
        ns,
        ("link", "set", {"ifname": "v0", "state": "up"}),
        ("route", "add", {"dst": "0.0.0.0/0", "oif_name": "v0"}),
    )
    use = (await net_use(["v0"], ns))["v0"]
    assert use.default_route and use.problem() == "network interface v0 carries a default route"


async def test_port_of_a_bridge_with_addresses_is_in_use(ns: str) -> None:
    await ip(
        ns,
        ("link", "add", {"ifname": "br0", "kind": "bridge"}),
        ("link", "set", {"ifname": "v0", "master_name": "br0", "state": "up"}),
        ("addr", "add", {"ifname": "br0", "address": "198.51.100.1", "prefixlen": 24}),
    )
    use = (await net_use(["v0"], ns))["v0"]
    assert use.master == "br0"
    assert use.problem() == "network interface v0 is up in br0, which has addresses 198.51.100.1/24"


async def test_safety_checker_ties_sysfs_netdevs_to_netlink(ns: str, tree: SysfsTree) -> None:
    tree.add_function("0000:3b:00.0", driver="i40e", iommu_group=5, netdevs=["v0"])
    fn = PciSysfs(tree.root).read_function("0000:3b:00.0")
    checker = SafetyChecker(PciSysfs(tree.root), netns=ns)
    assert await checker.net_problems(fn) == []
    await ip(
        ns,
        ("addr", "add", {"ifname": "v0", "address": "192.0.2.7", "prefixlen": 24}),
        ("link", "set", {"ifname": "v0", "state": "up"}),
    )
    assert await checker.net_problems(fn) == ["network interface v0 is up with addresses 192.0.2.7/24"]
    broken = SafetyChecker(PciSysfs(tree.root), netns="cdp-no-such-namespace")
    (problem,) = await broken.net_problems(fn)
    assert problem.startswith("cannot check network interfaces v0 through netlink")


async def test_link_health_follows_link_state_events(ns: str, world: World, tree: SysfsTree) -> None:
    tree.add_function("0000:3b:00.0", driver="i40e", iommu_group=5, netdevs=["v0"])
    tree.add_function("0000:3c:00.0", driver="i40e", iommu_group=6)  # no interface: never judged
    spec = ("example.com/nic", {"selectors": [{"driver": "i40e"}], "link_health": True})
    backend = make_backend(world, [spec], netns=ns)
    async with running(backend) as sink:
        snap = await sink.until("example.com/nic", lambda s: s.get("0000:3b:00.0").health is Health.UNHEALTHY)
        assert snap.get("0000:3c:00.0").health is Health.HEALTHY
        assert snap.get("0000:3b:00.0").cause == LINK_DOWN  # DRA taint cdiplug.dev/link-down
        await ip(ns, ("link", "set", {"ifname": "v1", "state": "up"}), ("link", "set", {"ifname": "v0", "state": "up"}))
        up = await sink.until("example.com/nic", lambda s: s.get("0000:3b:00.0").health is Health.HEALTHY)
        assert up.get("0000:3b:00.0").cause is None  # back up: no taint
        await ip(ns, ("link", "set", {"ifname": "v1", "state": "down"}))  # v0 loses its carrier
        await sink.until("example.com/nic", lambda s: s.get("0000:3b:00.0").health is Health.UNHEALTHY)
