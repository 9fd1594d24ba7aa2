"""The zygote of the DRA kill-at-every-step test (test_dra_kill_steps.py).

It imports cdiplug once, then for each line ``<step> <seed>`` read on stdin forks a child (the
zygote has no threads and no event loop, so the fork is clean) and says ``exit <status>`` when
that child ends. Each child is one run of the DRA claim machinery on the folders under ROOT: the
real :class:`~cdiplug.dra.prepare.ClaimPreparer`, :class:`~cdiplug.dra.checkpoint.ClaimStore` and
:class:`~cdiplug.host.BackendHost` with the fake backend's visible preparation (a marker file per
prepared device), the API a dict of ResourceClaims at the client seam. The child:

1. starts as the daemon does: the checkpoint loaded, claims left ``PrepareStarted`` rolled back
   (:func:`~cdiplug.dra.prepare.roll_back_started`), the driver's claims restored; says
   ``recovered`` and waits for SIGUSR1 (the parent checks the folders meanwhile);
2. with ``CDIPLUG_DRA_PAUSE_AFTER=<step>`` does what the seed picks: a prepare of a claim not
   prepared (steps of a prepare), or an unprepare of one prepared (steps of an unprepare; a
   claim is prepared first when none is), with a full prepare or unprepare of another claim
   before it now and then; says ``paused`` at the step and waits there to be killed (SIGKILL).

``<step> none`` ends the child after step 1 (the last check). Usage: ``python dra_kill_child.py ROOT``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

from cdiplug.backend import BackendPlugin, load_plugins
from cdiplug.config import parse_config
from cdiplug.dra import prepare as prepare_module
from cdiplug.dra.checkpoint import ClaimStore
from cdiplug.dra.claims import ClaimRef
from cdiplug.dra.prepare import ClaimPreparer
from cdiplug.dra.rollback import roll_back_started
from cdiplug.models.world import World
from cdiplug.testing.dra_claims import ClaimsAtSeam, hosted_backend

DRIVER = "fpga.example.com"
NODE = "node-k"
RESOURCE = "example.com/fpga"
UNPREPARE_STEPS = {"spec-removed", "released"}
CLAIMS = [ClaimRef("default", f"claim-{i}", f"{i:08x}-1111-4222-8333-444444444444") for i in range(4)]
DEVICES = {c.uid: [f"fpga-{i}", f"fpga-{(i + 1) % 4}"] if i == 3 else [f"fpga-{i}"] for i, c in enumerate(CLAIMS)}


def api() -> ClaimsAtSeam:
    """The API at the client seam: every claim allocated to its devices; status writes taken."""
    claims = ClaimsAtSeam(DRIVER, NODE, namespace="default")
    for ref in CLAIMS:
        claims.put(ref.uid, [claims.result(d, "fpga") for d in DEVICES[ref.uid]], name=ref.name)
    return claims


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def run(root: Path, step: str, seed: int) -> None:
    world = World(kubelet_dir=root / "kubelet", cdi_dir=root / "cdi", state_dir=root / "state")
    options = {"count": 4, "prepared_dir": str(root / "prepared")}
    config = parse_config({"resources": [{"name": RESOURCE, "backend": "fake", "api": "dra", "options": options}]}, source="kill")
    resource = config.resources[0]
    async with hosted_backend(world, resource, PLUGINS) as host:
        store = ClaimStore(world.state_dir)
        await store.load()
        await roll_back_started(store, host)
        claims = api()
        preparer = ClaimPreparer(resource, NODE, host, store, lambda: claims, pause_after=step)  # type: ignore[arg-type, return-value]
        preparer.devices_known()
        snapshot = host.latest(RESOURCE)
        assert snapshot is not None
        await preparer.restore(snapshot)
        await steps(preparer, store, step, seed)


async def steps(preparer: ClaimPreparer, store: ClaimStore, step: str, seed: int) -> None:
    say("recovered")
    if step == "none":
        return
    await asyncio.to_thread(signal.sigwait, {signal.SIGUSR1})
    rng = random.Random(seed)
    done = {c.uid for c in store.all() if c.completed}
    if rng.random() < 0.5:  # something else first, whole: the checkpoint holds several claims
        other = rng.choice(CLAIMS)
        preparer.pause_after = None
        await (preparer.unprepare(other) if other.uid in done else preparer.prepare(other))
        preparer.pause_after = step
        done ^= {other.uid}
    say(f"step {step}")
    if step in UNPREPARE_STEPS:
        prepared = [c for c in CLAIMS if c.uid in done]
        if not prepared:
            target = rng.choice(CLAIMS)
            await preparer.prepare(target)  # no prepare step pauses at an unprepare step
        else:
            target = rng.choice(prepared)
        await preparer.unprepare(target)
    else:
        free = [c for c in CLAIMS if c.uid not in done]
        if not free:  # every claim prepared: one unprepared whole first
            free = [rng.choice(CLAIMS)]
            preparer.pause_after = None
            await preparer.unprepare(free[0])
            preparer.pause_after = step
        await preparer.prepare(rng.choice(free))
    say("not paused")  # the step was not reached: a bug in the test


PLUGINS: dict[str, BackendPlugin[Any]] = {}


def child(root: Path, step: str, seed: int) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # inherited by every thread

    class Paused(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("cdiplug-test-hook: DRA paused after"):
                say("paused")

    prepare_module.log.addHandler(Paused())
    asyncio.run(run(root, step, seed))


def main() -> None:
    global PLUGINS
    PLUGINS = load_plugins()  # once, in the zygote: finding the entry points is most of a start
    root = Path(sys.argv[1])
    for line in sys.stdin:
        step, seed = line.split()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                child(root, step, 0 if seed == "none" else int(seed))
            except BaseException as exc:  # told to the parent, then the child ends
                say(f"failed {type(exc).__name__}: {exc}")
                code = 1
            os._exit(code)
        say(f"pid {pid}")
        _, status = os.waitpid(pid, 0)
        say(f"exit {status}")


if __name__ == "__main__":
    main()
