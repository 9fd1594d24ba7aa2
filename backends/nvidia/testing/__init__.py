"""Fakes for testing code on the NVIDIA backend without a GPU: :class:`FakeNvml` and its machines.

- :class:`FakeNvml` (``.nvml``): a stand-in for the ``pynvml`` module (NVML's calls, constants and
  error codes), with topology, NVLink and scriptable XID events; pass it as
  ``cdiplug_backends.nvidia.make_plugin(nvml=FakeNvml.nvlink_pairs())``.
  The module ``.nvml`` itself also answers as pynvml does (its constants under pynvml's names).
- MIG devices that already exist (:class:`FakeMig` on a ``FakeGpu`` with MIG mode on, answered
  by ``.mig``, with their ``/dev/nvidia-caps`` files);
- :class:`FakeGpu` and :class:`Machine` (``.machines``): the made-up hardware it answers about,
  with the fixtures ``nvswitch8``, ``nvlink_pairs`` and ``pcie_box``.
- :class:`NVMLError` and the value shapes (``.values``).
"""

from __future__ import annotations

from .machines import FakeGpu, FakeMig, Machine, nvlink_pairs, nvswitch8, pcie_box
from .nvml import FakeNvml
from .values import NVMLError

__all__ = ["FakeGpu", "FakeMig", "FakeNvml", "Machine", "NVMLError", "nvlink_pairs", "nvswitch8", "pcie_box"]
