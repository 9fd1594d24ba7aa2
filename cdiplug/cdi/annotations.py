"""CDI device requests as container annotations, for runtimes that read those instead of CDI fields.

The key is ``cdi.k8s.io/<plugin>_<device id>``; the part after the prefix must be at most 63
characters, start and end with a letter or digit and hold only letters, digits, ``_ - .`` inside
(the reference library's ``annotations.Key`` refuses anything else). Where ``<plugin>_<id>`` breaks
those rules (a PCI address has ``:``, a long UUID overflows) it is mapped deterministically: bad
characters become ``_`` and, when anything had to change, a short hash of the original is added so
two different IDs never share a key. The value is the comma-joined qualified CDI names.
"""

import re
from collections.abc import Sequence

from cdiplug.errors import CdiNameError
from cdiplug.models.names import qualified_name_problem

PREFIX = "cdi.k8s.io/"
MAX_NAME_LENGTH = 63
_HASH_LENGTH = 10
_VALID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?")


def is_valid_name(name: str) -> bool:
    """The name part of an annotation key (after any ``prefix/``) by the 63-character rules."""
    return len(name) <= MAX_NAME_LENGTH and _VALID.fullmatch(name) is not None


def key_name(plugin_name: str, device_id: str) -> str:
    """The part of the key after ``cdi.k8s.io/``, valid by the 63-character rules."""
    if not plugin_name:
        raise CdiNameError("CDI annotation: the plugin name is empty")
    if not device_id:
        raise CdiNameError("CDI annotation: the device ID is empty")
    # The reference library maps '/' to '_'; a name valid after that is used unchanged.
    name = f"{plugin_name}_{device_id.replace('/', '_')}"
    if is_valid_name(name):
        return name
    import hashlib  # only for a name too long or with other characters

    digest = hashlib.sha256(f"{plugin_name}\0{device_id}".encode()).hexdigest()[:_HASH_LENGTH]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    room = MAX_NAME_LENGTH - len(digest) - 1
    cleaned = cleaned[:room].strip("_.-")
    return f"{cleaned}-{digest}" if cleaned else digest


def annotation_key(plugin_name: str, device_id: str) -> str:
    return PREFIX + key_name(plugin_name, device_id)


def annotation_value(names: Sequence[str]) -> str:
    """Comma-joined qualified names; each must be ``vendor/class=name``."""
    if not names:
        raise CdiNameError("CDI annotation: no device names")
    for name in names:
        problem = qualified_name_problem(name)
        if problem:
            raise CdiNameError(f"CDI annotation: {problem}")
    return ",".join(names)


def annotations(plugin_name: str, device_id: str, names: Sequence[str]) -> dict[str, str]:
    """``{"cdi.k8s.io/<plugin>_<id>": "kind=a,kind=b"}`` for one container's devices."""
    return {annotation_key(plugin_name, device_id): annotation_value(names)}
