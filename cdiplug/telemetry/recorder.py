"""What the core reports about itself: the :class:`Recorder` protocol and a recorder that drops it all.

The host and the front ends report events here (registrations, Allocates, DRA prepares and
unprepares, claims prepared now, slice publishes, health messages, device counts, backend restarts); :class:`cdiplug.telemetry.metrics.Metrics` turns them into Prometheus figures and ``/readyz``. The
protocol sits at the bottom of the layers so that nothing below the command line imports
prometheus_client: it is loaded only when metrics are served.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol


class Recorder(Protocol):
    """Events of the running daemon, per resource where one applies."""

    def configure(self, resources: Iterable[str]) -> None: ...

    def forget(self, resource: str) -> None: ...

    def registered(self, resource: str, again: bool) -> None: ...

    def set_ready(self, resource: str, ready: bool) -> None: ...

    def allocate_observed(self, resource: str, seconds: float, ok: bool) -> None: ...

    def prepare_observed(self, resource: str, driver: str, seconds: float, ok: bool) -> None:
        """One claim's NodePrepareResources by DRA driver ``driver`` (serving ``resource``)."""
        ...

    def unprepare_observed(self, resource: str, driver: str, seconds: float, ok: bool) -> None:
        """One claim's NodeUnprepareResources by DRA driver ``driver`` (serving ``resource``)."""
        ...

    def claims_prepared(self, resource: str, driver: str, count: int) -> None:
        """DRA driver ``driver`` holds ``count`` claims prepared (completed in its checkpoint) now."""
        ...

    def slices_published(self, resource: str, driver: str, ok: bool) -> None:
        """One publish of DRA driver ``driver``'s ResourceSlices (the pool written) or a failed call."""
        ...

    def health_sent(self, resource: str, driver: str) -> None:
        """One health message (the whole pool's health) sent to a kubelet by DRA driver ``driver``."""
        ...

    def devices(self, resource: str, healthy: int, unhealthy: int, causes: Mapping[str, int] | None = None) -> None:
        """The devices advertised now; ``causes``: the Unhealthy ones per cause name."""
        ...

    def preparation_failed(self, resource: str) -> None: ...

    def kubelet_restart(self) -> None: ...

    def backend_started(self, backend: str) -> None:
        """Backend ``backend`` runs (its restart count starts at 0)."""
        ...

    def backend_restarted(self, backend: str) -> None: ...

    def backend_down(self, resource: str, down: bool) -> None: ...


class NullRecorder:
    """Records nothing (tests, embedding, a daemon serving no metrics)."""

    def configure(self, resources: Iterable[str]) -> None:
        pass

    def forget(self, resource: str) -> None:
        pass

    def registered(self, resource: str, again: bool) -> None:
        pass

    def set_ready(self, resource: str, ready: bool) -> None:
        pass

    def allocate_observed(self, resource: str, seconds: float, ok: bool) -> None:
        pass

    def prepare_observed(self, resource: str, driver: str, seconds: float, ok: bool) -> None:
        pass

    def unprepare_observed(self, resource: str, driver: str, seconds: float, ok: bool) -> None:
        pass

    def claims_prepared(self, resource: str, driver: str, count: int) -> None:
        pass

    def slices_published(self, resource: str, driver: str, ok: bool) -> None:
        pass

    def health_sent(self, resource: str, driver: str) -> None:
        pass

    def devices(self, resource: str, healthy: int, unhealthy: int, causes: Mapping[str, int] | None = None) -> None:
        pass

    def preparation_failed(self, resource: str) -> None:
        pass

    def kubelet_restart(self) -> None:
        pass

    def backend_started(self, backend: str) -> None:
        pass

    def backend_restarted(self, backend: str) -> None:
        pass

    def backend_down(self, resource: str, down: bool) -> None:
        pass


NULL_RECORDER: Recorder = NullRecorder()
