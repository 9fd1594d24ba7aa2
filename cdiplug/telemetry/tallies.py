"""The process-wide tallies of :mod:`cdiplug.toolkit.tally` as Prometheus counters, read at scrape time."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from cdiplug.toolkit.tally import CDI_WRITE_FAILURES, STATE_FILES_SET_ASIDE, Tally

FAMILIES = (
    (
        "cdiplug_state_files_set_aside",
        "State files found unreadable and moved aside (<name>.corrupt-<time>), per file: the DRA checkpoint, "
        "the PCI journal's state files.",
        "file",
        STATE_FILES_SET_ASIDE,
    ),
    (
        "cdiplug_cdi_spec_write_failures",
        "CDI spec files that could not be written, per CDI kind (claim: a DRA claim's spec).",
        "kind",
        CDI_WRITE_FAILURES,
    ),
)


class _TallyCollector(Collector):
    def __init__(self, families: Iterable[tuple[str, str, str, Tally]]) -> None:
        self._families = tuple(families)

    def collect(self) -> Iterable[CounterMetricFamily]:
        for name, documentation, label, tally in self._families:
            family = CounterMetricFamily(name, documentation, labels=[label])
            for value, count in sorted(tally.counts().items()):
                family.add_metric([value], count)
            yield family


def register_tallies(registry: CollectorRegistry) -> None:
    """Expose every tally in ``registry``."""
    registry.register(_TallyCollector(FAMILIES))
