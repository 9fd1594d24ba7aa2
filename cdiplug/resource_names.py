"""Extended resource names as the kubelet checks them, and the socket name derived from one.

The kubelet's device manager accepts a resource only if ``IsExtendedResourceName`` holds: a
qualified name with a domain prefix, not in the ``kubernetes.io`` domain, and still a qualified name
once prefixed with ``requests.``.
"""

from __future__ import annotations

import re

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Used with fullmatch: Go's "$" matches only at the very end, Python's also before a final newline.
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_dns_subdomain(name: str) -> bool:
    """A DNS-1123 subdomain as Kubernetes checks it (node names, name prefixes): at most 253
    characters of dot-separated lower-case labels."""
    return len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def extended_resource_problem(name: str) -> str | None:
    """Why the kubelet would refuse ``name`` as an extended resource, or None when it is fine."""
    if "/" not in name:
        return f"resource name {name!r} needs a domain prefix, as in example.com/{name}"
    prefix, _, rest = name.partition("/")
    if "/" in rest:
        return f"resource name {name!r} has more than one '/'"
    # The kubelet's IsPrefixedNativeResource: any name containing "kubernetes.io/" is native.
    if "kubernetes.io/" in name:
        return f"resource name {name!r} is in the kubernetes.io domain, which is reserved for native resources"
    if name.startswith("requests."):
        return f"resource name {name!r} must not start with 'requests.'"
    if not is_dns_subdomain(prefix):
        return f"resource name {name!r}: prefix {prefix!r} is not a DNS-1123 subdomain (lower case, digits, '-', '.')"
    # The kubelet also checks "requests." + name, whose prefix then is "requests.<prefix>".
    if len("requests." + prefix) > 253:
        return f"resource name {name!r}: prefix is too long"
    if not rest or len(rest) > 63 or not _QUALIFIED_NAME_PART.fullmatch(rest):
        return (
            f"resource name {name!r}: {rest!r} must be at most 63 characters of letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    return None


def socket_name(resource: str) -> str:
    """``example.com/fpga`` -> ``example.com-fpga.sock`` (DESIGN.md contract)."""
    return resource.replace("/", "-") + ".sock"


def resource_class(resource: str) -> str:
    """The part after the slash: ``example.com/fpga`` -> ``fpga``."""
    return resource.rpartition("/")[2]
