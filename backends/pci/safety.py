"""Is a PCI function in use by the host? Checked before binding it away, and before giving it back.

Before a bind (unless the resource says ``force``):

- a network interface of the function that is up and has addresses (link-local ones aside: every
  IPv6 interface has one), or whose bond/bridge master does, or that carries a default route —
  read through pyroute2 (netlink), in the daemon's network namespace or a named one;
- a block device below the function (disk or partition) that is mounted (``mountinfo``: the
  daemon's own or a passed-in path such as ``/host/proc/1/mountinfo``), used as swap, or has
  holders (device-mapper, md);
- a function on the resource's denylist.

Before giving a function back to its driver: no process holds its group's ``/dev/vfio/<group>``
or the iommufd ``/dev/vfio/devices/vfioN`` of a function of the group open (read from
``<proc>/*/fd``; a VMM using iommufd opens only the latter), since unbinding a device in use
blocks in the kernel until it is let go. Netlink failures count as "cannot tell", which refuses rather than guesses.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, Iterable, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen
from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cdiplug.sdk import DeviceInUse

from .sysfs import PciFunction, PciSysfs

IFF_UP = 0x1
RT_SCOPE_LINK = 253
RTN_UNICAST = 1
RT_TABLE_LOCAL = 255


class FunctionInUse(DeviceInUse):
    """Refused to bind or restore a function the host is using; ``reason`` says how."""


@frozen
class NetUse:
    """How the host uses one network interface, as netlink reports it."""

    ifname: str
    up: bool = False
    addresses: tuple[str, ...] = ()
    default_route: bool = False
    master: str | None = None
    master_addresses: tuple[str, ...] = ()

    def problem(self) -> str | None:
        if self.default_route:
            return f"network interface {self.ifname} carries a default route"
        if self.up and self.addresses:
            return f"network interface {self.ifname} is up with addresses {', '.join(self.addresses)}"
        if self.up and self.master and self.master_addresses:
            return (
                f"network interface {self.ifname} is up in {self.master}, which has addresses {', '.join(self.master_addresses)}"
            )
        return None


async def _collect(result: list[Any] | AsyncIterable[Any]) -> list[Any]:
    """pyroute2's answer (a list, or its messages one by one) as a list; its messages are untyped."""
    if isinstance(result, list):
        return result
    return [m async for m in result]


async def net_use(ifnames: Iterable[str], netns: str | None = None) -> dict[str, NetUse | None]:
    """Netlink's view of each interface (None: not in this namespace). Raises NetlinkError/OSError."""
    found: dict[str, NetUse | None] = {}
    names = list(ifnames)
    if not names:
        return found
    # flags=0: look into an existing namespace, never create one (pyroute2's default would).
    async with AsyncIPRoute(netns=netns, flags=0) if netns else AsyncIPRoute() as ipr:
        links = await _collect(await ipr.link("dump"))
        by_name = {m.get("ifname"): m for m in links}
        by_index = {m["index"]: m for m in links}
        addrs = await _collect(await ipr.addr("dump"))
        routes = await _collect(await ipr.route("dump"))

        def addresses_of(index: int) -> tuple[str, ...]:
            return tuple(
                sorted(
                    f"{a.get('address')}/{a['prefixlen']}"
                    for a in addrs
                    if a["index"] == index and a["scope"] != RT_SCOPE_LINK and a.get("address")
                )
            )

        default_oifs = set()
        for r in routes:
            if r["dst_len"] != 0 or r["type"] != RTN_UNICAST or r.get("table") == RT_TABLE_LOCAL:
                continue
            if r.get("oif") is not None:
                default_oifs.add(r.get("oif"))
            for hop in r.get("multipath") or ():
                default_oifs.add(hop["oif"])

        for name in names:
            link = by_name.get(name)
            if link is None:
                found[name] = None
                continue
            index = link["index"]
            master_index = link.get("master")
            master = by_index.get(master_index) if master_index else None
            found[name] = NetUse(
                ifname=name,
                up=bool(link["flags"] & IFF_UP),
                addresses=addresses_of(index),
                default_route=index in default_oifs,
                master=master.get("ifname") if master is not None else None,
                master_addresses=addresses_of(master_index) if master is not None else (),
            )
    return found


def _mounted_devices(mountinfo: Path) -> dict[str, str]:
    """``major:minor`` -> a mount point, from a mountinfo file."""
    found: dict[str, str] = {}
    try:
        text = mountinfo.read_text()
    except OSError:
        return found
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            found.setdefault(fields[2], fields[4].replace("\\040", " "))
    return found


def _swaps(proc_root: Path) -> set[str]:
    try:
        lines = (proc_root / "swaps").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {os.path.basename(line.split()[0]) for line in lines if line.split()}


class SafetyChecker:
    """Answers "is this function in use?" for one sysfs root, mountinfo, proc root and netns."""

    def __init__(
        self,
        sysfs: PciSysfs,
        mountinfo: Path = Path("/proc/self/mountinfo"),
        proc_root: Path = Path("/proc"),
        netns: str | None = None,
    ) -> None:
        self.sysfs = sysfs
        self.mountinfo = Path(mountinfo)
        self.proc_root = Path(proc_root)
        self.netns = netns

    async def net_problems(self, fn: PciFunction) -> list[str]:
        if not fn.netdevs:
            return []
        try:
            uses = await net_use(fn.netdevs, self.netns)
        except (NetlinkError, OSError) as exc:
            return [f"cannot check network interfaces {', '.join(fn.netdevs)} through netlink: {exc}"]
        return [p for use in uses.values() if use is not None and (p := use.problem())]

    def block_problems(self, fn: PciFunction) -> list[str]:
        """Blocking (reads sysfs and mountinfo): call through ``asyncio.to_thread``."""
        blocks = self.sysfs.block_devices(fn.address)
        if not blocks:
            return []
        mounted = _mounted_devices(self.mountinfo)
        swaps = _swaps(self.proc_root)
        problems = []
        for name, dev in blocks:
            if dev in mounted:
                problems.append(f"block device {name} ({dev}) is mounted on {mounted[dev]}")
            if name in swaps:
                problems.append(f"block device {name} is in use as swap")
            holders = self.sysfs.block_holders(name)
            if holders:
                problems.append(f"block device {name} is held by {', '.join(holders)}")
        return problems

    async def problems(self, fn: PciFunction) -> list[str]:
        return [*(await self.net_problems(fn)), *(await asyncio.to_thread(self.block_problems, fn))]

    async def check_bind(self, functions: Sequence[PciFunction], denied: dict[str, str] | None = None) -> None:
        """Raise :class:`FunctionInUse` naming the first function in use (or denylisted)."""
        for fn in functions:
            entry = (denied or {}).get(fn.address)
            if entry is not None:
                raise FunctionInUse(fn.address, f"it is on the denylist ({entry}); the resource would need force: true")
            problems = await self.problems(fn)
            if problems:
                raise FunctionInUse(fn.address, "in use by the host: " + "; ".join(problems))

    def open_by(self, node: Path) -> list[str]:
        """``pid (comm)`` of every process holding ``node`` open. Blocking."""
        return self.holders([node]).get(str(node), [])

    def holders(self, nodes: Iterable[Path]) -> dict[str, list[str]]:
        """Node -> ``pid (comm)`` of every process holding it open, for the nodes anyone holds.

        One walk over ``<proc>/*/fd`` however many nodes are asked about. Blocking.
        """
        targets = {str(n) for n in nodes}
        found: dict[str, list[str]] = {}
        try:
            pids = [p for p in os.listdir(self.proc_root) if p.isdigit()]
        except OSError:
            return found
        for pid in pids:
            fd_dir = self.proc_root / pid / "fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue
            held = set()
            for fd in fds:
                try:
                    target = os.readlink(fd_dir / fd)
                except OSError:
                    continue
                if target in targets:
                    held.add(target)
            if held:
                try:
                    comm = (self.proc_root / pid / "comm").read_text().strip()
                except OSError:
                    comm = "?"  # it exited meanwhile; it held the node a moment ago
                for target in sorted(held):
                    found.setdefault(target, []).append(f"{pid} ({comm})")
        return found
