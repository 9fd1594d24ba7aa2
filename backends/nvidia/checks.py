"""What the NVIDIA backend needs of a node, for ``cdiplug doctor``: the driver and NVML.

NVML answering (``nvmlInit``, the driver version, the GPU count) is the whole test: it needs the
kernel driver loaded and its ``libnvidia-ml.so.1`` reachable. When it does not answer,
``<sysfs>/module/nvidia`` tells a driver that is not loaded from a library that cannot be found.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cdiplug.sdk import Finding, Verdict, World

from .nvml import Nvml, NvmlError

DRIVER_FIX = "install the NVIDIA driver (or run the GPU operator's driver container) and load it: modprobe nvidia"
LIBRARY_FIX = (
    "make libnvidia-ml.so.1 loadable: on the host, the driver's user-space libraries; in a pod, "
    "the NVIDIA container toolkit's runtime, or mount the driver's library folder and set LD_LIBRARY_PATH"
)


def findings(world: World, module: Any) -> Iterator[Finding]:
    """The driver and NVML, with ``module`` the NVML-like module (None: pynvml). Blocking."""
    loaded = (world.sysfs_root / "module" / "nvidia").is_dir()
    try:
        nvml = Nvml.load(module)
        nvml.init()
    except NvmlError as exc:
        if not loaded:
            yield Finding("NVIDIA driver", Verdict.PROBLEM, f"not loaded (no {world.sysfs_root}/module/nvidia)", DRIVER_FIX)
        yield Finding("NVML", Verdict.PROBLEM, f"does not answer: {exc}", LIBRARY_FIX if loaded else DRIVER_FIX)
        return
    try:
        version, count = nvml.driver_version(), nvml.device_count()
    except NvmlError as exc:
        yield Finding("NVML", Verdict.PROBLEM, f"answers, but not about the driver: {exc}", DRIVER_FIX)
        return
    finally:
        try:
            nvml.shutdown()
        except NvmlError:
            pass
    yield Finding("NVIDIA driver", Verdict.OK, f"version {version}")
    if count:
        yield Finding("NVML", Verdict.OK, f"{count} GPU{'s' if count != 1 else ''}")
    else:
        yield Finding(
            "NVML", Verdict.WARNING, "answers, but sees no GPU", "check nvidia-smi; a GPU passed to a VM is not seen here"
        )
