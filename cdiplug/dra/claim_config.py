"""A claim's opaque configuration and admin access, turned into how each of its devices is prepared.

The scheduler copies the opaque entries for our driver from the DeviceClasses and the claim into
``status.allocation.devices.config``; :mod:`.claims` gives them in precedence order (class before
claim, then the claim's order). Here, per device of a claim (the requests it serves):

- every entry that applies is decoded on its own (types and unknown keys), strictly, with the one cattrs converter into
  the backend's parameters class (:class:`~cdiplug.backend.ClaimConfigurable`): unknown keys,
  wrong types and bad values are errors; ``apiVersion`` must be :data:`API_VERSION` and ``kind``
  the backend's (``FakeConfig``, ``PciConfig``, ``NvidiaConfig``), both required, as the reference
  drivers' ``GpuConfig`` is;
- the entries are merged, later over earlier, field by field (a mapping such as ``env`` key by
  key), and the merge decoded and checked again (checks across fields);
- the backend's ``configure`` shapes the device (:class:`~cdiplug.backend.Configured`).

An allocation result with ``adminAccess: true`` is for monitoring: its device is not prepared
(no VFIO bind), gets ``CDIPLUG_ADMIN_ACCESS=true`` in its CDI device, and is never released by
the claim's unprepare nor counted as holding the device for another claim's.

Every error is an :class:`~cdiplug.errors.InvalidRequest` naming the field, the claim and the
request (``unknown field "shairng" @ $.parameters (claim default/gpu-claim, request gpu)``): it
fails that claim's prepare alone. An entry for our driver whose backend has no configuration is
an error too, never silently ignored. Pure (no I/O) but for :func:`prepare`, which goes through
the host's preparations, and :func:`check_unchanged`, which reads the claim again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import cattrs

from cdiplug.backend import CheckedOptions, ClaimConfigurable, Configured
from cdiplug.dra import shares
from cdiplug.dra.checkpoint import PreparedClaim
from cdiplug.dra.claims import AllocatedClaim, AllocatedDevice, ClaimRef, ConfigEntry
from cdiplug.errors import InvalidRequest
from cdiplug.host.preparations import Preparations
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot
from cdiplug.toolkit.brief import brief
from cdiplug.toolkit.strict import converter

log = logging.getLogger(__name__)

API_VERSION = "cdiplug.dev/v1alpha1"
ADMIN_ENV = "CDIPLUG_ADMIN_ACCESS"
_TYPE_KEYS = ("apiVersion", "kind")


def _format(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return ", ".join(f'unknown field "{brief(k)[1:-1]}"' for k in sorted(exc.extra_fields))
    if isinstance(exc, ValueError) and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return cattrs.v.format_exception(exc, type_)


def _where(ref: ClaimRef, request: str) -> str:
    return f"(claim {ref.namespace}/{ref.name}, request {request})"


def decode(
    parameters: Mapping[str, Any],
    config_type: type[Any],
    kind: str,
    ref: ClaimRef,
    request: str,
    check_type: bool = True,
    check_values: bool = True,
    where: str | None = None,
) -> Any:
    """``parameters`` as ``config_type``; InvalidRequest naming the field, the claim and the request.

    ``check_type``: apiVersion and kind are checked (each entry has them, the merge not);
    ``check_values``: the checks across fields (``problems()``; the merge only: one entry may
    set what another's fields need); ``where``: the object named in the errors, if not the claim
    (the admission webhook names a ResourceClaimTemplate or a DeviceClass)."""
    where = where or _where(ref, request)
    if check_type:
        for key, want in zip(_TYPE_KEYS, (API_VERSION, kind)):
            got = parameters.get(key)
            if got is None:
                raise InvalidRequest(f"{key} is required ({want}) @ $.parameters.{key} {where}")
            if got != want:
                raise InvalidRequest(f"expected {want}, got {brief(got)} @ $.parameters.{key} {where}")
    body = {k: v for k, v in parameters.items() if k not in _TYPE_KEYS}
    try:
        value = converter.structure(body, config_type)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        first = cattrs.transform_error(exc, path="$.parameters", format_exception=_format)[0]
        raise InvalidRequest(f"{first} {where}") from exc
    for name, problem in value.problems() if check_values and isinstance(value, CheckedOptions) else ():
        raise InvalidRequest(f"{problem} @ $.parameters.{name} {where}")
    return value


def merge(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of ``entries`` merged, later over earlier; mappings key by key."""
    out: dict[str, Any] = {}
    for entry in entries:
        _merge_into(out, entry)
    return out


def _merge_into(out: dict[str, Any], entry: Mapping[str, Any]) -> None:
    for key, value in entry.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            _merge_into(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = {}  # a copy: the entries (checkpointed as they were) are never changed
            _merge_into(out[key], value)
        else:
            out[key] = value


def device_config(
    entries: Sequence[ConfigEntry], configurable: ClaimConfigurable[Any], resource: str, ref: ClaimRef, request: str
) -> Any:
    """The merged, decoded parameters of ``entries`` (lowest precedence first) for one request."""
    config_type = configurable.claim_config_type(resource)
    kind = configurable.claim_config_kind(resource)
    for entry in entries:
        decode(entry.parameters, config_type, kind, ref, request, check_values=False)
    merged = merge([e.parameters for e in entries])
    return decode(merged, config_type, kind, ref, request, check_type=False)


def admin(resource: str, device: Device, configurable: ClaimConfigurable[Any] | None) -> Configured:
    """An admin-access device: shaped by the backend (its default: as it is), never prepared nor
    released, marked in its env."""
    shaped = configurable.admin_access(resource, device) if configurable is not None else Configured(device)
    if shaped.device.id != device.id:
        raise InvalidRequest(f"the backend of resource {resource} gave another device than {device.id} for admin access")
    edits = shaped.device.edits.merge(ContainerEdits(env={ADMIN_ENV: "true"}))
    return attrs.evolve(shaped, device=attrs.evolve(shaped.device, edits=edits), prepare=False, release=False)


def configure(
    claim: AllocatedClaim, wanted: Mapping[str, Device], resource: str, configurable: ClaimConfigurable[Any] | None
) -> dict[str, Configured]:
    """How each device of ``claim`` (slice name -> device) is prepared; InvalidRequest when its
    configuration is wrong or there is configuration but the backend takes none."""
    requests: dict[str, list[str]] = {}
    admin_only: dict[str, bool] = {}
    for r in claim.results:
        entry = shares.entry_name(r.device, r.share_id)  # a device, or one share of it
        requests.setdefault(entry, []).append(r.request)
        admin_only[entry] = admin_only.get(entry, True) and r.admin_access
    out: dict[str, Configured] = {}
    for name, device in wanted.items():
        served = requests.get(name, [])
        entries = tuple(c for c in claim.configs if any(c.applies_to(r) for r in served))
        shaped = Configured(device)
        if entries:
            label = ", ".join(served)
            if configurable is None:
                raise InvalidRequest(
                    f"the backend of resource {resource} takes no claim configuration, yet "
                    f"{len(entries)} entr{'y names' if len(entries) == 1 else 'ies name'} its driver {_where(claim.ref, label)}"
                )
            params = device_config(entries, configurable, resource, claim.ref, label)
            try:
                shaped = configurable.configure(resource, device, params)
            except InvalidRequest as exc:
                raise InvalidRequest(f"{exc} {_where(claim.ref, label)}") from exc
            if shaped.device.id != device.id:
                raise InvalidRequest(f"the backend of resource {resource} configured another device than {device.id}")
        # A device every request of which asks admin access is for monitoring only.
        out[name] = admin(resource, shaped.device, configurable) if admin_only.get(name) else shaped
    return out


def recorded_claim(record: PreparedClaim) -> AllocatedClaim:
    """The claim as its checkpoint record has it (restore: the configuration it was prepared with)."""
    results = tuple(
        AllocatedDevice(
            request=r,
            pool=d.pool,
            device=d.device,
            share_id=d.share_id,
            consumed_capacity=d.consumed_capacity,
            admin_access=d.admin_access,
        )
        for d in record.devices
        for r in d.request_names or ("",)
    )
    return AllocatedClaim(ClaimRef(record.namespace, record.name, record.uid), results, record.configs)


def admin_devices(claim: AllocatedClaim) -> set[str]:
    """The devices every request of which asks admin access (monitoring only)."""
    admin: dict[str, bool] = {}
    for r in claim.results:
        entry = shares.entry_name(r.device, r.share_id)
        admin[entry] = admin.get(entry, True) and r.admin_access
    return {d for d, a in admin.items() if a}


def for_claim(snapshot: DeviceSnapshot, shapes: Mapping[str, Configured]) -> DeviceSnapshot:
    """The snapshot whose common edits the claim's spec gets: none when no device needs them."""
    if any(s.common_edits for s in shapes.values()) or snapshot.common_edits.is_empty():
        return snapshot
    return attrs.evolve(snapshot, common_edits=ContainerEdits())


async def prepare(
    preparations: Preparations,
    resource: str,
    claim: AllocatedClaim,
    wanted: Mapping[str, Device],
    shapes: Mapping[str, Configured],
    configurable: ClaimConfigurable[Any] | None,
) -> list[Device]:
    """The devices of ``wanted`` as the claim's spec gives them: those to prepare prepared through
    the host (as the snapshot has them, so the host's memory of preparations holds), then shaped
    again as prepared (a bind adds device nodes the configuration may leave out)."""
    todo = [n for n in wanted if shapes[n].prepare]
    unique = shares.unique(wanted[n] for n in todo)  # two shares of one device: prepared once
    by_id = dict(zip([d.id for d in unique], await preparations.prepare(resource, unique))) if unique else {}
    done = {n: by_id[wanted[n].id] for n in todo}
    if not done:
        return [shapes[n].device for n in wanted]
    again = configure(claim, {n: done.get(n, d) for n, d in wanted.items()}, resource, configurable)
    return [again[n].device for n in wanted]


async def check_unchanged(read: Callable[[], Awaitable[AllocatedClaim]], ref: ClaimRef, done: PreparedClaim) -> None:
    """A repeated prepare of a completed claim prepared with a configuration: InvalidRequest when
    the claim's is no longer that one (deallocated and allocated again meanwhile, the UID kept).

    The prepare reads only claims prepared with a configuration again: an allocation is immutable
    in the API. When the claim cannot be read (the API server down, the claim gone), the
    checkpoint answers: the kubelet's retry never depends on the API server."""
    try:
        claim = await read()
    except Exception as exc:
        log.debug("claim %s: answered from the checkpoint, the claim cannot be read again: %s", ref, exc)
        return
    if claim.configs != done.configs:
        raise InvalidRequest(
            f"ResourceClaim {ref} was prepared with another configuration ({len(done.configs)} entries for "
            f"{done.driver}) than it has now ({len(claim.configs)}): the kubelet must unprepare it first"
        )
