"""How DRA shares devices between claims: the device data only the DRA front end reads.

Two ways of sharing, both published in the ResourceSlices (the device-plugin API has neither):

- a **shared device** may be allocated to several claims at once, each consuming part of its
  capacities (KEP-5075, "consumable capacity"): :class:`DeviceSharing` with ``shared``, a
  :class:`RequestPolicy` per capacity and the env variable through which a container learns
  what its share consumed;
- **partitions** of a whole device (MIG devices, slices of an FPGA) each consume counters of the
  whole device's :class:`CounterSet` (KEP-4815, "partitionable devices"), so that the scheduler
  never hands out two partitions that overlap: :class:`DeviceSharing` with ``consumes_counters``
  on each partition, the counter sets in the snapshot's :class:`PoolSharing`.

A backend attaches them as ``Device.sharing`` and ``DeviceSnapshot.sharing`` (None: a device
given whole to one claim, a pool without partitions). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from attrs import field, frozen

from cdiplug.models.pairs import str_pairs


@frozen
class RequestPolicy:
    """How claims may consume one capacity of a shared device (DRA's ``requestPolicy``, KEP-5075).

    Quantities are Kubernetes quantities as text (``1Gi``). ``default`` is what a claim that asks
    for none consumes; either ``valid_values`` (ascending; a request is rounded up to the next) or
    a range (``min``, optional ``max`` and ``step``) limits what a claim may ask. All empty: any
    amount up to what is left.
    """

    default: str | None = None
    valid_values: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    min: str | None = None
    max: str | None = None
    step: str | None = None


def _policy_tuple(
    value: Mapping[str, RequestPolicy] | Iterable[tuple[str, RequestPolicy]],
) -> tuple[tuple[str, RequestPolicy], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), v) for k, v in items)


@frozen
class CounterConsumption:
    """What a partition takes from a counter set of its whole device (KEP-4815): counter -> amount."""

    counter_set: str
    counters: tuple[tuple[str, str], ...] = field(converter=str_pairs)


@frozen
class CounterSet:
    """A whole device's shared counters (slices of it, its memory), which its partitions consume."""

    name: str
    counters: tuple[tuple[str, str], ...] = field(converter=str_pairs)


@frozen
class DeviceSharing:
    """How DRA shares one device (``Device.sharing``).

    With ``shared`` the device may be allocated to several claims at once, each consuming part of
    its capacities (``Device.capacity``) as ``capacity_policies`` (capacity name ->
    :class:`RequestPolicy`) allow; without it the policies are not published. ``capacity_env``
    (capacity name -> env variable) names the variable through which a container learns what its
    share consumed. A partition lists the counters it takes from its whole device's
    :class:`CounterSet` in ``consumes_counters``.
    """

    shared: bool = False
    capacity_policies: tuple[tuple[str, RequestPolicy], ...] = field(default=(), converter=_policy_tuple)
    capacity_env: tuple[tuple[str, str], ...] = field(default=(), converter=str_pairs)
    consumes_counters: tuple[CounterConsumption, ...] = field(default=(), converter=tuple[CounterConsumption, ...])


@frozen
class PoolSharing:
    """What the devices of one snapshot share (``DeviceSnapshot.sharing``): the counter sets of
    partitionable devices, which partitions among the snapshot's devices consume."""

    counter_sets: tuple[CounterSet, ...] = field(default=(), converter=tuple[CounterSet, ...])


NOT_SHARED = DeviceSharing()
"""A device given whole to one claim (what ``Device.sharing`` None means)."""
NOTHING_SHARED = PoolSharing()
"""A pool without partitions (what ``DeviceSnapshot.sharing`` None means)."""


def device_sharing(value: DeviceSharing | None) -> DeviceSharing | None:
    """``Device.sharing`` as kept: None for nothing shared, so that equal devices compare equal."""
    return None if value is None or value == NOT_SHARED else value


def pool_sharing(value: PoolSharing | None) -> PoolSharing | None:
    """``DeviceSnapshot.sharing`` as kept: None for nothing shared."""
    return None if value is None or value == NOTHING_SHARED else value
