"""The NVIDIA backend: GPUs found through NVML, advertised by UUID, with topology and XID health.

Options (``cdiplug_backends.nvidia.options``): ``selectors`` split a node's GPUs into several resources
(model glob, memory range, UUIDs, indices; the first resource that selects a GPU gets it; none:
every GPU), ``fail_on_init_error``, ``driver_root``/``driver_files``, ``ignored_xids``,
``reprobe_interval_s``, ``clean_probes``, ``replica_strategy``, ``mig_profiles``, ``shared`` (DRA: whole GPUs
several claims share by memory, KEP-5075, the share told in ``CDIPLUG_GPU_MEMORY_<index>``).

MIG (:mod:`.mig`): a GPU with MIG mode on is never advertised whole; the MIG devices that exist
on it (cdiplug never creates, destroys or changes them) go to resources with ``mig_profiles``
(one resource per profile, ``nvidia.com/mig-1g.10gb``, as NVIDIA's ``mig.strategy: mixed``; or
``["*"]``), by MIG UUID, each with its parent's device node and its ``/dev/nvidia-caps`` nodes;
under DRA each parent GPU is a counter set its MIG devices consume.

Device ID = the GPU UUID. Each GPU brings ``/dev/nvidia<minor>``; the resource adds the control
nodes found under ``--dev-root`` and sets ``NVIDIA_VISIBLE_DEVICES`` to the allocated UUIDs.

CDI kind: the NVIDIA container toolkit writes ``nvidia.com/gpu`` (``nvidia-ctk cdi generate``),
the NVIDIA device plugin ``k8s.device-plugin.nvidia.com/gpu`` and its DRA driver
``k8s.gpu.nvidia.com/...``. A resource of this backend should use a kind none of them writes:
:func:`~.cdi_kind.default_cdi_kind` gives ``cdiplug.<resource>`` (``cdiplug.nvidia.com/gpu`` for
``nvidia.com/gpu``), and the backend warns when a resource's kind is one the NVIDIA tools own.
"""

from __future__ import annotations

import functools
from typing import Any

from cdiplug.sdk import BackendPlugin

from .backend import NvidiaBackend
from .cdi_kind import NVIDIA_OWNED_KINDS, default_cdi_kind, default_dra_driver
from .options import GpuSelector, NvidiaOptions, ReplicaStrategy


def make_plugin(nvml: Any = None, **backend_options: Any) -> BackendPlugin[NvidiaOptions]:
    """The plugin, with an NVML-like module of your own (``cdiplug_backends.nvidia.testing.FakeNvml``; None: pynvml)."""
    return BackendPlugin(
        name="nvidia",
        options_type=NvidiaOptions,
        create=functools.partial(NvidiaBackend, nvml=nvml, **backend_options),
        default_cdi_kind=default_cdi_kind,
        default_dra_driver=default_dra_driver,
    )


plugin = make_plugin()

__all__ = [
    "NVIDIA_OWNED_KINDS",
    "GpuSelector",
    "NvidiaBackend",
    "NvidiaOptions",
    "ReplicaStrategy",
    "default_cdi_kind",
    "default_dra_driver",
    "make_plugin",
    "plugin",
]
