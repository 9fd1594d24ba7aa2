"""Process-wide counts of events that happen far below the metrics (a state file set aside, a CDI
spec that could not be written), read by :mod:`cdiplug.telemetry.metrics` at scrape time.

The layers put the metrics above the CDI writer and the state files, and those below them
import nothing of it: they count here instead, in a :class:`Tally` per event, and every metrics
registry of the process reads the same counts (counters only ever grow, so a second daemon in one
process sees at least its own). Thread-safe: writers run in ``asyncio.to_thread`` workers.
"""

from __future__ import annotations

import threading


class Tally:
    """A count per label value, only ever growing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, label: str) -> None:
        with self._lock:
            self._counts[label] = self._counts.get(label, 0) + 1

    def counts(self) -> dict[str, int]:
        """A copy of the counts, label value -> count."""
        with self._lock:
            return dict(self._counts)


# label: what the file is ("DRA checkpoint", "state file" for the PCI journal)
STATE_FILES_SET_ASIDE = Tally()
# label: the CDI kind of the spec (a resource's kind, or "claim" for a DRA claim's spec)
CDI_WRITE_FAILURES = Tally()
