"""What a fake device can be beyond one whole device: shared with capacity, or cut into partitions (DRA).

Options of a fake resource (``backends/fake/__init__.py``):

- ``shared: true``: each device may be allocated to several claims at once (KEP-5075,
  ``allowMultipleAllocations``); the scheduler packs claims onto it by their ``capacity``
  requests and refuses once a capacity is used up;
- ``capacity``: capacity name -> a quantity (``memory: 80Gi``) or, for a shared device, a
  mapping with the ``value`` and its request policy: ``default`` (what a claim asking none
  takes), then either ``valid_values`` (ascending) or ``min`` with optional ``max`` and
  ``step``. A container learns what its share consumed in ``FAKE_<CLASS>_<CAPACITY>_<N>``
  (``FAKE_GPU_MEMORY_0=30Gi``);
- ``partitions``: the profiles each device is cut into, as how many equal parts: ``[1, 2, 4]``
  publishes the whole device (``gpu-0``), its halves (``gpu-0-1of2``, ``gpu-0-2of2``) and its
  quarters (``gpu-0-1of4`` …). The device's slices are a counter set of their own
  (``gpu-0-slices``: ``slice-0`` … one per part of the finest profile) that every partition
  consumes its share of (KEP-4815), so allocating one partition excludes every partition that
  overlaps it. Each profile divides the finest, which is at most 32 parts (the API's counters
  per set). Under the device-plugin API, whose devices cannot overlap, only whole devices are
  advertised.

Everything is checked when the configuration loads (:func:`problems`), naming the option.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from attrs import frozen

from cdiplug.sdk import ContainerEdits, CounterConsumption, CounterSet, Device, DeviceSharing, RequestPolicy, converter

if TYPE_CHECKING:
    from fractions import Fraction

MAX_PARTS = 32  # counters per counter set (resource.k8s.io/v1)
MAX_VALID_VALUES = 10  # the API's limit

_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?")
_SUFFIX: dict[str | None, tuple[int, int]] = {  # suffix -> (multiplier, divisor)
    None: (1, 1),
    "m": (1, 1000),
    **{s: (1000**i, 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"), 1)},
    **{s: (1024**i, 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}
_CAPACITY_NAME = re.compile(r"[a-z]([a-z0-9_]{0,30}[a-z0-9])?")


def quantity(text: str) -> Fraction | None:
    """A Kubernetes quantity (``80Gi``, ``1.5``, ``500m``) as a number; None when it is none we take."""
    # Imported here: fractions (and decimal, which it imports) are half a MiB of memory that a
    # daemon without capacities never needs.
    from fractions import Fraction

    m = _QUANTITY.fullmatch(text)
    if m is None or len(text) > 32:
        return None
    multiplier, divisor = _SUFFIX[m.group(2)]
    amount: Fraction = Fraction(m.group(1)) * multiplier / divisor
    return amount


@frozen
class CapacityOption:
    """One capacity of each device: its amount and, when shared, how claims may consume it."""

    value: str  # the amount each device has (a quantity: 80Gi)
    default: str | None = None  # what a claim that asks for none takes
    valid_values: tuple[str, ...] = ()  # the amounts a claim may ask for, ascending (or min/max/step)
    min: str | None = None  # the least a claim may ask for
    max: str | None = None  # the most a claim may ask for
    step: str | None = None  # what a request is rounded up to a multiple of, above min

    @property
    def policy(self) -> RequestPolicy | None:
        if self.default is None and not self.valid_values and self.min is None:
            return None
        return RequestPolicy(self.default, self.valid_values, self.min, self.max, self.step)

    def problems(self, shared: bool) -> Iterator[tuple[str, str]]:
        amounts: dict[str, Fraction] = {}
        for key in ("value", "default", "min", "max", "step"):
            text = getattr(self, key)
            if text is None:
                continue
            amount = quantity(text)
            if amount is None:
                yield key, f"must be a quantity such as 80Gi or 4, got {text!r}"
                return
            amounts[key] = amount
        values: list[Fraction] = []
        for i, text in enumerate(self.valid_values):
            value = quantity(text)
            if value is None:
                yield f"valid_values[{i}]", f"must be a quantity such as 80Gi or 4, got {text!r}"
                return
            values.append(value)
        if self.policy is not None and not shared:
            yield "default", "a request policy needs shared: true (a device given whole has no shares)"
        if self.valid_values and self.min is not None:
            yield "valid_values", "give either valid_values or min/max/step, not both"
        if len(values) > MAX_VALID_VALUES or values != sorted(set(values)):
            yield "valid_values", f"must be ascending, each once, at most {MAX_VALID_VALUES}"
        if (self.max is not None or self.step is not None) and self.min is None:
            yield "min", "max and step need min"
        if self.policy is not None and self.default is None:
            yield "default", "valid_values and min need a default (what a claim asking none consumes)"
        default = amounts.get("default")
        if default is not None:
            if values and default not in values:
                yield "default", f"must be one of valid_values, got {self.default}"
            low, high = amounts.get("min"), amounts.get("max", amounts["value"])
            if low is not None and not low <= default <= high:
                yield "default", f"must be between min and max, got {self.default}"
            if low is not None and "step" in amounts and (default - low) % amounts["step"]:
                yield "default", f"must be min plus a whole number of steps, got {self.default}"
        if any(a > amounts["value"] for k, a in amounts.items() if k != "value") or any(
            v > amounts["value"] for v in values if v
        ):
            yield "value", f"is less than the policy's amounts ({self.value})"


def _capacity_hook() -> Any:
    inner = converter.get_structure_hook(CapacityOption)

    def hook(value: Any, type_: Any) -> CapacityOption:
        if isinstance(value, str):  # memory: 80Gi
            return CapacityOption(value)
        return inner(value, type_)  # type: ignore[no-any-return]

    return hook


converter.register_structure_hook(CapacityOption, _capacity_hook())


def problems(shared: bool, capacity: Mapping[str, CapacityOption], partitions: tuple[int, ...]) -> Iterator[tuple[str, str]]:
    """The options' problems as (option path, message)."""
    for name, option in capacity.items():
        if not _CAPACITY_NAME.fullmatch(name):
            yield f"capacity.{name}", "capacity names are lower-case letters, digits and '_', at most 32"
            continue
        for key, message in option.problems(shared):
            yield f"capacity.{name}.{key}", message
    if partitions:
        finest = max(partitions)
        if shared:
            yield "partitions", "a device is either shared or cut into partitions, not both"
        if len(set(partitions)) != len(partitions) or min(partitions) < 1 or finest > MAX_PARTS:
            yield "partitions", f"profiles are distinct part counts between 1 and {MAX_PARTS}, got {list(partitions)}"
        elif any(finest % p for p in partitions):
            yield "partitions", f"each profile must divide the finest ({finest}), got {list(partitions)}"


def counter_set(whole: str, partitions: tuple[int, ...]) -> CounterSet:
    return CounterSet(f"{whole}-slices", {f"slice-{k}": "1" for k in range(max(partitions))})


def partitions_of(whole: Device, partitions: tuple[int, ...], env_key: str) -> list[Device]:
    """The partitions of ``whole`` (itself for profile 1), each consuming its slices of the device's counter set."""
    finest = max(partitions)
    counters = counter_set(whole.id, partitions).name
    out = []
    for parts in sorted(partitions):
        size = finest // parts
        for k in range(parts):
            used = CounterConsumption(counters, {f"slice-{j}": "1" for j in range(k * size, (k + 1) * size)})
            ident = whole.id if parts == 1 else f"{whole.id}-{k + 1}of{parts}"
            edits = whole.edits if parts == 1 else ContainerEdits(env={f"{env_key}_{k + 1}OF{parts}": ident})
            attributes = (*whole.attributes, ("whole", whole.id), ("parts", parts))
            sharing = DeviceSharing(consumes_counters=[used])
            out.append(Device(ident, whole.health, whole.numa_nodes, edits, attributes=attributes, sharing=sharing))
    return out
