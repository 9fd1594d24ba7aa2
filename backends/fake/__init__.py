"""The fake backend: N made-up devices per resource, for demos, tests and trying cdiplug out.

Options (DESIGN.md): ``count``, ``numa_nodes`` (devices spread round-robin; none: no topology),
``health_file``, a YAML/JSON map of device ID to ``Healthy``/``Unhealthy`` re-read whenever it
changes (missing IDs are Healthy), and ``attributes``, typed attributes per device ID
(``{fpga-1: {speed: 9}}``: string, int or bool) that DRA publishes in the driver's domain. Device IDs are the resource's class and an index: ``fpga-0``.

A fake device has no device files; each carries one env var, ``FAKE_<CLASS>_DEVICE_<N>=<id>``,
and an Allocate answer carries ``FAKE_<CLASS>_DEVICES`` with the comma-joined allocated IDs
(``FAKE_FPGA_DEVICES=fpga-0,fpga-1`` for ``example.com/fpga``).
"""

from __future__ import annotations

from cdiplug.backend import BackendPlugin

from .backend import FakeBackend, FakeOptions

plugin = BackendPlugin(name="fake", options_type=FakeOptions, create=FakeBackend)

__all__ = ["FakeBackend", "FakeOptions", "plugin"]
