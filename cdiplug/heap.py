"""The daemon process's heap: the garbage collector and glibc's malloc around start-up.

Start-up (imports, classes, the configuration, the first snapshots) makes objects that live as
long as the daemon, and a little cyclic garbage (attrs replaces each class it makes slotted). The
collector's passes over that growing heap cost ``cdiplug serve`` more than 10 ms before the
kubelet hears from it, and find almost nothing. So :func:`pause` turns the collector off first
thing, and :func:`settle`, once every resource is registered and listed, does one full pass, moves the
survivors out of the collector's sight for good (``gc.freeze``), turns it back on and gives
malloc's free pages back to the system. :func:`one_malloc_arena` keeps grpc's threads and
``asyncio.to_thread``'s workers from holding pages in arenas of their own.

The boundary: only ``cdiplug serve``'s own process calls these (``cdiplug.__main__``,
``cdiplug.cli.serve``, ``cdiplug.daemon``); a program embedding the daemon keeps its collector
as it set it (:func:`settle` turns it on only when :func:`pause` turned it off).
"""

from __future__ import annotations

import gc
from typing import Any

M_ARENA_MAX = -8  # glibc's mallopt parameter

_paused = False


def pause() -> None:
    """Turn the garbage collector off until :func:`settle` (when it is on)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def paused() -> bool:
    return _paused


def settle() -> int:
    """One full collection, then freeze what survived and turn the collector on again if
    :func:`pause` turned it off; free heap pages go back to the system. The objects collected."""
    global _paused
    found = gc.collect()
    # What is left lives as long as the daemon: keep it out of the collector's full passes,
    # which would otherwise walk all of it again and again while Allocates wait.
    gc.freeze()
    if _paused:
        gc.enable()
        _paused = False
    _malloc_trim()
    return found


def one_malloc_arena() -> None:
    """One malloc arena for the whole process (glibc; elsewhere nothing happens).

    glibc gives threads arenas of their own: grpc's and ``asyncio.to_thread``'s workers (which
    build CDI specs) would each keep pages of their own arena resident, megabytes in all, for a
    daemon that runs Python in one thread at a time anyway. Called before the daemon starts
    any thread.
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, 1)


def _malloc_trim() -> None:
    # Start-up's passing allocations (YAML parsing, CDI specs, grpc's set-up) leave free chunks
    # inside the heap; malloc_trim hands their whole pages back (glibc only).
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _libc() -> Any:
    import ctypes  # loaded already by the folder watches; only ever asked for here

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc has both; musl has neither)
    except (AttributeError, OSError):
        return None
    return libc
