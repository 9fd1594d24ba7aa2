"""What ``cdiplug doctor`` says of the generic backend: each resource's paths and USB selectors
against the node as it is now, from the same scan the backend serves.

A selector that matches nothing is a warning, not a problem: the device may simply not be plugged
in yet (the resource then shows no device, and is served as soon as one appears). A selector
marked ``optional`` that matches nothing is fine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from cdiplug.sdk import Finding, ResourceConfig, Verdict

from .discovery import Scan
from .options import GenericOptions

NOTHING_FIX = "plug the device in, or fix the glob or selector (cdiplug discover lists what this node has)"


def scan_findings(resources: Sequence[ResourceConfig[GenericOptions]], scans: Mapping[str, Scan]) -> Iterator[Finding]:
    """One finding per path and selector of each resource, then what was skipped and why."""
    for resource in resources:
        scan = scans[resource.name]
        for where, text in scan.explained:
            field, _, subject = where.partition(" ")  # "groups[0].paths[1] /dev/ttyUSB*"
            missed = text.startswith("matched nothing") and not text.startswith("matched nothing (optional)")
            yield Finding(
                subject or field,
                Verdict.WARNING if missed else Verdict.OK,
                text,
                NOTHING_FIX if missed else "",
                resource=resource.name,
                field=f"options.{field}",
            )
        for device_id, why in scan.skipped:
            yield Finding(f"device {device_id}", Verdict.WARNING, f"left out: {why}", resource=resource.name)
        if not scan.found:
            yield Finding(
                "devices",
                Verdict.WARNING,
                "none found on this node now: the resource offers no device until one appears",
                NOTHING_FIX,
                resource=resource.name,
            )
