"""One configured resource as the core and the backends see it: :class:`ResourceConfig`.

It sits below both the configuration loader (:mod:`cdiplug.config`, which builds it from YAML)
and the backend protocol (:mod:`cdiplug.backend`, whose factories take it), so that neither of
those two imports the other. Nothing here reads files or knows a backend.
"""

from __future__ import annotations

import enum
from typing import Generic, TypeVar

from attrs import field, frozen

from cdiplug.models.devices import DEFAULT_ALLOCATE, AllocatePart
from cdiplug.models.names import resource_class, socket_name

O = TypeVar("O")  # noqa: E741 - the options type of one backend
O_co = TypeVar("O_co", covariant=True)  # the same, where only read (ResourceConfig is frozen)


class Api(str, enum.Enum):
    """The built-in front ends (config key ``api``); a resource is served by one front end only.

    ``ResourceConfig.api`` is a plain string, since any registered front end may be named
    (:mod:`cdiplug.frontend`); the configuration gives these two as members, so ``r.api is Api.DRA``
    holds, and as ``str`` members they equal their names (``Api.DRA == "dra"``).
    """

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"

    def __str__(self) -> str:  # in messages as in the file: "dra", not "Api.DRA"
        return self.value


def default_dra_driver(resource: str) -> str:
    """``example.com/fpga`` -> ``fpga.example.com`` (``docs/architecture.md``: ``<class>.<vendor>``)."""
    vendor, _, cls = resource.partition("/")
    return f"{cls.lower()}.{vendor}"


@frozen
class ResourceConfig(Generic[O_co]):
    """One extended resource: its name, the backend serving it and that backend's typed options.

    ``cdi_kind`` and ``dra_driver`` are filled in by the loader (a backend may choose their
    defaults); built by hand they default to the resource name and ``<class>.<vendor>``. Which of
    ``cdi_kind``, ``allocate``, ``replicas`` and ``dra_driver`` a file may set depends on ``api``
    (:data:`cdiplug.frontend.SETTINGS`); the others keep their defaults.
    """

    name: str
    backend: str
    options: O_co = field(eq=True)
    cdi_kind: str = ""
    allocate: frozenset[AllocatePart] = DEFAULT_ALLOCATE
    replicas: int = 1
    api: str = Api.DEVICE_PLUGIN  # the name of a registered front end
    dra_driver: str = ""
    device_metadata: bool = False  # DRA: write KEP-5304 device metadata files (cdiplug.dra.metadata)
    register_when_empty: bool = False  # device plugin: register even while no device is found

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
