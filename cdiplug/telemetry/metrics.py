"""Metrics and health: Prometheus counters the daemon updates, and the HTTP endpoints that show them.

:class:`Metrics` always exists in the daemon; the HTTP server runs only when ``--metrics-address``
is given (``async with metrics.serve("0.0.0.0:9100") as server``). It serves

- ``/metrics``: the Prometheus exposition of this object's own registry (never the global one, so
  two daemons in one test process do not collide),
- ``/healthz``: 200 when the asyncio event loop answers within ``health_timeout`` seconds. The HTTP
  server runs in a thread of its own so that it can tell a stuck loop from a live one; it asks the
  loop with ``run_coroutine_threadsafe`` and waits with a deadline,
- ``/readyz``: 200 when every configured resource (:meth:`Metrics.configure`) is registered with the
  kubelet, else 503 listing those that are not.

The HTTP server itself, with its bounds on connections, time and header size, is
``cdiplug.telemetry.http``. The boundary: this module counts; the daemon decides when something
happened. The
recording methods are called from the event loop on hot paths (Allocate), so each resource's label
children are looked up once and cached.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from attrs import frozen
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from cdiplug.errors import ConfigError
from cdiplug.telemetry.http import MetricsServer, MetricsServerError
from cdiplug.telemetry.tallies import register_tallies

__all__ = ["Metrics", "MetricsAddressError", "MetricsServer", "MetricsServerError", "parse_address"]

log = logging.getLogger(__name__)

# Allocate is milliseconds for the fake backend and up to seconds when a device is bound to
# vfio-pci first (a driver unbind can take a second or more), so the buckets span both.
ALLOCATE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DEFAULT_HEALTH_TIMEOUT = 2.0


class MetricsAddressError(ConfigError):
    """``--metrics-address`` is not ``HOST:PORT``. A usage error: the CLI exits with status 2."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(reason, "--metrics-address")
        self.args = (f"--metrics-address {address!r}: {reason}",)


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``. ``[::1]:9100`` for IPv6; an empty host means all IPv4
    interfaces; port 0 picks a free port."""
    host, sep, port_text = address.rpartition(":")
    if not sep:
        raise MetricsAddressError(address, "expected HOST:PORT, as in 0.0.0.0:9100 or [::1]:9100")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise MetricsAddressError(address, f"{host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise MetricsAddressError(address, "write an IPv6 host in brackets, as in [::1]:9100")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise MetricsAddressError(address, f"port {port_text!r} is not a number from 0 to 65535")
    return host or "0.0.0.0", int(port_text)


@frozen
class _Children:
    """One resource's label children, looked up once (``labels()`` takes a lock and builds a key)."""

    registered: Any
    reregistered: Any
    allocate_ok: Any
    allocate_failed: Any
    allocate_seconds: Any
    healthy: Any
    unhealthy: Any
    preparation_failed: Any
    ready: Any


@frozen
class _ClaimChildren:
    """One DRA driver's label children."""

    prepare_ok: Any
    prepare_failed: Any
    prepare_seconds: Any
    unprepare_ok: Any
    unprepare_failed: Any
    unprepare_seconds: Any
    claims_prepared: Any
    publish_ok: Any
    publish_failed: Any
    health_sent: Any


class Metrics:
    """The daemon's counters and readiness, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None, *, health_timeout: float = DEFAULT_HEALTH_TIMEOUT) -> None:
        if registry is None:
            registry = CollectorRegistry(auto_describe=True)
            # RSS, CPU and open files of the daemon, read from /proc at scrape time: what the
            # DaemonSet's memory limit is sized against.
            ProcessCollector(registry=registry)
        self.registry = registry
        self.health_timeout = health_timeout
        r = self.registry
        self._registrations = Counter(
            "cdiplug_registrations",
            "Registrations with the kubelet, per resource (the first one per socket).",
            ["resource"],
            registry=r,
        )
        self._reregistrations = Counter(
            "cdiplug_reregistrations",
            "Registrations after the first one, per resource (after a kubelet restart, say).",
            ["resource"],
            registry=r,
        )
        self._allocations = Counter(
            "cdiplug_allocations", "Allocate calls answered, per resource and result.", ["resource", "result"], registry=r
        )
        self._allocate_seconds = Histogram(
            "cdiplug_allocate_duration_seconds",
            "Time to answer an Allocate call, per resource.",
            ["resource"],
            buckets=ALLOCATE_BUCKETS,
            registry=r,
        )
        self._claim_calls = Counter(
            "cdiplug_dra_claim_operations",
            "DRA claims prepared (NodePrepareResources) and unprepared (NodeUnprepareResources), per driver, "
            "operation and result: one per claim, apart from Allocate calls.",
            ["driver", "operation", "result"],
            registry=r,
        )
        self._claim_seconds = Histogram(
            "cdiplug_dra_claim_operation_duration_seconds",
            "Time to prepare or unprepare one DRA claim, per driver and operation.",
            ["driver", "operation"],
            buckets=ALLOCATE_BUCKETS,
            registry=r,
        )
        self._claims_prepared = Gauge(
            "cdiplug_dra_claims_prepared",
            "DRA claims prepared now (completed in the checkpoint), per driver.",
            ["driver"],
            registry=r,
        )
        self._slice_publishes = Counter(
            "cdiplug_dra_slice_publishes",
            "ResourceSlice publishes per driver and result: ok is one write of the pool (a new generation), "
            "error one failed API call that is retried with backoff.",
            ["driver", "result"],
            registry=r,
        )
        self._health_messages = Counter(
            "cdiplug_dra_health_messages",
            "DRA health messages (the whole pool's health, NodeWatchResourcesResponse) sent to the kubelet, per driver.",
            ["driver"],
            registry=r,
        )
        self._devices = Gauge(
            "cdiplug_devices", "Devices advertised, per resource and health.", ["resource", "health"], registry=r
        )
        self._unhealthy_causes = Gauge(
            "cdiplug_unhealthy_devices",
            "Unhealthy devices per resource and cause (the backend's cause name: xid, link-down; unhealthy "
            "when it named none); a cause seen once stays, at 0 once no device has it.",
            ["resource", "cause"],
            registry=r,
        )
        self._preparation_failures = Counter(
            "cdiplug_preparation_failures",
            "Device preparations that failed (binding to vfio-pci, say), per resource.",
            ["resource"],
            registry=r,
        )
        self._kubelet_restarts = Counter("cdiplug_kubelet_restarts", "Kubelet restarts seen (its socket re-created).", registry=r)
        self._backend_restarts = Counter(
            "cdiplug_backend_restarts", "Backends restarted after they failed, per backend.", ["backend"], registry=r
        )
        self._backend_down = Gauge(
            "cdiplug_resource_backend_down",
            "1 while the resource's backend is down (restarting), else 0.",
            ["resource"],
            registry=r,
        )
        self._ready = Gauge(
            "cdiplug_resource_ready", "1 when the resource is registered with the kubelet, else 0.", ["resource"], registry=r
        )
        register_tallies(r)
        self._children: dict[str, _Children] = {}
        # driver -> its label children; resource -> the drivers it was served as (forget() drops them)
        self._claim_children: dict[str, _ClaimChildren] = {}
        self._drivers_of: dict[str, set[str]] = {}
        self._causes_of: dict[str, set[str]] = {}  # resource -> the causes it has had a series for
        # Read by the HTTP thread, written by the loop: replaced whole under the lock.
        self._lock = threading.Lock()
        self._configured: frozenset[str] | None = None
        self._ready_set: frozenset[str] = frozenset()
        self._down_set: frozenset[str] = frozenset()

    def _of(self, resource: str) -> _Children:
        children = self._children.get(resource)
        if children is None:
            children = self._children[resource] = _Children(
                registered=self._registrations.labels(resource),
                reregistered=self._reregistrations.labels(resource),
                allocate_ok=self._allocations.labels(resource, "ok"),
                allocate_failed=self._allocations.labels(resource, "error"),
                allocate_seconds=self._allocate_seconds.labels(resource),
                healthy=self._devices.labels(resource, "healthy"),
                unhealthy=self._devices.labels(resource, "unhealthy"),
                preparation_failed=self._preparation_failures.labels(resource),
                ready=self._ready.labels(resource),
            )
            self._backend_down.labels(resource)  # 0 until its backend goes down
        return children

    # -- recording (called from the event loop) --------------------------------------------------

    def registered(self, resource: str, again: bool) -> None:
        """``resource`` was registered with the kubelet (``again``: not the first time). Marks it ready."""
        children = self._of(resource)
        (children.reregistered if again else children.registered).inc()
        self.set_ready(resource, True)

    def allocate_observed(self, resource: str, seconds: float, ok: bool) -> None:
        children = self._of(resource)
        (children.allocate_ok if ok else children.allocate_failed).inc()
        children.allocate_seconds.observe(seconds)

    def _claims_of(self, resource: str, driver: str) -> _ClaimChildren:
        children = self._claim_children.get(driver)
        if children is None:
            calls, seconds = self._claim_calls, self._claim_seconds
            children = self._claim_children[driver] = _ClaimChildren(
                prepare_ok=calls.labels(driver, "prepare", "ok"),
                prepare_failed=calls.labels(driver, "prepare", "error"),
                prepare_seconds=seconds.labels(driver, "prepare"),
                unprepare_ok=calls.labels(driver, "unprepare", "ok"),
                unprepare_failed=calls.labels(driver, "unprepare", "error"),
                unprepare_seconds=seconds.labels(driver, "unprepare"),
                claims_prepared=self._claims_prepared.labels(driver),
                publish_ok=self._slice_publishes.labels(driver, "ok"),
                publish_failed=self._slice_publishes.labels(driver, "error"),
                health_sent=self._health_messages.labels(driver),
            )
            self._drivers_of.setdefault(resource, set()).add(driver)
        return children

    def prepare_observed(self, resource: str, driver: str, seconds: float, ok: bool) -> None:
        children = self._claims_of(resource, driver)
        (children.prepare_ok if ok else children.prepare_failed).inc()
        children.prepare_seconds.observe(seconds)

    def unprepare_observed(self, resource: str, driver: str, seconds: float, ok: bool) -> None:
        children = self._claims_of(resource, driver)
        (children.unprepare_ok if ok else children.unprepare_failed).inc()
        children.unprepare_seconds.observe(seconds)

    def claims_prepared(self, resource: str, driver: str, count: int) -> None:
        self._claims_of(resource, driver).claims_prepared.set(count)

    def slices_published(self, resource: str, driver: str, ok: bool) -> None:
        children = self._claims_of(resource, driver)
        (children.publish_ok if ok else children.publish_failed).inc()

    def health_sent(self, resource: str, driver: str) -> None:
        self._claims_of(resource, driver).health_sent.inc()

    def devices(self, resource: str, healthy: int, unhealthy: int, causes: Mapping[str, int] | None = None) -> None:
        children = self._of(resource)
        children.healthy.set(healthy)
        children.unhealthy.set(unhealthy)
        if causes is None:
            return
        seen = self._causes_of.setdefault(resource, set())
        seen.update(causes)
        for cause in seen:
            self._unhealthy_causes.labels(resource, cause).set(causes.get(cause, 0))

    def preparation_failed(self, resource: str) -> None:
        self._of(resource).preparation_failed.inc()

    def kubelet_restart(self) -> None:
        self._kubelet_restarts.inc()

    def backend_started(self, backend: str) -> None:
        self._backend_restarts.labels(backend)  # the series, at 0 until a restart

    def backend_restarted(self, backend: str) -> None:
        self._backend_restarts.labels(backend).inc()

    def backend_down(self, resource: str, down: bool) -> None:
        """Mark ``resource``'s backend down (restarting) or back; ``/readyz`` names it while down."""
        self._backend_down.labels(resource).set(1 if down else 0)
        with self._lock:
            self._down_set = self._down_set | {resource} if down else self._down_set - {resource}

    def set_ready(self, resource: str, ready: bool) -> None:
        """Mark ``resource`` registered (or not: the kubelet restarted, its server stopped)."""
        self._of(resource).ready.set(1 if ready else 0)
        with self._lock:
            self._ready_set = self._ready_set | {resource} if ready else self._ready_set - {resource}

    def forget(self, resource: str) -> None:
        """Drop every series of ``resource`` (it left the configuration) and its readiness."""
        for driver in self._drivers_of.pop(resource, ()):
            self._claim_children.pop(driver, None)
            for op in ("prepare", "unprepare"):
                for result in ("ok", "error"):
                    try:
                        self._claim_calls.remove(driver, op, result)
                    except KeyError:
                        pass
                try:
                    self._claim_seconds.remove(driver, op)
                except KeyError:
                    pass
            for series, series_labels in (
                (self._claims_prepared, [(driver,)]),
                (self._slice_publishes, [(driver, "ok"), (driver, "error")]),
                (self._health_messages, [(driver,)]),
            ):
                for driver_labels in series_labels:
                    try:
                        series.remove(*driver_labels)
                    except KeyError:
                        pass
        for cause in self._causes_of.pop(resource, ()):
            try:
                self._unhealthy_causes.remove(resource, cause)
            except KeyError:
                pass
        if self._children.pop(resource, None) is None:
            return
        for metric, label_sets in (
            (self._registrations, [(resource,)]),
            (self._reregistrations, [(resource,)]),
            (self._allocations, [(resource, "ok"), (resource, "error")]),
            (self._allocate_seconds, [(resource,)]),
            (self._devices, [(resource, "healthy"), (resource, "unhealthy")]),
            (self._preparation_failures, [(resource,)]),
            (self._ready, [(resource,)]),
            (self._backend_down, [(resource,)]),
        ):
            for labels in label_sets:
                try:
                    metric.remove(*labels)
                except KeyError:
                    pass
        with self._lock:
            self._ready_set = self._ready_set - {resource}
            self._down_set = self._down_set - {resource}

    def configure(self, resources: Iterable[str]) -> None:
        """The resources that must all be registered for ``/readyz`` to answer 200."""
        with self._lock:
            self._configured = frozenset(resources)

    # -- readiness -------------------------------------------------------------------------------

    def not_ready(self) -> list[str] | None:
        """The configured resources not registered yet (sorted), or None before :meth:`configure`."""
        with self._lock:
            configured, ready = self._configured, self._ready_set
        return None if configured is None else sorted(configured - ready)

    def backends_down(self) -> list[str]:
        """The configured resources whose backend is down (sorted)."""
        with self._lock:
            return sorted(self._down_set & (self._configured or frozenset()))

    def ready(self) -> bool:
        """Every configured resource is registered and its backend up (False before :meth:`configure`)."""
        return self.not_ready() == [] and not self.backends_down()

    # -- serving ---------------------------------------------------------------------------------

    def serve(self, address: str) -> MetricsServer:
        """The HTTP server for ``address`` (``HOST:PORT``), as an async context manager.

        ``async with metrics.serve(addr) as server:`` (``await metrics.serve(addr)`` gives the same
        object); ``server.port`` is the bound port (useful with port 0). The address is checked
        here, so a bad one fails before anything starts.
        """
        host, port = parse_address(address)
        return MetricsServer(self, host, port)
