"""Fakes and stand-ins for testing cdiplug and backends built on it.

- :class:`KubeletStandIn` (``cdiplug.testing.kubelet``): a real gRPC Registration server on a unix
  socket that dials plugins, holds ListAndWatch, picks devices as the kubelet does and allocates.
- :class:`DraKubeletStandIn` (``cdiplug.testing.dra_kubelet``): the kubelet's plugin watcher and
  DRA calls: registers DRA drivers, calls NodePrepareResources / NodeUnprepareResources.
- :class:`ApiServerStandIn` (``cdiplug.testing.apiserver``): an HTTP API server on 127.0.0.1 for
  ResourceSlices (list, watch, create, update, delete), ResourceClaims and Nodes.
- :class:`RecordingSink` and ``running`` (``cdiplug.testing.sink``): run a backend under test and
  await what it reports.
- :func:`running_daemon` and :func:`started_daemon` (``cdiplug.testing.daemon``): the daemon of
  ``cdiplug serve`` in the caller's event loop until a block ends.
- :func:`daemon_process` (``cdiplug.testing.process``): a real ``python -m cdiplug serve`` process
  with its JSON log read as it comes.
- :class:`ClaimsAtSeam`, :class:`RecordingBackend` and :func:`hosted_backend`
  (``cdiplug.testing.dra_claims``): DRA claim preparation without an API server: the claims at the
  client seam, a backend recording what it is asked to prepare, and a real host running it.
- :func:`eventually` (``cdiplug.testing.poll``): poll, with a bound, what has no event to await.

Names are imported on first use, so using one fake does not import the others' dependencies.
Fakes of what one backend talks to ship with that backend: ``cdiplug_backends.pci.testing``
(``SysfsTree``, ``FakeSysfsKernel``) and ``cdiplug_backends.nvidia.testing`` (``FakeNvml``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KubeletStandIn": "kubelet",
    "DraKubeletStandIn": "dra_kubelet",
    "ApiServerStandIn": "apiserver",
    "RecordingSink": "sink",
    "PodResourcesStandIn": "pod_resources",
    "running_daemon": "daemon",
    "started_daemon": "daemon",
    "daemon_process": "process",
    "eventually": "poll",
    "ClaimsAtSeam": "dra_claims",
    "RecordingBackend": "dra_claims",
    "hosted_backend": "dra_claims",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
