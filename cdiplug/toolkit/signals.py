"""Signal handlers from the first moments of ``cdiplug serve``, before the event loop takes over.

Python ends a process on SIGHUP by default, and ``cdiplug serve`` spends a few hundred
milliseconds importing grpc, protobuf and the backends before its event loop can install its own
handlers. A SIGHUP in that window (a config-reloader sidecar, an operator) must not end the daemon,
and a SIGTERM there must still mean a clean stop. So :func:`install_early` (called by the command
line before anything slow) installs handlers that only remember which signals came;
``cdiplug.daemon`` replays them once its loop handlers are in place (:func:`take_pending`) and
puts the early handlers back when it is done (:func:`reinstall`), so a signal during the last
moments of a stop is remembered and ignored, never fatal.

Standard library only, imported before anything else of cdiplug's: it must cost nothing.
"""

from __future__ import annotations

import signal
from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_pending: list[int] = []
_installed = False


def _remember(signum: int, _frame: FrameType | None) -> None:
    _pending.append(signum)


def install_early() -> None:
    """Remember SIGTERM, SIGINT and SIGHUP from now on instead of dying of them (main thread only)."""
    global _installed
    for sig in HANDLED:
        signal.signal(sig, _remember)
    _installed = True


def installed() -> bool:
    """Whether :func:`install_early` ran in this process."""
    return _installed


def take_pending() -> list[int]:
    """The signals remembered so far, in order, each once; forgotten here."""
    taken = list(dict.fromkeys(_pending))
    _pending.clear()
    return taken


def reinstall() -> None:
    """Put the early handlers back (after the event loop removed its own), if they were installed."""
    if _installed:
        for sig in HANDLED:
            signal.signal(sig, _remember)
