"""One configured resource as the core and the backends see it: :class:`ResourceConfig`.

It sits below both the configuration loader (:mod:`cdiplug.config`, which builds it from YAML)
and the backend protocol (:mod:`cdiplug.backend`, whose factories take it), so that neither of
those two imports the other. Nothing here reads files or knows a backend.
"""

from __future__ import annotations

import enum
from typing import Generic, TypeVar

from attrs import field, frozen

from .model import DEFAULT_ALLOCATE, AllocatePart
from .names import resource_class, socket_name

O = TypeVar("O")  # noqa: E741 - the options type of one backend
O_co = TypeVar("O_co", covariant=True)  # the same, where only read (ResourceConfig is frozen)


class Api(str, enum.Enum):
    """Which kubelet API serves a resource (config key ``api``); never both for one resource."""

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"


def default_dra_driver(resource: str) -> str:
    """``example.com/fpga`` -> ``fpga.example.com`` (DESIGN.md: ``<class>.<vendor>``)."""
    vendor, _, cls = resource.partition("/")
    return f"{cls.lower()}.{vendor}"


@frozen
class ResourceConfig(Generic[O_co]):
    """One extended resource: its name, the backend serving it and that backend's typed options.

    ``cdi_kind`` and ``dra_driver`` are filled in by the loader (a backend may choose their
    defaults); built by hand they default to the resource name and ``<class>.<vendor>``.
    """

    name: str
    backend: str
    options: O_co = field(eq=True)
    cdi_kind: str = ""
    allocate: frozenset[AllocatePart] = DEFAULT_ALLOCATE
    replicas: int = 1
    api: Api = Api.DEVICE_PLUGIN
    dra_driver: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.cdi_kind:
            object.__setattr__(self, "cdi_kind", self.name)
        if not self.dra_driver:
            object.__setattr__(self, "dra_driver", default_dra_driver(self.name))

    @property
    def socket_name(self) -> str:
        return socket_name(self.name)

    @property
    def class_name(self) -> str:
        return resource_class(self.name)

    def sends(self, part: AllocatePart) -> bool:
        return part in self.allocate
