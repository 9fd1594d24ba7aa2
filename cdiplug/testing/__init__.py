"""Fakes and stand-ins for testing cdiplug and backends built on it.

- :class:`KubeletStandIn` (``cdiplug.testing.kubelet``): a real gRPC Registration server on a unix
  socket that dials plugins, holds ListAndWatch, picks devices as the kubelet does and allocates.
- :class:`SysfsTree` (``cdiplug.testing.sysfs``): builds fake sysfs trees of PCI functions.
- :class:`FakeNvml` (``cdiplug.testing.nvml``): an NVML stand-in with topology and XID events.
- :class:`RecordingSink` and ``running`` (``cdiplug.testing.sink``): run a backend under test and
  await what it reports.
- :func:`running_daemon` (``cdiplug.testing.daemon``): the daemon of ``cdiplug serve`` in the
  caller's event loop until a block ends.

Names are imported on first use, so using one fake does not import the others' dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KubeletStandIn": "kubelet",
    "SysfsTree": "sysfs",
    "FakeNvml": "nvml",
    "RecordingSink": "sink",
    "PodResourcesStandIn": "pod_resources",
    "running_daemon": "daemon",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
