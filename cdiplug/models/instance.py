"""Which files of a folder that several cdiplug deployments share belong to which deployment.

Several deployments may run on one node (two Helm releases; device-plugin resources in one
DaemonSet, DRA resources in another), sharing the CDI folder, the state folder and the kubelet's
folders. Each is an *instance* with a name (``--instance``: a DNS label, the Helm release), and
every file an instance keeps in a shared folder is named by it, so that a start-up sweep, a repair
or a cleanup of one can never match a file of another:

==================  ======================================  ==============================================
                    default instance (no ``--instance``)    instance ``NAME``
==================  ======================================  ==============================================
resource CDI spec   ``cdiplug-<vendor>-<class>.json``        ``cdiplug.NAME.<vendor>-<class>.json``
claim CDI spec      ``cdiplug-claim-<claim uid>.json``       ``cdiplug.NAME.claim-<claim uid>.json``
temporary files     ``.cdiplug-….<pid>.<tid>.tmp``           ``.cdiplug.NAME.….<pid>.<tid>.tmp``
own state           ``<state-dir>/`` (``dra-claims.json``,   ``<state-dir>/instances/NAME/`` (the same
                    ``pci/``, ``dra-instances/``)            files inside)
==================  ======================================  ==============================================

The default instance keeps the names files had before instances existed, so upgrading renames
nothing. Its prefix ends in ``-`` and a named one's starts ``cdiplug.``: neither matches the
other. Instance names are DNS labels, without ``.``, so ``cdiplug.NAME.`` never matches a file of
instance ``NAME.x`` or ``NAME-x`` either. The default instance's own state files sit at the top of
the state folder and named instances' below ``instances/``, a folder the default instance never
reads. Shared by every instance: ``<state-dir>/owners/``, where each resource and DRA driver an
instance serves is claimed (:mod:`cdiplug.host.owners`), so that two instances never serve one
resource and so never write the same socket (device-plugin sockets are named by resource, DRA
sockets by driver), device metadata folder or node label.
"""

from __future__ import annotations

from pathlib import Path

from attrs import frozen

from cdiplug.models.names import check_kind
from cdiplug.toolkit.atomic import TEMP_SUFFIX

DEFAULT_PREFIX = "cdiplug-"
CLAIM_PART = "claim-"
SPEC_SUFFIX = ".json"
INSTANCES_FOLDER = "instances"
OWNERS_FOLDER = "owners"
# The kinds of names an instance claims in OWNERS_FOLDER (cdiplug.host.owners).
RESOURCE = "resource"
DRA_DRIVER = "dra-driver"


@frozen
class Instance:
    """The names of one instance's files (``name`` "" is the default instance; checked by
    :func:`cdiplug.models.world.instance_problem` before it gets here)."""

    name: str = ""

    @property
    def prefix(self) -> str:
        """What every CDI spec file of this instance starts with."""
        return f"cdiplug.{self.name}." if self.name else DEFAULT_PREFIX

    @property
    def label(self) -> str:
        """How messages name the instance."""
        return f"instance {self.name!r}" if self.name else "the default instance (no --instance)"

    def resource_spec(self, kind: str) -> str:
        """``example.com/fpga`` -> ``cdiplug-example.com-fpga.json`` (named: ``cdiplug.NAME.example.com-fpga.json``)."""
        check_kind(kind)
        vendor, _, cls = kind.partition("/")
        return f"{self.prefix}{vendor}-{cls}{SPEC_SUFFIX}"

    def is_others_resource_spec(self, name: str, kind: str) -> bool:
        """Whether ``name`` is another instance's spec file of ``kind`` (the default instance's, or
        ``cdiplug.OTHER.<vendor>-<class>.json``)."""
        tail = Instance().resource_spec(kind)[len(DEFAULT_PREFIX) :]
        if name == self.resource_spec(kind):
            return False
        if name == DEFAULT_PREFIX + tail:
            return True
        other, dot, rest = name.removeprefix("cdiplug.").partition(".")
        return name.startswith("cdiplug.") and bool(dot) and rest == tail and _is_label(other)

    def claim_spec(self, uid: str) -> str:
        """The spec file of a DRA claim (``uid`` checked by the caller: a UUID-like name)."""
        return f"{self.prefix}{CLAIM_PART}{uid}{SPEC_SUFFIX}"

    def owns_spec(self, name: str) -> bool:
        """Whether the CDI folder's entry ``name`` is a spec file of this instance's."""
        return name.startswith(self.prefix) and name.endswith(SPEC_SUFFIX)

    def is_claim_spec(self, name: str) -> bool:
        return self.owns_spec(name) and name[len(self.prefix) :].startswith(CLAIM_PART)

    def claim_uid(self, name: str) -> str | None:
        """The claim UID of one of this instance's claim spec names, else None."""
        if not self.is_claim_spec(name):
            return None
        return name[len(self.prefix) + len(CLAIM_PART) : -len(SPEC_SUFFIX)]

    def is_resource_spec(self, name: str) -> bool:
        return self.owns_spec(name) and not self.is_claim_spec(name)

    def is_leftover(self, name: str) -> bool:
        """A temporary file of one of this instance's writes (a crash leaves one behind)."""
        return name.startswith("." + self.prefix) and name.endswith(TEMP_SUFFIX)

    def state_dir(self, base: Path) -> Path:
        """This instance's own state folder in the state folder ``base``."""
        return Path(base) / INSTANCES_FOLDER / self.name if self.name else Path(base)


def owners_dir(base: Path) -> Path:
    """The folder, shared by every instance, where resources and DRA drivers are claimed."""
    return Path(base) / OWNERS_FOLDER


def _is_label(name: str) -> bool:
    """A DNS label, as instance names are: what sits between ``cdiplug.`` and the next dot."""
    return 0 < len(name) <= 63 and name.replace("-", "").isalnum() and name.islower() and name[0] != "-" != name[-1]
