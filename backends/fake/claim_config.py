"""The fake backend's per-claim configuration (DRA opaque parameters, ``kind: FakeConfig``).

::

    apiVersion: cdiplug.dev/v1alpha1
    kind: FakeConfig
    mode: exclusive          # default | exclusive | shared: shown as FAKE_<CLASS>_DEVICE_<N>_MODE (a partition's beside its own variable)
    env: {LOG_LEVEL: debug}  # an overlay added to each device's env (a device's own variables win)

Nothing is done to a fake device: the configuration shows in the container's env only, which is
what tests and demos read.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator

from attrs import evolve, field, frozen

from cdiplug.sdk import CheckedOptions, ContainerEdits, Device, register_enum

KIND = "FakeConfig"
MAX_ENV = 64
MAX_VALUE = 4096
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class Mode(str, enum.Enum):
    DEFAULT = "default"
    EXCLUSIVE = "exclusive"
    SHARED = "shared"


register_enum(Mode)


@frozen
class FakeClaimConfig(CheckedOptions):
    mode: Mode = Mode.DEFAULT
    env: dict[str, str] = field(factory=dict)

    def problems(self) -> Iterator[tuple[str, str]]:
        if len(self.env) > MAX_ENV:
            yield "env", f"has {len(self.env)} variables, more than {MAX_ENV}"
        for name, value in self.env.items():
            if not _ENV_NAME.fullmatch(name):
                yield "env", f"not an environment variable name: {name[:64]!r}"
            elif len(value) > MAX_VALUE:
                yield f"env.{name}", f"is {len(value)} characters long, more than {MAX_VALUE}"


def shaped(device: Device, config: FakeClaimConfig, device_env: str) -> Device:
    """``device`` with the claim's env overlay and mode (``<device_env>_MODE``) in its edits."""
    own = dict(device.edits.env)
    overlay = {k: v for k, v in config.env.items() if k not in own}
    overlay[f"{device_env}_MODE"] = config.mode.value
    return evolve(device, edits=device.edits.merge(ContainerEdits(env=overlay)))
