"""The records of the DRA checkpoint and their file format: what :mod:`.checkpoint` keeps per claim.

Format, version 2::

    {"version": 2, "claims": {"<uid>": {"state": "PrepareStarted" | "PrepareCompleted",
      "namespace": …, "name": …, "driver": …, "resource": …, "spec_file": "cdiplug-claim-<uid>.json",
      "devices": [{"request_names": […], "pool": …, "device": …, "device_id": …,
                   "cdi_ids": […], "prepare_group": … | null,
                   "share_id": … | null, "consumed_capacity": [[<capacity>, <quantity>], …],
                   "prepared": true, "release": true, "admin_access": false}],
      "configs": [{"source": "FromClass" | "FromClaim", "requests": […], "parameters": {…}}],
      "boot_id": "<the node's boot ID when the claim was last prepared>" | null,
      "owner": "<the pod UID of the instance preparing it>" | ""}}}

``configs`` are the opaque entries the claim was prepared with (a repeated prepare compares them);
``prepared``, ``release`` and ``admin_access`` per device say how they shaped it (optional, absent:
a plain exclusive preparation, as in files of earlier cdiplug).

``boot_id`` (optional, absent: unknown, as in files of earlier cdiplug) tells a claim prepared
before the node rebooted: what a reboot resets (VFIO bindings, the tmpfs CDI folder) is prepared
again at start (:mod:`.prepare`). ``owner`` (optional) names the instance that started the
preparation (:mod:`.instances`): a start leaves a started claim to its owner while it runs.

Version 1 (cdiplug before the two phases: no ``state``, no ``configs``, written only once a claim
was complete) is upgraded on load, every claim ``PrepareCompleted``, and written back as 2.

Decoding is lenient, as for all our own state (:mod:`cdiplug.toolkit.stateconv`: the record
classes below say per field what a missing or odd value reads as, so a new field is one edit):
unknown keys are ignored (a newer cdiplug may add some), missing optional ones take their defaults, and one claim whose record is unusable is
dropped with the reason logged, the others kept (a copy of the file is kept aside first). A file
that cannot be read as a checkpoint at all (not JSON, a symlink, a FIFO, too big, an unknown
version) is moved aside (``dra-claims.json.corrupt-<time>``) with the reason logged, and the
store starts empty.

The file holds one claim a line (compact JSON, keys sorted, in UID order), so that a change
renders only the claims it changed (:func:`render`) and people can grep it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any

import attrs
from attrs import frozen

from cdiplug.dra.claims import ConfigEntry
from cdiplug.toolkit import stateconv
from cdiplug.toolkit.brief import brief
from cdiplug.toolkit.stateconv import absent, checked, lenient

VERSION = 2


class ClaimState(str, enum.Enum):
    STARTED = "PrepareStarted"
    COMPLETED = "PrepareCompleted"


def _is_file_name(value: str) -> bool:
    return "/" not in value and value not in (".", "..")


@frozen
class PreparedDevice:
    """One device of a claim, as answered to the kubelet."""

    request_names: tuple[str, ...] = attrs.field(metadata=absent([]))
    pool: str
    device: str  # the device's name in the slice
    device_id: str  # the backend's ID
    cdi_ids: tuple[str, ...] = attrs.field(metadata=absent([]))
    prepare_group: str | None = None
    share_id: str | None = attrs.field(default=None, metadata=lenient())  # one share of a device that allows multiple allocations
    # What the share takes: capacity -> quantity (a pair not of two strings is left out when read).
    consumed_capacity: tuple[tuple[str, str], ...] = attrs.field(default=(), metadata=lenient())
    # How the claim's configuration and admin access had it prepared (claim_config): whether the
    # host prepared it (and so whether it holds the device against another claim's release),
    # whether the claim's unprepare releases it, and whether it was for admin access only.
    prepared: bool = attrs.field(default=True, metadata=lenient())
    release: bool = attrs.field(default=True, metadata=lenient())
    admin_access: bool = attrs.field(default=False, metadata=lenient())


@frozen
class PreparedClaim:
    """A claim of one driver: its devices, the CDI spec file written for it, how far it got."""

    uid: str
    namespace: str
    name: str
    driver: str
    resource: str
    devices: tuple[PreparedDevice, ...] = ()
    # A file name in the CDI folder; empty when the claim has no devices.
    spec_file: str = attrs.field(default="", metadata=checked(_is_file_name, "must be a file name"))
    state: ClaimState = ClaimState.COMPLETED
    configs: tuple[ConfigEntry, ...] = ()
    # The node's boot when prepared; None: unknown (so prepared again at the next start).
    boot_id: str | None = attrs.field(default=None, metadata=lenient(lambda v: v is None or 0 < len(v) <= 64))
    # The pod UID of the instance that started preparing it; "": one instance only (a start rolls it back).
    owner: str = attrs.field(default="", metadata=lenient(lambda v: len(v) <= 64))
    # Prepared with ``device_metadata: true``: files below the kubelet's plugins folder to remove.
    # A record without it (an earlier cdiplug's) may have them.
    device_metadata: bool = attrs.field(default=True, metadata=lenient())

    @property
    def completed(self) -> bool:
        return self.state is ClaimState.COMPLETED


# -- decoding (lenient: :mod:`cdiplug.toolkit.stateconv`) -----------------------------------------

_conv = stateconv.converter()
# Pairs of two strings; any other entry is left out (a file of another cdiplug).
_conv.register_structure_hook_func(
    lambda t: t == tuple[tuple[str, str], ...],
    lambda v, _: (
        tuple((p[0], p[1]) for p in v if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p))
        if isinstance(v, list)
        else ()
    ),
)


def _claim(uid: str, data: Any, version: int) -> PreparedClaim:
    what = f"claims[{brief(uid)}]"
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a mapping")
    # Version 1 recorded claims only once complete; version 2 must say how far a claim got.
    state = ClaimState.COMPLETED.value if version == 1 else data.get("state")
    return stateconv.structure(_conv, {**data, "uid": uid, "state": state}, PreparedClaim, what)


@frozen
class Decoded:
    """A checkpoint read: its claims, the version it had, and the claims that had to be dropped."""

    claims: dict[str, PreparedClaim]
    version: int = VERSION
    dropped: tuple[str, ...] = ()  # reasons, one per claim


def decode(text: bytes) -> Decoded:
    """The claims in a checkpoint file (any version this code knows); ValueError when it is none."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(data, Mapping):
        raise ValueError("not a JSON object")
    version = data.get("version")
    if version not in (1, VERSION):
        raise ValueError(f"version {brief(version)} is not one this cdiplug reads (1 or {VERSION})")
    claims = data.get("claims", {})
    if not isinstance(claims, Mapping):
        raise ValueError("claims must be a mapping")
    out: dict[str, PreparedClaim] = {}
    dropped: list[str] = []
    for uid, record in claims.items():
        try:
            out[uid] = _claim(uid, record, version)
        except ValueError as exc:
            dropped.append(str(exc))
    return Decoded(out, version, tuple(dropped))


def parse(text: bytes) -> dict[str, PreparedClaim]:
    """The claims in a checkpoint file; ValueError naming the first unusable one."""
    decoded = decode(text)
    if decoded.dropped:
        raise ValueError(decoded.dropped[0])
    return decoded.claims


# -- encoding --------------------------------------------------------------------------------------


def _record(claim: PreparedClaim) -> dict[str, Any]:
    record: dict[str, Any] = _conv.unstructure(claim)
    del record["uid"]
    # How a device was shaped, and its share, are written only where they are not a plain
    # preparation of a whole device (the defaults): such a record stays as earlier cdiplug wrote it.
    record["devices"] = [stateconv.without_lenient_defaults(d, PreparedDevice) for d in record["devices"]]
    return record


Lines = dict[str, tuple[PreparedClaim, bytes]]  # uid -> a claim and its rendered line


def render(claims: Mapping[str, PreparedClaim], lines: Lines | None = None) -> bytes:
    """The file: one claim a line (compact JSON, keys sorted), in UID order.

    ``lines`` keeps the lines rendered before: a claim that is the same object as then is not
    rendered again (with many claims held, a change renders one claim, not all).
    """
    lines = {} if lines is None else lines
    out = []
    for uid in sorted(claims):
        claim = claims[uid]
        cached = lines.get(uid)
        if cached is None or cached[0] is not claim:
            cached = claim, json.dumps({uid: _record(claim)}, sort_keys=True, separators=(",", ":"))[1:-1].encode()
            lines[uid] = cached
        out.append(cached[1])
    for uid in lines.keys() - claims.keys():
        del lines[uid]
    return b'{"version":%d,"claims":{\n%s\n}}\n' % (VERSION, b",\n".join(out))
