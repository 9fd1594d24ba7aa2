"""The fake backend: N made-up devices per resource, for demos, tests and trying cdiplug out.

Options (``docs/architecture.md``): ``count``, ``numa_nodes`` (devices spread round-robin; none: no topology),
``health_file``, a YAML/JSON map of device ID to ``Healthy``/``Unhealthy`` re-read whenever it
changes (missing IDs are Healthy; a cause may follow, ``Unhealthy thermal=85C``, which DRA
publishes as the taint ``cdiplug.dev/thermal=85C``), and ``attributes``, typed attributes per device ID
(``{fpga-1: {speed: 9}}``: string, int or bool) that DRA publishes in the driver's domain, and
``prepared_dir``, a folder where each prepared device gets a marker file named by its ID until it is
released (a preparation tests can see; none by default). Device IDs are the resource's class and an index: ``fpga-0``.
For DRA, ``shared`` with ``capacity`` (devices several claims share, each consuming part of a
capacity) and ``partitions`` (a MIG-like model: the whole device, halves, quarters, consuming
the device's counter set): :mod:`.shapes`.

A fake device has no device files; each carries one env var, ``FAKE_<CLASS>_DEVICE_<N>=<id>``,
and an Allocate answer carries ``FAKE_<CLASS>_DEVICES`` with the comma-joined allocated IDs
(``FAKE_FPGA_DEVICES=fpga-0,fpga-1`` for ``example.com/fpga``).
"""

from __future__ import annotations

from cdiplug.sdk import BackendPlugin

from .backend import FakeBackend, FakeOptions, create

plugin = BackendPlugin(name="fake", options_type=FakeOptions, create=create)

__all__ = ["FakeBackend", "FakeOptions", "plugin"]
