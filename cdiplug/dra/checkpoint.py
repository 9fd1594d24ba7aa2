"""Prepared claims, checkpointed in ``--state-dir``: what a restarted daemon needs to unprepare.

:class:`ClaimStore` keeps every claim the DRA front end prepared (all drivers, one file
``dra-claims.json``) in memory and on disk. Each change rewrites the file atomically
(:func:`cdiplug.atomic.write_atomic`, in a thread); a claim is added after its devices are
prepared and its CDI spec written, and removed after its spec is gone and its devices released,
so a crash in between leaves work to redo, never a claim forgotten while its devices are held.

A file that cannot be parsed or fails validation is moved aside (``dra-claims.json.corrupt``)
with the reason logged, and the store starts empty: the kubelet prepares its claims again.

The boundary: values and the file; what a claim means is :mod:`.prepare`'s business.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from ..atomic import write_atomic
from ..errors import CdiplugError, InputError
from ..files import read_bounded

log = logging.getLogger(__name__)

FILE_NAME = "dra-claims.json"
VERSION = 1
FILE_MODE = 0o600
LIMIT = 64 << 20  # some hundred thousand claims; a bigger file is not ours


@frozen
class PreparedDevice:
    """One device of a prepared claim, as answered to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str  # the device's name in the slice
    device_id: str  # the backend's ID
    cdi_ids: tuple[str, ...]
    prepare_group: str | None = None


@frozen
class PreparedClaim:
    """A claim prepared by one driver: its devices and the CDI spec file written for it."""

    uid: str
    namespace: str
    name: str
    driver: str
    resource: str
    devices: tuple[PreparedDevice, ...]
    spec_file: str  # a file name in the CDI folder; empty when the claim has no devices


def _strs(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def _str(data: Mapping[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{what}.{key} must be a string")
    return value


def _device(data: Any, what: str) -> PreparedDevice:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a mapping")
    group = data.get("prepare_group")
    if group is not None and not isinstance(group, str):
        raise ValueError(f"{what}.prepare_group must be a string or null")
    return PreparedDevice(
        request_names=_strs(data.get("request_names"), f"{what}.request_names"),
        pool=_str(data, "pool", what),
        device=_str(data, "device", what),
        device_id=_str(data, "device_id", what),
        cdi_ids=_strs(data.get("cdi_ids"), f"{what}.cdi_ids"),
        prepare_group=group,
    )


def _claim(uid: str, data: Any) -> PreparedClaim:
    what = f"claims[{uid!r}]"
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a mapping")
    devices = data.get("devices")
    if not isinstance(devices, list):
        raise ValueError(f"{what}.devices must be a list")
    spec_file = _str(data, "spec_file", what)
    if "/" in spec_file or spec_file in (".", ".."):
        raise ValueError(f"{what}.spec_file must be a file name")
    return PreparedClaim(
        uid=uid,
        namespace=_str(data, "namespace", what),
        name=_str(data, "name", what),
        driver=_str(data, "driver", what),
        resource=_str(data, "resource", what),
        devices=tuple(_device(d, f"{what}.devices[{i}]") for i, d in enumerate(devices)),
        spec_file=spec_file,
    )


def parse(text: bytes) -> dict[str, PreparedClaim]:
    """The claims in a checkpoint file; ValueError naming the first problem."""
    data = json.loads(text)
    if not isinstance(data, Mapping) or data.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} checkpoint")
    claims = data.get("claims")
    if not isinstance(claims, Mapping):
        raise ValueError("claims must be a mapping")
    return {str(uid): _claim(str(uid), c) for uid, c in claims.items()}


def render(claims: Mapping[str, PreparedClaim]) -> bytes:
    out = {
        "version": VERSION,
        "claims": {uid: {k: v for k, v in attrs.asdict(c).items() if k != "uid"} for uid, c in sorted(claims.items())},
    }
    return (json.dumps(out, indent=1, sort_keys=True) + "\n").encode()


def load(path: Path) -> dict[str, PreparedClaim]:
    """Read the checkpoint (blocking); a missing file is empty, a corrupt one is moved aside.

    Read bounded (:data:`LIMIT`), a symlink planted in the state folder refused: such a file is
    corrupt too.
    """
    try:
        text = read_bounded(path, LIMIT, "DRA checkpoint", follow=False, missing_ok=True)
        if text is None:
            return {}
        return parse(text)
    except (ValueError, UnicodeDecodeError, InputError) as exc:
        aside = path.with_name(path.name + ".corrupt")
        try:
            os.replace(path, aside)
        except OSError as move_exc:
            raise CdiplugError(f"the DRA checkpoint {path} is corrupt ({exc}) and cannot be moved aside: {move_exc}") from exc
        log.error("the DRA checkpoint %s is corrupt (%s); moved to %s, starting with no prepared claims", path, exc, aside)
        return {}


def save(path: Path, claims: Mapping[str, PreparedClaim]) -> None:
    """Write the checkpoint atomically (blocking)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, render(claims), FILE_MODE)
    except OSError as exc:
        raise CdiplugError(f"cannot write the DRA checkpoint {path}: {exc.strerror or exc}") from exc


class ClaimStore:
    """Every prepared claim, in memory and in ``<state_dir>/dra-claims.json``."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self._claims: dict[str, PreparedClaim] = {}
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        self._claims = await asyncio.to_thread(load, self.path)

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def all(self) -> list[PreparedClaim]:
        return list(self._claims.values())

    async def put(self, claim: PreparedClaim) -> None:
        async with self._lock:
            claims = {**self._claims, claim.uid: claim}
            await asyncio.to_thread(save, self.path, claims)
            self._claims = claims

    async def remove(self, uid: str) -> None:
        async with self._lock:
            if uid not in self._claims:
                return
            claims = {k: v for k, v in self._claims.items() if k != uid}
            await asyncio.to_thread(save, self.path, claims)
            self._claims = claims
