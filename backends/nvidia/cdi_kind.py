"""Which CDI kind and DRA driver name an NVIDIA resource uses, so they never clash with NVIDIA's own.

The NVIDIA container toolkit writes ``nvidia.com/gpu`` (``nvidia-ctk cdi generate``, also the
kind of its ``all`` device) and ``management.nvidia.com/gpu``; the NVIDIA device plugin writes
``k8s.device-plugin.nvidia.com/gpu``. Two spec files declaring the same device of one kind make a
runtime refuse the kind, so an NVIDIA resource of cdiplug should use ``cdiplug.<resource name>``:
``cdiplug.nvidia.com/gpu`` for ``nvidia.com/gpu``, a valid vendor/class no NVIDIA tool writes.
"""

from __future__ import annotations

NVIDIA_OWNED_KINDS = frozenset(
    {"nvidia.com/gpu", "nvidia.com/mig", "management.nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu"}
)


def default_cdi_kind(resource: str) -> str:
    """``nvidia.com/gpu`` -> ``cdiplug.nvidia.com/gpu``."""
    return f"cdiplug.{resource}"


def clash_problem(kind: str) -> str | None:
    """Why ``kind`` would clash with NVIDIA's own specs, or None."""
    if kind in NVIDIA_OWNED_KINDS:
        return f"CDI kind {kind!r} is written by NVIDIA's own tools; its specs may clash with cdiplug's (use cdi_kind: {default_cdi_kind(kind)})"
    return None


def default_dra_driver(resource: str) -> str:
    """``nvidia.com/gpu`` -> ``gpu.cdiplug.nvidia.com``: never ``gpu.nvidia.com``, NVIDIA's own DRA driver."""
    vendor, _, cls = resource.partition("/")
    return f"{cls.lower()}.cdiplug.{vendor}"
