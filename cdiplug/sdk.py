"""The backend SDK: everything a backend package may use of cdiplug, and nothing else.

Backends (``cdiplug_backends.*`` and anyone's own) import cdiplug only through this module; an
import contract in ``pyproject.toml`` (``lint-imports``) refuses any other. What is here:

- the protocol a backend implements (:class:`Backend`, publishing to a :class:`SnapshotSink`) and
  what its package exports (:class:`BackendPlugin`, under the ``cdiplug.backends`` entry points);
- the optional abilities, small protocols a backend class subclasses so that ``mypy --strict``
  checks its methods: :class:`Preparer`, :class:`Unpreparer`, :class:`ReleasePoller`,
  :class:`PreferredAllocator`, :class:`PairwiseAffinity`, :class:`ClaimConfigurable` (DRA
  per-claim configuration, answering :class:`Configured`), :class:`NodeChecker` (what the
  backend needs of the node, for ``cdiplug doctor``, as :class:`Finding` values);
- the options protocols its options class may subclass: :class:`CheckedOptions` (``problems()``)
  and :class:`SizedOptions` (``device_estimate()``); options are structured by :data:`converter`
  (unknown keys forbidden), enums registered with :func:`register_enum`;
- the values it reports (:class:`DeviceSnapshot` of :class:`Device`, with :class:`ContainerEdits`,
  :class:`DeviceNode`, :class:`Mount`, :class:`Health`, attributes; and for DRA how devices are
  shared: :class:`DeviceSharing` with :class:`RequestPolicy` for a shared device,
  :class:`CounterConsumption` for a partition, :class:`PoolSharing` with the :class:`CounterSet`
  its partitions consume), the configuration it is given
  (:class:`ResourceConfig`), the world passed in (:class:`World`) and the errors it raises;
- toolkit helpers: bounded file reads, bounded YAML/JSON, atomic writes, state files
  (:mod:`~cdiplug.toolkit.statefile`: the ``.corrupt-<time>`` convention), lock files with a
  deadline (:mod:`~cdiplug.toolkit.filelock`), a folder watch, a backoff, names, a udev event watch
  (:class:`UdevWatch`, :func:`open_monitor`; :class:`FakeUdevMonitor` for tests).

Fakes for testing a backend ship with the backend they fake (``cdiplug_backends.nvidia.testing``,
``cdiplug_backends.pci.testing``); the core's stand-ins (kubelet, API server) are ``cdiplug.testing``.
"""

from __future__ import annotations

from cdiplug.backend import (
    Backend,
    BackendPlugin,
    CheckedOptions,
    ClaimConfigurable,
    Configured,
    ModelLabels,
    PairwiseAffinity,
    PreferredAllocator,
    Preparer,
    ReleasePoller,
    SizedOptions,
    SnapshotSink,
    Unpreparer,
    run_tasks,
)
from cdiplug.errors import (
    BackendError,
    BackendInitError,
    CdiplugError,
    DeviceInUse,
    InputError,
    InvalidRequest,
    NoSuchDevice,
    PreparationError,
)
from cdiplug.models.checks import Finding, NodeChecker, Verdict
from cdiplug.models.devices import (
    MAX_NUMA_NODE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    AttributeValue,
    ContainerEdits,
    Device,
    DeviceNode,
    DeviceSnapshot,
    Health,
    HealthCause,
    Mount,
    PreferredRequest,
    Version,
)
from cdiplug.models.names import resource_class
from cdiplug.models.replicas import underlying
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.sharing import CounterConsumption, CounterSet, DeviceSharing, PoolSharing, RequestPolicy
from cdiplug.models.world import World
from cdiplug.toolkit import filelock, statefile
from cdiplug.toolkit.atomic import TEMP_SUFFIX, fsync_dir, write_atomic
from cdiplug.toolkit.backoff import Backoff
from cdiplug.toolkit.brief import brief
from cdiplug.toolkit.files import CONFIG_LIMIT, STATE_LIMIT, decode_text, read_bounded, read_text
from cdiplug.toolkit.filewatch import FOLDER, FolderWatch
from cdiplug.toolkit.safeload import load_json, load_yaml
from cdiplug.toolkit.strict import converter, register_enum
from cdiplug.toolkit.udev import FakeUdevMonitor, UdevEvent, UdevMonitor, UdevWatch, close_monitor, open_monitor

__all__ = [
    # the backend and its plugin
    "Backend",
    "BackendPlugin",
    "SnapshotSink",
    "run_tasks",
    # optional abilities (a backend class subclasses those it has)
    "ClaimConfigurable",
    "Configured",
    "ModelLabels",
    "NodeChecker",
    "PairwiseAffinity",
    "PreferredAllocator",
    "Preparer",
    "ReleasePoller",
    "Unpreparer",
    # options
    "CheckedOptions",
    "SizedOptions",
    "converter",
    "register_enum",
    # what a NodeChecker reports (cdiplug doctor)
    "Finding",
    "Verdict",
    # values, configuration, the world
    "MAX_NUMA_NODE",
    "PCI_BUS_ID_ATTRIBUTE",
    "PCIE_ROOT_ATTRIBUTE",
    "AttributeValue",
    "ContainerEdits",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "DeviceNode",
    "DeviceSharing",
    "DeviceSnapshot",
    "Health",
    "HealthCause",
    "Mount",
    "PoolSharing",
    "PreferredRequest",
    "RequestPolicy",
    "ResourceConfig",
    "Version",
    "World",
    # errors
    "BackendError",
    "BackendInitError",
    "CdiplugError",
    "DeviceInUse",
    "InputError",
    "InvalidRequest",
    "NoSuchDevice",
    "PreparationError",
    # toolkit
    "CONFIG_LIMIT",
    "FOLDER",
    "STATE_LIMIT",
    "TEMP_SUFFIX",
    "Backoff",
    "FakeUdevMonitor",
    "FolderWatch",
    "UdevEvent",
    "UdevMonitor",
    "UdevWatch",
    "close_monitor",
    "open_monitor",
    "brief",
    "decode_text",
    "filelock",
    "fsync_dir",
    "load_json",
    "load_yaml",
    "read_bounded",
    "read_text",
    "resource_class",
    "statefile",
    "underlying",
    "write_atomic",
]
