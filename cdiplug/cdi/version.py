"""The lowest ``cdiVersion`` a spec's content needs, and which versions exist.

Older runtimes read only old versions (podman 4.3 and containerd 1.7.0-1.7.11 stop at 0.5.0), so
cdiplug writes the lowest version its content needs rather than the newest. The rules follow the
reference library's ``specs-go/version.go``:

- 0.3.0 is the floor;
- 0.4.0: a mount with a ``type``;
- 0.5.0: a device node with a ``hostPath``, or a device name that does not start with a letter;
- 0.6.0: annotations (spec or device level), or a ``.`` in the kind's class;
- 0.7.0: ``intelRdt`` or ``additionalGids`` (spec or device level);
- 0.8.0 and 1.0.0 need nothing new;
- 1.1.0: ``netDevices``, or ``intelRdt`` with ``schemata`` or ``enableMonitoring``.
"""

from __future__ import annotations

from collections.abc import Iterator

from cdiplug.cdi.spec import CdiContainerEdits, CdiSpec

KNOWN_VERSIONS: tuple[str, ...] = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
EARLIEST = "0.3.0"


def parse(version: str) -> tuple[int, int, int]:
    """``"0.5.0"`` (or ``"v0.5.0"``) -> ``(0, 5, 0)``; ValueError when it is not x.y.z."""
    parts = version.removeprefix("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{version!r} is not a version x.y.z")
    major, minor, patch = (int(p) for p in parts)
    return major, minor, patch


def is_known(version: str) -> bool:
    return version in KNOWN_VERSIONS


def _all_edits(spec: CdiSpec) -> Iterator[CdiContainerEdits]:
    yield spec.container_edits
    for d in spec.devices:
        yield d.container_edits


def requirements(spec: CdiSpec) -> Iterator[tuple[str, str]]:
    """Every ``(version, reason)`` the content needs beyond the 0.3.0 floor (for messages)."""
    for i, edits in enumerate(_all_edits(spec)):
        where = "containerEdits" if i == 0 else f"devices[{i - 1}].containerEdits"
        if any(m.type for m in edits.mounts):
            yield "0.4.0", f"a mount type in {where}"
        if any(n.host_path for n in edits.device_nodes):
            yield "0.5.0", f"a device node hostPath in {where}"
        if edits.intel_rdt is not None:
            yield "0.7.0", f"intelRdt in {where}"
            if edits.intel_rdt.schemata or edits.intel_rdt.enable_monitoring:
                yield "1.1.0", f"intelRdt schemata or enableMonitoring in {where}"
        if edits.additional_gids:
            yield "0.7.0", f"additionalGids in {where}"
        if edits.net_devices:
            yield "1.1.0", f"netDevices in {where}"
    for i, d in enumerate(spec.devices):
        if d.name and not (d.name[0].isascii() and d.name[0].isalpha()):
            yield "0.5.0", f"device name {d.name!r} at devices[{i}] does not start with a letter"
        if d.annotations:
            yield "0.6.0", f"annotations at devices[{i}]"
    if spec.annotations:
        yield "0.6.0", "spec annotations"
    _, sep, cls = spec.kind.partition("/")
    if sep and "." in cls:
        yield "0.6.0", f"a '.' in the class of kind {spec.kind!r}"


def minimal_version(spec: CdiSpec) -> str:
    """The lowest cdiVersion that can express ``spec`` (its own ``cdi_version`` is ignored)."""
    return max((v for v, _ in requirements(spec)), key=parse, default=EARLIEST)
