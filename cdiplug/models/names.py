"""Names as Kubernetes and CDI check them: extended resources, DNS subdomains, CDI kinds and devices.

Extended resources: the kubelet's device manager accepts a resource only if
``IsExtendedResourceName`` holds: a qualified name with a domain prefix, not in the
``kubernetes.io`` domain, and still a qualified name once prefixed with ``requests.``.

CDI: vendor and class start with a letter and end with a letter or digit, with letters, digits and
``_ - .`` inside; cdiplug also wants two characters at least, because the CDI library of podman 4.3
and containerd 1.7 panics on a one-character vendor or class. Device names start and end with a
letter or digit, with ``_ - . :`` inside. Device IDs that are not valid names are mapped to one
deterministically (:func:`cdi_device_name`), so a name never carries a ``/`` or ``..`` that could
leave the CDI folder.

Kubernetes (DRA): a device's name in a ResourceSlice is a DNS label, lower case, no ``.`` or
``:`` (:func:`dns_label_for`). The two rules differ (``GPU-1`` and ``0000:3b:00.1`` are CDI
device names, no DNS labels), so each has its own mapping, named for what it produces; both keep
a valid ID as it is and map any other to a stable name with a hash of the ID.

Pure string rules, at the bottom of the layers: the configuration, the CDI writer and the front
ends all check names here.
"""

from __future__ import annotations

import re

from cdiplug.errors import CdiNameError

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Used with fullmatch: Go's "$" matches only at the very end, Python's also before a final newline.
_DNS1123_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_dns_subdomain(name: str) -> bool:
    """A DNS-1123 subdomain as Kubernetes checks it (node names, name prefixes): at most 253
    characters of dot-separated lower-case labels."""
    return len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def is_dns_label(name: str) -> bool:
    """A DNS-1123 label (namespaces, request names, health causes): at most 63 lower-case letters,
    digits and '-', a letter or digit at each end."""
    return _DNS1123_LABEL_RE.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    """A non-empty label value, or the name part of a label key: at most 63 letters, digits, '-',
    '_' or '.', a letter or digit at each end."""
    return len(value) <= 63 and _QUALIFIED_NAME_PART.fullmatch(value) is not None


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
    if not is_label_value(rest):
        return (
            f"resource name {name!r}: {rest!r} must be at most 63 characters of letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    return None


def socket_name(resource: str) -> str:
    """``example.com/fpga`` -> ``example.com-fpga.sock`` (a contract: ``docs/architecture.md``)."""
    return resource.replace("/", "-") + ".sock"


def resource_class(resource: str) -> str:
    """The part after the slash: ``example.com/fpga`` -> ``fpga``."""
    return resource.rpartition("/")[2]


_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def kind_problem(kind: str) -> str | None:
    vendor, sep, cls = kind.partition("/")
    if not sep or "/" in cls:
        return f"CDI kind {kind!r} must be vendor/class"
    if not _VENDOR_OR_CLASS.fullmatch(vendor):
        return f"CDI kind {kind!r}: vendor {vendor!r} must start with a letter, end with a letter or digit, and hold only letters, digits, '_', '-', '.'"
    if not _VENDOR_OR_CLASS.fullmatch(cls):
        return f"CDI kind {kind!r}: class {cls!r} must start with a letter, end with a letter or digit, and hold only letters, digits, '_', '-', '.'"
    if len(vendor) < 2 or len(cls) < 2:
        # The spec allows it, but the CDI library in podman 4.3 and containerd 1.7 panics on it.
        return f"CDI kind {kind!r}: vendor and class need at least two characters each (older runtimes crash on shorter ones)"
    return None


def check_kind(kind: str) -> str:
    problem = kind_problem(kind)
    if problem:
        raise CdiNameError(problem)
    return kind


def device_name_problem(name: str) -> str | None:
    if not _DEVICE.fullmatch(name):
        return f"CDI device name {name!r} must start and end with a letter or digit and hold only letters, digits, '_', '-', '.', ':'"
    return None


def cdi_device_name(device_id: str) -> str:
    """The CDI device name for a device ID: the ID itself when valid, else a stable mapped name.

    The mapped name keeps the safe characters (others become ``_``) and adds a 12-digit hash of
    the original, so two different IDs map to different names (the spec builder still checks
    that the names within one spec are unique). The result never holds ``/`` and is never ``..``.
    """
    if _DEVICE.fullmatch(device_id):
        return device_id
    cleaned = re.sub(r"[^A-Za-z0-9_.:-]", "_", device_id).strip("_.:-") or "dev"
    import hashlib  # only for an ID that needs mapping

    digest = hashlib.sha256(device_id.encode()).hexdigest()[:12]
    return f"{cleaned}-{digest}"


def dns_label_for(device_id: str) -> str:
    """A DNS label for a device ID (its name in a ResourceSlice): the ID when it is one, else a stable mapped label.

    The mapping lowers the case, turns other characters into ``-`` and appends 10 hex digits of
    the ID's SHA-256, so two IDs never map to one name (``0000:3b:00.1`` -> ``0000-3b-00-1-<hash>``).
    """
    if _DNS1123_LABEL_RE.fullmatch(device_id):
        return device_id
    import hashlib  # only for an ID that needs mapping

    digest = hashlib.sha256(device_id.encode()).hexdigest()[:10]
    cleaned = re.sub(r"[^a-z0-9-]+", "-", device_id.lower()).strip("-")[: 63 - 11].strip("-")
    return f"{cleaned}-{digest}" if cleaned else f"dev-{digest}"


def qualified_name(kind: str, name: str) -> str:
    """``example.com/fpga`` and ``fpga-0`` -> ``example.com/fpga=fpga-0`` (both checked)."""
    check_kind(kind)
    problem = device_name_problem(name)
    if problem:
        raise CdiNameError(problem)
    return f"{kind}={name}"


def parse_qualified_name(qualified: str) -> tuple[str, str]:
    """``vendor/class=name`` -> ``(kind, name)``; CdiNameError when either part is invalid."""
    problem = qualified_name_problem(qualified)
    if problem:
        raise CdiNameError(problem)
    kind, _, name = qualified.partition("=")
    return kind, name


def qualified_name_problem(qualified: str) -> str | None:
    kind, sep, name = qualified.partition("=")
    if not sep:
        return f"CDI device {qualified!r} must be a qualified name vendor/class=name"
    return kind_problem(kind) or device_name_problem(name)


def spec_file_name(kind: str) -> str:
    """``example.com/fpga`` -> ``cdiplug-example.com-fpga.json``. The kind must be valid (no path parts)."""
    check_kind(kind)
    vendor, _, cls = kind.partition("/")
    return f"cdiplug-{vendor}-{cls}.json"


CLAIM_SPEC_PREFIX = "cdiplug-claim-"  # the per-claim specs' file names: ``cdiplug-claim-<claim uid>.json``
MAX_FILE_NAME = 255  # bytes of one file name (NAME_MAX)


def spec_file_problem(kind: str) -> str | None:
    """Why the per-resource spec of ``kind`` cannot be written (the kind's own problem, a file name
    kept for per-claim specs, a name too long), or None."""
    if problem := kind_problem(kind):
        return problem
    name = spec_file_name(kind)
    if name.startswith(CLAIM_SPEC_PREFIX):
        return f"CDI kind {kind!r} would be written to {name}, a name kept for per-claim specs"
    if len(name.encode()) > MAX_FILE_NAME:
        return f"the CDI spec file name for kind {kind[:80]!r} would be longer than {MAX_FILE_NAME} bytes"
    return None
