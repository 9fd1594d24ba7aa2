"""What ``cdiplug doctor`` and ``cdiplug discover`` report about a node: findings, and the optional
ability a backend has to check what it needs.

A :class:`Finding` is one thing looked at (the IOMMU, a kubelet folder, a resource's
``health_file``), its :class:`Verdict`, what was found, and how to fix it when it is not right.
A backend checks its own needs by subclassing :class:`NodeChecker` (``cdiplug.sdk`` exports both):
the core never knows what a backend needs, and never imports one.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from attrs import frozen


class Verdict(enum.Enum):
    """``problem``: cdiplug cannot work as configured (doctor exits 1); ``warning``: it may not."""

    OK = "ok"
    WARNING = "warning"
    PROBLEM = "problem"


@frozen
class Finding:
    """One check: ``subject`` what was looked at, ``detail`` what was found, ``fix`` what to do.

    ``resource``, when the check is about one configured resource; ``field`` its place in the
    configuration (``options.health_file``).
    """

    subject: str
    verdict: Verdict
    detail: str
    fix: str = ""
    resource: str | None = None
    field: str | None = None

    def line(self) -> str:
        """One line for people: ``problem: IOMMU: no IOMMU groups ... (fix: ...)``."""
        where = f"{self.resource}: " if self.resource else ""
        if self.field:
            where += f"{self.field}: "
        text = f"{self.verdict.value}: {self.subject}: {where}{self.detail}"
        return f"{text} (fix: {self.fix})" if self.fix else text


def ok(subject: str, detail: str, *, resource: str | None = None, field: str | None = None) -> Finding:
    return Finding(subject, Verdict.OK, detail, resource=resource, field=field)


def warning(subject: str, detail: str, fix: str = "", *, resource: str | None = None, field: str | None = None) -> Finding:
    return Finding(subject, Verdict.WARNING, detail, fix, resource=resource, field=field)


def problem(subject: str, detail: str, fix: str = "", *, resource: str | None = None, field: str | None = None) -> Finding:
    return Finding(subject, Verdict.PROBLEM, detail, fix, resource=resource, field=field)


@runtime_checkable
class NodeChecker(Protocol):
    """A backend's checks of what it needs on the node (kernel modules, drivers, libraries) and
    of its resources' options against the node (a file that is not there, a selector that
    matches nothing). Read-only: it changes nothing. Blocking work goes through
    ``asyncio.to_thread``. Called on a backend that was created and never run.
    """

    async def node_checks(self) -> Sequence[Finding]: ...
