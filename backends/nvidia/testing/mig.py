"""FakeNvml's MIG: the pynvml calls about MIG devices that already exist, and the files that go with them.

:class:`MigCalls` is mixed into :class:`~cdiplug_backends.nvidia.testing.nvml.FakeNvml`: a GPU with
MIG mode on (``FakeGpu.mig_mode``) answers ``nvmlDeviceGetMaxMigDeviceCount`` and hands out a
handle per :class:`~cdiplug_backends.nvidia.testing.machines.FakeMig`
(``nvmlDeviceGetMigDeviceHandleByIndex``; an empty index is NOT_FOUND, as NVML says), whose UUID,
memory, GPU/compute instance IDs and attributes (slices, memory in MiB) it answers as NVML does;
a GPU with MIG off has none (INVALID_ARGUMENT). :meth:`MigCalls.write_mig_files` lays out what the
NVIDIA driver makes for them: ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>[/ci<c>]/access``
(``DeviceFileMinor: N``) and the ``/dev/nvidia-caps/nvidia-cap<N>`` nodes, under a dev root.
Nothing here creates or destroys MIG devices: neither does cdiplug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import frozen

from .machines import FakeGpu, FakeMig
from .values import NVML_DEVICE_MIG_ENABLE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, MemoryInfo, NVMLError


@frozen(eq=False)
class MigHandle:
    """An opaque MIG device handle, compared by identity like a C pointer."""

    parent: int  # the GPU's index
    index: int

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t MIG {self.parent}/{self.index}>"


@frozen
class DeviceAttributes:
    """pynvml's c_nvmlDeviceAttributes (the fields cdiplug reads)."""

    multiprocessorCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int


class MigCalls:
    """The MIG part of FakeNvml (see the module docstring)."""

    gpus: list[FakeGpu]
    _mig_handles: dict[tuple[int, int], MigHandle]

    def _gpu(self, name: str, handle: Any) -> FakeGpu:
        raise NotImplementedError  # FakeNvml's

    def _mig(self, name: str, handle: Any) -> FakeMig:
        if not isinstance(handle, MigHandle) or self._mig_handles.get((handle.parent, handle.index)) is not handle:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[handle.parent].migs[handle.index]

    def _mig_gpu(self, name: str, handle: Any) -> FakeGpu:
        gpu = self._gpu(name, handle)
        if gpu.mig_mode != NVML_DEVICE_MIG_ENABLE:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        return gpu.mig_slices if gpu.mig_mode == NVML_DEVICE_MIG_ENABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> MigHandle:
        gpu = self._mig_gpu("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not 0 <= index < gpu.mig_slices:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._mig_handles.setdefault((device.index, index), MigHandle(device.index, index))

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> int:
        return int(isinstance(device, MigHandle))

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", device).gi

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetComputeInstanceId", device).ci

    def nvmlDeviceGetAttributes(self, device: Any) -> DeviceAttributes:
        if isinstance(device, MigHandle):
            mig = self._mig("nvmlDeviceGetAttributes", device)
            return DeviceAttributes(mig.ci_slices * 16, mig.gi_slices, mig.ci_slices, mig.memory_mb)
        gpu = self._gpu("nvmlDeviceGetAttributes", device)
        return DeviceAttributes(gpu.mig_slices * 16, gpu.mig_slices, gpu.mig_slices, gpu.memory_total >> 20)

    def mig_memory(self, device: MigHandle) -> MemoryInfo:
        mig = self._mig("nvmlDeviceGetMemoryInfo", device)
        total = mig.memory_mb << 20
        return MemoryInfo(total=total, free=total, used=0)

    def write_mig_files(self, dev_root: Path) -> None:
        """The capability files and ``/dev/nvidia-caps`` nodes of every MIG device, under ``dev_root``."""
        caps = Path(dev_root) / "dev/nvidia-caps"
        caps.mkdir(parents=True, exist_ok=True)
        for gpu in self.gpus:
            for mig in gpu.migs:
                gi = Path(dev_root) / f"proc/driver/nvidia/capabilities/gpu{gpu.minor}/mig/gi{mig.gi}"
                (gi / f"ci{mig.ci}").mkdir(parents=True, exist_ok=True)
                (gi / "access").write_text(f"DeviceFileMinor: {mig.gi_cap_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
                (gi / f"ci{mig.ci}" / "access").write_text(
                    f"DeviceFileMinor: {mig.ci_cap_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
                )
                for minor in (mig.gi_cap_minor, mig.ci_cap_minor):
                    (caps / f"nvidia-cap{minor}").touch()
