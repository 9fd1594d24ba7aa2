"""The NVML seam (cdiplug_backends.nvidia.nvml) against FakeNvml, and FakeNvml against the real pynvml module.

Covers: FakeNvml's constants and function names match nvidia-ml-py's (so the fake cannot drift
from what the seam calls on a real node); NVML errors become NvmlError/NvmlUnavailable raised
``from`` the original; bus IDs in sysfs spelling; NVLink remotes (down links skipped); MIG
NOT_SUPPORTED; event waits (timeout, XID, event naming no GPU). Also the real pynvml on this
machine: without an NVIDIA driver, init fails cleanly as NvmlUnavailable.
"""

from __future__ import annotations

import ctypes.util
import inspect

import pynvml
import pytest

from cdiplug_backends.nvidia.nvml import GpuInfo, Nvml, NvmlError, NvmlUnavailable, PcieLevel, normalize_bus_id
from cdiplug_backends.nvidia.testing import FakeGpu, FakeNvml, NVMLError
from cdiplug_backends.nvidia.testing import nvml as fake_module


def test_constants_match_pynvml() -> None:
    names = [n for n in vars(fake_module) if n.startswith(("NVML_", "nvmlEventType"))]
    assert len(names) > 40
    for name in names:
        if name == "NVML_NVLINK_MAX_LINKS":
            continue  # deliberately smaller in the fake; the seam reads it from the module
        assert getattr(pynvml, name) == getattr(fake_module, name), name


def test_every_pynvml_function_the_fake_offers_exists_in_pynvml_with_the_same_arity() -> None:
    offered = [n for n in dir(FakeNvml) if n.startswith("nvml")]
    assert "nvmlEventSetWait" in offered and "nvmlDeviceGetTopologyCommonAncestor" in offered
    for name in offered:
        real = getattr(pynvml, name)
        fake_params = list(inspect.signature(getattr(FakeNvml(), name)).parameters)
        real_params = [p for p, v in inspect.signature(real).parameters.items() if v.default is inspect.Parameter.empty]
        assert len(fake_params) >= len(real_params), name


def test_bus_ids_in_sysfs_spelling() -> None:
    assert normalize_bus_id(b"00000000:3B:00.0\x00\x00") == "0000:3b:00.0"
    assert normalize_bus_id("00000001:AF:00.1") == "0001:af:00.1"
    assert normalize_bus_id(b"3B:00.0") == "0000:3b:00.0"


def test_gpu_info_from_the_fake() -> None:
    fake = FakeNvml.pcie_box()
    nvml = Nvml(fake)
    nvml.init()
    _, info = nvml.gpu_info(2)
    assert info == GpuInfo(
        index=2,
        uuid="GPU-a10a10a1-0000-4000-8000-000000000002",
        name="NVIDIA A10",
        minor=2,
        memory=24 * 1024**3,
        pci_bus_id="0000:86:00.0",
        mig_enabled=None,  # NOT_SUPPORTED on the fake A10, as on real pre-Ampere parts
        architecture="Ampere",
        compute_capability=(8, 6),
        driver_version="550.54.15",
    )
    assert nvml.device_count() == 4


def test_errors_become_ours_raised_from_nvml() -> None:
    fake = FakeNvml.pcie_box()
    nvml = Nvml(fake)
    with pytest.raises(NvmlError) as caught:
        nvml.device_count()  # before nvmlInit
    assert caught.value.code == fake_module.NVML_ERROR_UNINITIALIZED
    assert isinstance(caught.value.__cause__, NVMLError)
    assert "nvmlDeviceGetCount" in str(caught.value)


def test_init_failure_is_unavailable() -> None:
    fake = FakeNvml.pcie_box()
    fake.fail_init(fake_module.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailable, match="DRIVER_NOT_LOADED"):
        Nvml(fake).init()


def test_a_missing_function_is_an_error_not_a_traceback() -> None:
    class Partial:
        NVMLError = NVMLError

    with pytest.raises(NvmlError, match="no such function"):
        Nvml(Partial()).device_count()


def test_nvlink_remotes_skip_down_links_and_stop_at_unsupported() -> None:
    a = FakeGpu(uuid="GPU-a", pci_bus_id="0000:01:00.0", nvlinks=["0000:02:00.0"] * 3, down_links={1})
    b = FakeGpu(uuid="GPU-b", pci_bus_id="0000:02:00.0", minor=1, nvlinks=["0000:01:00.0"] * 3)
    fake = FakeNvml([a, b])
    nvml = Nvml(fake)
    nvml.init()
    assert nvml.nvlink_remotes(nvml.handle(0)) == ("0000:02:00.0", "0000:02:00.0")
    assert nvml.common_ancestor(nvml.handle(0), nvml.handle(1)) is PcieLevel.ACROSS_CPUS


def test_wait_timeout_xid_and_event_without_gpu() -> None:
    fake = FakeNvml.pcie_box()
    nvml = Nvml(fake)
    nvml.init()
    es = nvml.create_event_set()
    assert nvml.register_xid_events(nvml.handle(1), es)
    assert nvml.wait(es, 1) is None
    uuid = fake.gpus[1].uuid
    assert fake.inject_xid(uuid, 79) == 1
    assert fake.inject_xid(fake.gpus[0].uuid, 79) == 0  # not registered
    event = nvml.wait(es, 1000)
    assert event is not None and (event.uuid, event.data, event.is_xid) == (uuid, 79, True)
    fake.inject_xid(None, 79)
    event = nvml.wait(es, 1000)
    assert event is not None and event.uuid is None
    fake.fail_wait(fake_module.NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError):
        nvml.wait(es, 1000)
    nvml.free_event_set(es)
    assert fake.open_event_sets == 0


def test_gpu_without_xid_events_is_reported_not_registered() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-old", supported_events=0)])
    nvml = Nvml(fake)
    nvml.init()
    assert nvml.register_xid_events(nvml.handle(0), nvml.create_event_set()) is False


def test_probe_fails_for_a_lost_gpu_and_passes_when_healed() -> None:
    fake = FakeNvml.pcie_box()
    nvml = Nvml(fake)
    nvml.init()
    uuid = fake.gpus[0].uuid
    nvml.probe(uuid)
    fake.fail_probe(uuid)
    with pytest.raises(NvmlError, match="GPU_IS_LOST"):
        nvml.probe(uuid)
    fake.heal(uuid)
    nvml.probe(uuid)


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="this checks the no-driver path; this machine has the NVIDIA driver library",
)
def test_real_pynvml_without_a_driver_is_unavailable() -> None:
    nvml = Nvml.load()  # the real pynvml
    with pytest.raises(NvmlUnavailable, match="nvmlInit"):
        nvml.init()
