"""The world the daemon runs against: folders and handles passed in, never globals.

Tests and users testing their own backends build a :class:`World` of temporary folders and fakes
(a sysfs tree from ``cdiplug.testing``, a fake NVML); production builds it from the command line.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path, PurePath

from attrs import field, frozen

from cdiplug.models.instance import Instance

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
DEFAULT_STATE_DIR = Path("/var/lib/cdiplug")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
# A pod's metadata.uid is a UUID (36 characters); a DNS label of at most 63 is what may go into a
# socket's name: no '/', no '..', nothing that leaves the plugin folders.
_POD_UID = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def pod_uid_problem(uid: str) -> str | None:
    """Why ``uid`` cannot be this pod's UID in socket names (lower-case letters, digits, '-'; 63 at most), or None."""
    if _POD_UID.fullmatch(uid) is None:
        return f"pod UID {uid[:80]!r} must be lower-case letters, digits and '-' (a UUID), at most 63 characters"
    return None


def _check_pod_uid(instance: object, attribute: object, value: str | None) -> None:
    if value is not None and (problem := pod_uid_problem(value)) is not None:
        raise ValueError(problem)


def instance_problem(name: str) -> str | None:
    """Why ``name`` cannot name a cdiplug instance (a DNS label: lower-case letters, digits, '-'), or None.

    The empty name is the default instance, whose files keep the names they had before instances
    existed (:mod:`cdiplug.models.instance` describes the scheme).
    """
    if name and _POD_UID.fullmatch(name) is None:
        return (
            f"instance name {name[:80]!r} must be a DNS label: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters"
        )
    return None


def _check_instance(instance: object, attribute: object, value: str) -> None:
    if (problem := instance_problem(value)) is not None:
        raise ValueError(problem)


def default_node_name() -> str:
    """``$NODE_NAME`` (the downward API in a DaemonSet), else the host name in lower case."""
    return os.environ.get("NODE_NAME") or socket.gethostname().lower()


@frozen
class World:
    """Folders and names of the node.

    ``kubeconfig`` None means: credentials found as kubectl finds them (``cdiplug.kube``).
    Handles only some backends need (NVML, udev) are not here: their plugins take them.
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
    # This pod's UID (the downward API's metadata.uid): DRA sockets carry it, so the old and the
    # new pod of a rolling update serve side by side (kubelet 1.33+). None: the plain names.
    pod_uid: str | None = field(default=None, validator=_check_pod_uid)
    # This deployment's name on the node (``--instance``; the Helm release): every file it keeps
    # in a folder other deployments share is named by it. "" is the default instance.
    instance: str = field(default="", validator=_check_instance)

    @property
    def names(self) -> Instance:
        """The names of this instance's files in shared folders (:mod:`cdiplug.models.instance`)."""
        return Instance(self.instance)

    @property
    def own_state_dir(self) -> Path:
        """This instance's own state folder: ``state_dir`` for the default instance,
        ``state_dir/instances/<name>`` for a named one."""
        return self.names.state_dir(self.state_dir)

    @property
    def kubelet_socket(self) -> Path:
        return self.kubelet_dir / "kubelet.sock"

    def host_path(self, path: str | PurePath) -> Path:
        """An absolute node path (``/dev/vfio/3``) as seen under ``dev_root``."""
        return self.dev_root / str(path).lstrip("/")
