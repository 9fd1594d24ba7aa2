"""One configured resource as the core and the backends see it: :class:`ResourceConfig`.

It sits below both the configuration loader (:mod:`cdiplug.config`, which builds it from YAML)
and the backend protocol (:mod:`cdiplug.backend`, whose factories take it), so that neither of
those two imports the other. Nothing here reads files or knows a backend.
"""

from __future__ import annotations

import enum
from typing import Generic, TypeVar

from attrs import field, frozen

from cdiplug.models.names import resource_class, socket_name

O = TypeVar("O")  # noqa: E741 - the options type of one backend
O_co = TypeVar("O_co", covariant=True)  # the same, where only read (ResourceConfig is frozen)


class Api(str, enum.Enum):
    """The built-in front ends (config key ``api``); a resource is served by one front end only.

    ``ResourceConfig.api`` is a plain string, since any registered front end may be named
    (:mod:`cdiplug.frontend`); the configuration gives these two as members, so ``r.api is Api.DRA``
    holds. Compare with the members, never with their strings.
    """

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"

    def __str__(self) -> str:  # in messages as in the file: "dra", not "Api.DRA"
        return self.value


@frozen
class ResourceConfig(Generic[O_co]):
    """One extended resource: its name, the backend serving it and that backend's typed options,
    the front end serving it (``api``) and that front end's typed ``settings``.

    ``settings`` is an instance of the settings class the front end of ``api`` registered
    (:mod:`cdiplug.frontend`), structured and completed by the loader; built by hand it may be
    None, and the front end uses its defaults. ``cdi_kind`` (the kind of the spec the host writes)
    is filled in by the loader (a backend may choose its default); built by hand it defaults to
    the resource name. ``overlapping_devices`` says whether the front end can offer devices that
    overlap (partitions drawing on shared counters); a backend offers whole devices only when not.
    """

    name: str
    backend: str
    options: O_co = field(eq=True)
    cdi_kind: str = ""
    api: str = Api.DEVICE_PLUGIN  # the name of a registered front end
    settings: object = None  # that front end's settings (None: its defaults)
    overlapping_devices: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.cdi_kind:
            object.__setattr__(self, "cdi_kind", self.name)

    @property
    def socket_name(self) -> str:
        return socket_name(self.name)

    @property
    def class_name(self) -> str:
        return resource_class(self.name)
