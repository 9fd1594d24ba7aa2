"""The NVIDIA backend's per-claim configuration (DRA opaque parameters, ``kind: NvidiaConfig``).

Shaped as NVIDIA's DRA driver's ``GpuConfig`` (``resource.nvidia.com/v1beta1``: the same field
names), under our ``apiVersion: cdiplug.dev/v1alpha1`` and the kind the design contract names::

    apiVersion: cdiplug.dev/v1alpha1
    kind: NvidiaConfig
    sharing:
      strategy: TimeSlicing            # or MPS
      timeSlicingConfig:
        interval: Medium               # Default | Short | Medium | Long: declared, not applied
        maxConnections: 4              # CUDA_DEVICE_MAX_CONNECTIONS (1-32)
      mpsConfig:
        defaultActiveThreadPercentage: 50      # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (1-100)
        defaultPinnedDeviceMemoryLimit: 10Gi   # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M

Everything is applied through the container's env in the claim's CDI spec; cdiplug never
changes a GPU's settings. What NVIDIA's driver does beyond that, and cdiplug does not:

- time-slicing: it sets the GPU's compute mode to DEFAULT and its time slice
  (``nvidia-smi compute-policy --set-timeslice``), a setting of the GPU for every process on it.
  Here the interval is only declared (``CDIPLUG_GPU_TIMESLICE_INTERVAL``) for the workload and
  monitoring to read; the GPU keeps the time slice it has.
- MPS: it sets the compute mode to EXCLUSIVE_PROCESS and starts an MPS control daemon per claim
  (a Deployment), mounting its pipe folder and ``/dev/shm`` into the containers; the limits are
  the daemon's defaults. Here the limits are the client-side variables CUDA reads at context
  creation; they take effect only where an MPS control daemon already serves the container
  (``CUDA_MPS_PIPE_DIRECTORY``, set by whoever runs it); cdiplug starts none. The memory limit
  is given for device ordinal 0, the first GPU the container sees: a claim's other GPUs are not
  limited (a per-device config with ``requests`` can name them one request each).

Every setting also shows as ``CDIPLUG_GPU_SHARING=<strategy>``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from attrs import evolve, frozen
from cattrs.gen import make_dict_structure_fn, override

from cdiplug.sdk import CheckedOptions, Configured, ContainerEdits, Device, converter, register_enum

from .options import MemorySize

KIND = "NvidiaConfig"


class Strategy(str, enum.Enum):
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class Interval(str, enum.Enum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


register_enum(Strategy)
register_enum(Interval)


@frozen
class TimeSlicing:
    interval: Interval = Interval.DEFAULT
    max_connections: int | None = None


@frozen
class Mps:
    active_thread_percentage: int | None = None
    pinned_memory_limit: MemorySize | None = None


@frozen
class Sharing:
    strategy: Strategy = Strategy.TIME_SLICING
    time_slicing: TimeSlicing | None = None
    mps: Mps | None = None


@frozen
class GpuClaimConfig(CheckedOptions):
    sharing: Sharing | None = None

    def problems(self) -> Iterator[tuple[str, str]]:
        s = self.sharing
        if s is None:
            return
        if s.strategy is Strategy.TIME_SLICING and s.mps is not None:
            yield "sharing.mpsConfig", "is for strategy MPS, not TimeSlicing"
        if s.strategy is Strategy.MPS and s.time_slicing is not None:
            yield "sharing.timeSlicingConfig", "is for strategy TimeSlicing, not MPS"
        ts = s.time_slicing
        if ts is not None and ts.max_connections is not None and not 1 <= ts.max_connections <= 32:
            yield "sharing.timeSlicingConfig.maxConnections", f"must be between 1 and 32, got {ts.max_connections}"
        mps = s.mps
        if mps is not None and mps.active_thread_percentage is not None and not 1 <= mps.active_thread_percentage <= 100:
            yield (
                "sharing.mpsConfig.defaultActiveThreadPercentage",
                f"must be between 1 and 100, got {mps.active_thread_percentage}",
            )
        if mps is not None and mps.pinned_memory_limit is not None and mps.pinned_memory_limit < 1 << 20:
            yield "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", "must be at least 1Mi"


# The parameters are camelCase, as NVIDIA's GpuConfig; the attributes are Python's.
converter.register_structure_hook(
    TimeSlicing,
    make_dict_structure_fn(
        TimeSlicing, converter, _cattrs_forbid_extra_keys=True, max_connections=override(rename="maxConnections")
    ),
)
converter.register_structure_hook(
    Mps,
    make_dict_structure_fn(
        Mps,
        converter,
        _cattrs_forbid_extra_keys=True,
        active_thread_percentage=override(rename="defaultActiveThreadPercentage"),
        pinned_memory_limit=override(rename="defaultPinnedDeviceMemoryLimit"),
    ),
)
converter.register_structure_hook(
    Sharing,
    make_dict_structure_fn(
        Sharing,
        converter,
        _cattrs_forbid_extra_keys=True,
        time_slicing=override(rename="timeSlicingConfig"),
        mps=override(rename="mpsConfig"),
    ),
)


def sharing_env(config: GpuClaimConfig) -> dict[str, str]:
    """The env a claim's configuration gives each of its GPUs."""
    s = config.sharing
    if s is None:
        return {}
    env = {"CDIPLUG_GPU_SHARING": s.strategy.value}
    if s.strategy is Strategy.TIME_SLICING:
        ts = s.time_slicing or TimeSlicing()
        env["CDIPLUG_GPU_TIMESLICE_INTERVAL"] = ts.interval.value
        if ts.max_connections is not None:
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(ts.max_connections)
    else:
        mps = s.mps or Mps()
        if mps.active_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps.active_thread_percentage)
        if mps.pinned_memory_limit is not None:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={int(mps.pinned_memory_limit) >> 20}M"
    return env


def configure(device: Device, config: GpuClaimConfig) -> Configured:
    env = sharing_env(config)
    if not env:
        return Configured(device)
    return Configured(evolve(device, edits=device.edits.merge(ContainerEdits(env=env))))
