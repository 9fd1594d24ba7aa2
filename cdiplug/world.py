"""The world the daemon runs against: folders and handles passed in, never globals.

Tests and users testing their own backends build a :class:`World` of temporary folders and fakes
(a sysfs tree from ``cdiplug.testing``, a fake NVML); production builds it from the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import field, frozen

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
DEFAULT_STATE_DIR = Path("/var/lib/cdiplug")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@frozen
class World:
    """Folders and handles of the node.

    ``nvml`` is an NVML-like module (``pynvml`` or ``cdiplug.testing.FakeNvml``); None lets the
    NVIDIA backend load the real library. ``udev_monitor`` is a pyudev-like monitor; None lets the
    PCI backend open the real one where udev exists.
    """

    kubelet_dir: Path = field(default=DEFAULT_KUBELET_DIR, converter=Path)
    cdi_dir: Path = field(default=DEFAULT_CDI_DIR, converter=Path)
    state_dir: Path = field(default=DEFAULT_STATE_DIR, converter=Path)
    sysfs_root: Path = field(default=Path("/sys"), converter=Path)
    dev_root: Path = field(default=Path("/"), converter=Path)
    pod_resources_socket: Path = field(default=DEFAULT_POD_RESOURCES_SOCKET, converter=Path)
    nvml: Any = field(default=None, eq=False)
    udev_monitor: Any = field(default=None, eq=False)

    @property
    def kubelet_socket(self) -> Path:
        return self.kubelet_dir / "kubelet.sock"

    def host_path(self, path: str | Path) -> Path:
        """An absolute node path (``/dev/vfio/3``) as seen under ``dev_root``."""
        return self.dev_root / str(path).lstrip("/")
