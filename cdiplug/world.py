"""The world the daemon runs against: folders and handles passed in, never globals.

Tests and users testing their own backends build a :class:`World` of temporary folders and fakes
(a sysfs tree from ``cdiplug.testing``, a fake NVML); production builds it from the command line.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path, PurePath

from attrs import field, frozen

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
DEFAULT_STATE_DIR = Path("/var/lib/cdiplug")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")


def default_node_name() -> str:
    """``$NODE_NAME`` (the downward API in a DaemonSet), else the host name in lower case."""
    return os.environ.get("NODE_NAME") or socket.gethostname().lower()


@frozen
class World:
    """Folders and names of the node.

    ``kubeconfig`` None means: in-cluster credentials, else ``$KUBECONFIG`` (DRA's API client
    decides). Handles only some backends need (NVML, udev) are not here: their plugins take them.
    """

    kubelet_dir: Path = field(default=DEFAULT_KUBELET_DIR, converter=Path)
    cdi_dir: Path = field(default=DEFAULT_CDI_DIR, converter=Path)
    state_dir: Path = field(default=DEFAULT_STATE_DIR, converter=Path)
    sysfs_root: Path = field(default=Path("/sys"), converter=Path)
    dev_root: Path = field(default=Path("/"), converter=Path)
    pod_resources_socket: Path = field(default=DEFAULT_POD_RESOURCES_SOCKET, converter=Path)
    plugins_registry_dir: Path = field(default=DEFAULT_PLUGINS_REGISTRY_DIR, converter=Path)
    plugins_dir: Path = field(default=DEFAULT_PLUGINS_DIR, converter=Path)
    node_name: str = field(factory=default_node_name)
    kubeconfig: Path | None = None

    @property
    def kubelet_socket(self) -> Path:
        return self.kubelet_dir / "kubelet.sock"

    def host_path(self, path: str | PurePath) -> Path:
        """An absolute node path (``/dev/vfio/3``) as seen under ``dev_root``."""
        return self.dev_root / str(path).lstrip("/")
