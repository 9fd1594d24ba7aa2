"""GPU health: XID events from NVML on a background thread, and recovery through re-probing.

:class:`EventWatcher` owns one NVML event set for the critical-XID events of the GPUs it is given
and waits on it on its own thread (an NVML wait blocks; the event loop never does). Every event
and every failed wait is handed to callbacks the backend gives it; the backend passes them on to
the event loop with ``loop.call_soon_threadsafe``. :meth:`EventWatcher.stop` ends the thread
within one wait timeout and frees the set.

What an event means is :func:`classify`'s call: an XID on a known GPU that is not ignored makes
that GPU Unhealthy at once; application XIDs (by default 13, 31, 43, 45, 68, 109) are ignored;
an event that names no GPU asks for a re-probe of every GPU rather than taking them all down.
:class:`HealthTracker` keeps the state: an unhealthy GPU is Healthy again after N clean probes in
a row (:func:`probe_gpu`: NVML answers for it by UUID and its device node exists).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Collection, Sequence

from attrs import define, field, frozen

from cdiplug.sdk import Backoff, Health, HealthCause, World

from .discovery import Gpu, node_present
from .nvml import Nvml, NvmlError, NvmlEvent

log = logging.getLogger(__name__)

DEFAULT_WAIT_MS = 500
ERROR_BACKOFF_S = 1.0  # the first pause after a failed wait, doubling while it keeps failing
ERROR_BACKOFF_MAX_S = 30.0


class Verdict(enum.Enum):
    IGNORE = "ignore"
    UNHEALTHY = "unhealthy"
    REPROBE = "reprobe"


def classify(event: NvmlEvent, known: Collection[str], ignored_xids: Collection[int]) -> Verdict:
    """What an NVML event means for the GPUs in ``known``."""
    if event.uuid is None:
        return Verdict.REPROBE
    if event.uuid not in known or not event.is_xid:
        return Verdict.IGNORE
    if event.data in ignored_xids:
        return Verdict.IGNORE
    return Verdict.UNHEALTHY


# The causes a GPU is Unhealthy for (DRA taints cdiplug.dev/<name>=<code>, README "Device taints").
PROBE_FAILED = HealthCause("gpu-probe-failed")  # NVML did not answer for it
NODE_MISSING = HealthCause("gpu-node-missing")  # its /dev/nvidiaN is gone
NO_XID_EVENTS = HealthCause("gpu-no-xid-events")  # NVML would not watch its XIDs


def xid_cause(xid: int) -> HealthCause:
    """A critical XID: ``xid=<number>``."""
    return HealthCause("xid", str(xid))


@frozen
class _Bad:
    reason: str
    clean: int = 0
    cause: HealthCause = PROBE_FAILED


@define
class HealthTracker:
    """Health of one resource's GPUs: Healthy unless marked; back after ``clean_needed`` clean probes."""

    clean_needed: int
    _bad: dict[str, _Bad] = field(factory=dict)

    def health(self, uuid: str) -> Health:
        return Health.UNHEALTHY if uuid in self._bad else Health.HEALTHY

    def health_map(self) -> dict[str, Health]:
        return {uuid: Health.UNHEALTHY for uuid in self._bad}

    def causes(self) -> dict[str, HealthCause]:
        """Why each Unhealthy GPU is (DRA taints)."""
        return {uuid: bad.cause for uuid, bad in self._bad.items()}

    def reason(self, uuid: str) -> str | None:
        bad = self._bad.get(uuid)
        return bad.reason if bad else None

    def unhealthy(self) -> list[str]:
        return list(self._bad)

    def mark_unhealthy(self, uuid: str, reason: str, cause: HealthCause = PROBE_FAILED) -> bool:
        """Unhealthy now, clean count restarted; True when it was Healthy."""
        was_healthy = uuid not in self._bad
        self._bad[uuid] = _Bad(reason, cause=cause)
        return was_healthy

    def probe_passed(self, uuid: str) -> bool:
        """One clean probe; True when that made the GPU Healthy again."""
        bad = self._bad.get(uuid)
        if bad is None:
            return False
        if bad.clean + 1 >= self.clean_needed:
            del self._bad[uuid]
            return True
        self._bad[uuid] = _Bad(bad.reason, bad.clean + 1, bad.cause)
        return False

    def probe_failed(self, uuid: str, reason: str, cause: HealthCause = PROBE_FAILED) -> bool:
        """A failed probe: Unhealthy (clean count restarted); True when it was Healthy.

        A GPU already Unhealthy keeps its cause: the XID that took it down says more than the
        probes that keep it down."""
        bad = self._bad.get(uuid)
        return self.mark_unhealthy(uuid, reason, cause if bad is None else bad.cause)


def probe_cause(problem: str) -> HealthCause:
    """The cause of what :func:`probe_gpu` found."""
    return NODE_MISSING if problem.startswith("device node ") else PROBE_FAILED


def probe_gpu(nvml: Nvml, world: World, gpu: Gpu) -> str | None:
    """Why the GPU is not usable right now, or None when it answers. Blocking."""
    try:
        nvml.probe(gpu.uuid)
    except NvmlError as exc:
        return f"NVML: {exc}"
    if not node_present(world, gpu.device_path):
        return f"device node {gpu.device_path} is missing"
    return None


class EventWatcher:
    """Waits for critical-XID events on a thread; hands each to ``on_event`` (on that thread)."""

    def __init__(
        self,
        nvml: Nvml,
        gpus: Sequence[Gpu],
        on_event: Callable[[NvmlEvent], None],
        on_error: Callable[[str], None],
        wait_ms: int = DEFAULT_WAIT_MS,
    ) -> None:
        self.nvml = nvml
        self.gpus = tuple(gpus)
        self.on_event = on_event
        self.on_error = on_error
        self.wait_ms = wait_ms
        self._stop = threading.Event()
        # start() and stop() may run on different worker threads at once (a task cancelled while
        # starting): the lock makes stop() wait for a start in progress, which then sees the flag.
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._event_set: object | None = None

    def start(self) -> dict[str, str]:
        """Create the event set, register every GPU, start the thread. Blocking.

        Returns ``{uuid: why}`` for GPUs whose registration failed (the caller marks them
        Unhealthy); GPUs that cannot report XIDs at all are logged and left to probing.
        Raises NvmlError when no event set can be made.
        """
        with self._lock:
            if self._stop.is_set():
                return {}
            self._event_set = self.nvml.create_event_set()
            failed: dict[str, str] = {}
            for gpu in self.gpus:
                try:
                    if not self.nvml.register_xid_events(gpu.handle, self._event_set):
                        log.warning("GPU %s cannot report XID events; its health comes from probing only", gpu.uuid)
                except NvmlError as exc:
                    failed[gpu.uuid] = f"cannot watch XID events: {exc}"
            self._thread = threading.Thread(target=self._run, name="cdiplug-nvidia-xid-events", daemon=True)
            self._thread.start()
            return failed

    def _run(self) -> None:
        # A wait that keeps failing must not spin; stop() interrupts the pause.
        backoff = Backoff(ERROR_BACKOFF_S, ERROR_BACKOFF_MAX_S)
        while not self._stop.is_set():
            try:
                event = self.nvml.wait(self._event_set, self.wait_ms)
            except NvmlError as exc:
                if self._stop.is_set():
                    break
                self.on_error(str(exc))
                self._stop.wait(next(backoff))
                continue
            except Exception:
                log.exception("the NVML event thread failed unexpectedly")
                self.on_error("the NVML event thread failed unexpectedly")
                self._stop.wait(next(backoff))
                continue
            backoff.reset()
            if event is not None and not self._stop.is_set():
                self.on_event(event)

    def stop(self) -> None:
        """Stop the thread (within one wait timeout) and free the event set. Blocking; idempotent."""
        self._stop.set()
        with self._lock:
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            if self._event_set is not None:
                try:
                    self.nvml.free_event_set(self._event_set)
                except NvmlError as exc:
                    log.warning("freeing the NVML event set failed: %s", exc)
                self._event_set = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
