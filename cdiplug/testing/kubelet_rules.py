"""The kubelet device manager's rules, as pure functions the kubelet stand-in applies.

:func:`register_problem` is what the kubelet answers to a RegisterRequest it refuses (its checks,
its wording), :func:`is_extended_resource_name` its resource-name rule, and :func:`pick_devices`
how its device manager chooses devices for a container. They follow Kubernetes, not cdiplug's own
code, and hold no state; ``cdiplug.testing.kubelet`` applies them and re-exports them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

API_VERSION = "v1beta1"


# Used with fullmatch: Go's "$" is the very end; Python's would also match before a final newline.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """``IsExtendedResourceName`` of Kubernetes' ``pkg/apis/core/v1/helper``, rule for rule; kept
    apart from ``cdiplug.models.names`` on purpose, so tests through the stand-in can catch a
    mistake there."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = ("requests." + name).split("/")  # IsQualifiedName of the quota form
    if len(parts) != 2:
        return False
    prefix, rest = parts
    if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
        return False
    return 0 < len(rest) <= 63 and bool(_QUALIFIED_NAME.fullmatch(rest))


def register_problem(version: str, resource: str, endpoint: str, kubelet_dir: Path) -> str | None:
    """Why the kubelet refuses a RegisterRequest before dialing the plugin, or None."""
    if version != API_VERSION:
        return f"requested API version {version!r} is not supported by kubelet. Supported version is {[API_VERSION]!r}"
    if not is_extended_resource_name(resource):
        return f"the ResourceName {resource!r} is invalid"
    if not endpoint or "/" in endpoint or endpoint in (".", ".."):
        # The kubelet joins it to its folder unchecked; a plugin sending a path is a bug.
        return f"endpoint {endpoint!r} must be a socket file name in {kubelet_dir}"
    return None


def pick_devices(available: Sequence[str], preferred: Iterable[str], count: int) -> list[str]:
    """The device manager's choice of ``count`` devices: the plugin's preference (within
    ``available``, empty when it offers none) first, then the remaining devices in ID order."""
    chosen = [i for i in dict.fromkeys(preferred) if i in available][:count]
    chosen += [i for i in available if i not in chosen][: count - len(chosen)]
    return chosen
