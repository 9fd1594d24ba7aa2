"""A resource moving from one front end to another on a live node: never two pods on one device.

When a reload changes a resource's ``api`` (``device-plugin`` -> ``dra``, say) the node (in this
order) has the front end it leaves stop serving it (the device plugin's socket goes, so the
kubelet's allocatable drops to 0 and the scheduler sends no new classic pods for it), asks that
front end which devices its consumers still hold (:meth:`~cdiplug.frontend.FrontEndType.holding`:
device-plugin pods, through the kubelet's PodResources API), and only then has the front end it
goes to serve it: those devices are held (:meth:`~cdiplug.host.BackendHost.hold`), offered to
every front end Unhealthy with the cause the leaving front end names
(:attr:`~cdiplug.frontend.FrontEndType.hold_cause`), so the new one serves them to no new
consumer (DRA publishes them tainted ``cdiplug.dev/device-plugin-pod=true:NoSchedule``; the
device plugin advertises devices DRA claims still use Unhealthy, cause ``dra-claim``). Every
``interval`` seconds it asks again; a device no consumer holds any more is served again, and once
none is held the handover is done.

A front end that cannot tell (the kubelet does not answer) means "don't know": every device of
the resource stays held until it can. A daemon that starts with a resource on one api asks once
whether another front end's consumers still hold its devices (a DaemonSet rolled with a new
configuration, or a restart during a handover) and holds them the same way; where which devices
is not known yet (claims, before the backend has reported), every device is held until it is.
Each step is logged and, through ``report``, a Node Event. No front end is named here: what each
one's consumers hold, and how, is the front end's (:mod:`cdiplug.frontend`).

The boundary: which devices are held and when they are free; how a held device is served is each
front end's, the holding the host's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from attrs import frozen

from cdiplug.errors import CdiplugError
from cdiplug.frontend import FrontEndType, front_end_type
from cdiplug.host import BackendHost
from cdiplug.models.devices import HealthCause
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.toolkit.supervisor import Supervisor

log = logging.getLogger(__name__)

TASK = "handover"
Report = Callable[[str, str], None]  # (reason, message): a Node Event
Done = Callable[[ResourceConfig[object]], Awaitable[None]]  # with the resource as the front end it left served it
Held = Mapping[str, frozenset[str] | None]


def _nothing(reason: str, message: str) -> None:
    pass


@frozen
class Move:
    """A resource going from one front end to another: ``leaving`` is the resource as the front
    end it leaves served it (its ``api``, its settings), ``to`` the api it goes to."""

    leaving: ResourceConfig[object]
    to: str

    @property
    def name(self) -> str:
        return self.leaving.name


class Handover:
    """Holds, for the front end a resource goes to, the devices the consumers of the one it left
    still use; see the module docstring."""

    def __init__(
        self,
        host: BackendHost,
        world: World,
        supervisor: Supervisor,
        *,
        interval: float = 5.0,
        report: Report = _nothing,
        done: Done | None = None,
    ) -> None:
        self.host = host
        self.world = world
        self.supervisor = supervisor
        self.interval = interval
        self.report = report
        self.done = done  # awaited with a resource whose handover the background check finished
        self._started: dict[str, float] = {}  # resource -> when its handover began (monotonic)
        self._moves: dict[str, Move] = {}  # resource -> its move, while its handover is not done
        self._wake = asyncio.Event()

    @property
    def moving(self) -> list[str]:
        """The resources whose handover is not done."""
        return sorted(self._started)

    def target(self, resource: str) -> str | None:
        """The api ``resource`` is being handed to, or None."""
        move = self._moves.get(resource) if resource in self._started else None
        return move.to if move is not None else None

    def leaving(self, resource: str) -> ResourceConfig[object] | None:
        """``resource`` as the front end it is leaving served it, while its handover is not done."""
        move = self._moves.get(resource) if resource in self._started else None
        return move.leaving if move is not None else None

    def _type(self, move: Move) -> FrontEndType:
        return front_end_type(move.leaving.api)

    def _cause(self, move: Move) -> HealthCause:
        cause = self._type(move).hold_cause
        assert cause is not None  # begin() takes no move from a front end without one
        return cause

    async def _ask(self, moves: Iterable[Move], at_start: bool) -> dict[str, Held | None]:
        """What the consumers of each leaving api hold, by api; None where its front end cannot tell."""
        by_api: dict[str, list[ResourceConfig[object]]] = {}
        for move in moves:
            by_api.setdefault(move.leaving.api, []).append(move.leaving)
        answers: dict[str, Held | None] = {}
        for api, resources in by_api.items():
            try:
                answers[api] = await front_end_type(api).holding(resources, self.world, self.host.latest, at_start=at_start)
            except CdiplugError as exc:
                names = ", ".join(r.name for r in resources)
                if at_start:
                    log.debug("no handover check at start for %s (%s): %s", names, api, exc)
                else:
                    log.warning("%s cannot tell what its consumers hold (%s): every device of %s stays held", api, exc, names)
                answers[api] = None
        return answers

    async def begin(self, moves: Iterable[Move], *, at_start: bool = False) -> None:
        """Each move's resource just left one front end for another (the old one stopped serving
        it): hold what the old one's consumers hold, before the new front end serves it.

        ``at_start``: the daemon starts with each resource on ``to``, and asks whether an earlier
        run served it through the front end of ``leaving`` (a pod rolled with a new configuration,
        or restarted mid-handover, may follow one that did): held only where that front end says
        its consumers hold some; nothing is said otherwise. A resource takes the first of its
        moves whose consumers hold something."""
        wanted: list[Move] = []
        for move in moves:
            if move.name not in self._started and self._type(move).hold_cause is not None:
                wanted.append(move)
        if not wanted:
            return
        answers = await self._ask(wanted, at_start)
        begun: list[str] = []
        for move in wanted:
            if move.name in self._started:
                continue  # an earlier move of the same resource holds it
            held = answers[move.leaving.api]
            if at_start and (held is None or held.get(move.name) == frozenset()):
                continue
            self._started[move.name] = time.monotonic()
            self._moves[move.name] = move
            log.info("%s moves from %s to %s: %s stopped serving it", move.name, move.leaving.api, move.to, move.leaving.api)
            self._hold(move, held)
            begun.append(move.name)
        if not begun:
            return
        if not self.supervisor.running(TASK):
            self.supervisor.spawn(TASK, self._run())
        self._wake.set()

    def cancel(self, resources: Iterable[str]) -> None:
        """``resources`` are no longer handed to the api they were going to (removed, or moved again)."""
        for name in resources:
            if self._started.pop(name, None) is not None:
                move = self._moves.pop(name)
                self.host.hold(name, frozenset(), self._cause(move))
                log.info("%s: its handover ends unfinished (it moved again)", name)

    def _hold(self, move: Move, held: Held | None) -> None:
        name, cause = move.name, self._cause(move)
        if held is None:  # the front end cannot tell: whatever its consumers hold, every device stays held
            latest = self.host.latest(name)
            if latest is None:  # nor has the backend reported (recreated by the same reload): all, as it reports them
                self.host.hold_all(name, cause)
                return
            ids: frozenset[str] | None = frozenset(d.id for d in latest.devices)
        else:
            ids = held.get(name, frozenset())
        if ids is None:  # until the backend reports: every device, asked again each interval
            self.host.hold_all(name, cause)
            log.info("%s: still used by %s: every device held until its devices are known", name, self._consumers(move))
            return
        if ids == self.host.held(name) and ids:
            return
        self.host.hold(name, ids, cause)
        if ids:
            goes_to = front_end_type(move.to).holds(move.leaving)
            message = f"{name}: {', '.join(sorted(ids))} still used by {self._consumers(move)}: {goes_to}"
            log.info("%s", message)
            self.report("HandoverHeld", message)
        else:
            took = time.monotonic() - self._started.pop(name)
            self._moves.pop(name, None)
            message = f"{name}: no consumer of {move.leaving.api} holds a device any more; every device is served ({took:.1f} s)"
            log.info("%s", message)
            self.report("HandoverDone", message)

    def _consumers(self, move: Move) -> str:
        return self._type(move).consumers(move.leaving)

    async def _run(self) -> None:
        while self._started:
            self._wake.clear()
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            if not self._started:
                return
            moves = [self._moves[name] for name in list(self._started)]
            answers = await self._ask(moves, at_start=False)
            for move in moves:
                held = answers[move.leaving.api]
                if held is None or move.name not in self._started:
                    continue  # asked again next interval; until then what is held stays held
                self._hold(move, held)
                if move.name not in self._started:
                    if self.done is not None:
                        await self.done(move.leaving)
