"""The backend host: what every front end stands on.

- :mod:`.backends`: :class:`BackendHost` creates, runs, restarts and reloads backends and fans
  their snapshots out to the front end serving each resource.
- :mod:`.preparations`: :class:`Preparations`, serialized, idempotent preparation and release.
- :mod:`.specs`: :class:`SpecKeeper`, the one owner of each per-resource CDI spec file.

Front ends (:mod:`cdiplug.deviceplugin`, :mod:`cdiplug.dra`) import from here; the host never
imports them.
"""

from __future__ import annotations

from cdiplug.host.backends import BackendHost, SnapshotListener, group_by_backend
from cdiplug.host.preparations import Preparations
from cdiplug.host.specs import SpecKeeper, SpecKeepers

__all__ = ["BackendHost", "Preparations", "SnapshotListener", "SpecKeeper", "SpecKeepers", "group_by_backend"]
