"""The series the alerts need beyond the counters of the front ends: Unhealthy devices per cause,
backend restarts from 0, state files set aside and CDI spec writes that failed (counted where they
happen, read at scrape time)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cdiplug.cdi.writer import SpecWriter
from cdiplug.dra import claimspec
from cdiplug.errors import CdiError
from cdiplug.host import SpecKeepers
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot, Health, HealthCause
from cdiplug.telemetry.metrics import Metrics
from cdiplug.toolkit import statefile

FPGA = "example.com/fpga"
EDITS = ContainerEdits(env={"FPGA": "0"})


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_unhealthy_devices_per_cause_stay_at_zero_once_seen() -> None:
    snapshot = DeviceSnapshot(
        resource=FPGA,
        devices=(
            Device("fpga-0"),
            Device("fpga-1", health=Health.UNHEALTHY, health_cause=HealthCause("xid", "79")),
            Device("fpga-2", health=Health.UNHEALTHY),
            Device("fpga-3", health=Health.HEALTHY, health_cause=HealthCause("link-down")),  # informational only
        ),
    )
    assert snapshot.unhealthy_causes() == {"xid": 1, "unhealthy": 1}
    m = Metrics()
    m.devices(FPGA, 2, 2, snapshot.unhealthy_causes())
    got = samples(m)
    assert got[("cdiplug_unhealthy_devices", (("cause", "xid"), ("resource", FPGA)))] == 1
    assert got[("cdiplug_unhealthy_devices", (("cause", "unhealthy"), ("resource", FPGA)))] == 1
    assert not any(k[0] == "cdiplug_unhealthy_devices" and ("cause", "link-down") in k[1] for k in got)
    m.devices(FPGA, 4, 0, {})  # recovered: the causes stay, at 0, so that alerts resolve on a value
    got = samples(m)
    assert got[("cdiplug_unhealthy_devices", (("cause", "xid"), ("resource", FPGA)))] == 0
    m.forget(FPGA)
    assert not any(k[0] == "cdiplug_unhealthy_devices" for k in samples(m))


def test_backend_restarts_start_at_zero() -> None:
    m = Metrics()
    m.backend_started("fake")
    assert samples(m)[("cdiplug_backend_restarts_total", (("backend", "fake"),))] == 0
    m.backend_restarted("fake")
    assert samples(m)[("cdiplug_backend_restarts_total", (("backend", "fake"),))] == 1


def set_aside_count(m: Metrics, what: str) -> float:
    return samples(m).get(("cdiplug_state_files_set_aside_total", (("file", what),)), 0.0)


def test_a_corrupt_state_file_is_counted(tmp_path: Path) -> None:
    m = Metrics()
    before = set_aside_count(m, "test state")
    path = tmp_path / "state.json"
    path.write_text("{not json")

    def parse(data: bytes) -> object:
        raise ValueError("not JSON")

    assert statefile.load(path, 1024, "test state", parse, lambda: "default") == "default"
    assert set_aside_count(m, "test state") == before + 1
    assert any(p.name.startswith("state.json.corrupt-") for p in tmp_path.iterdir())


async def test_cdi_spec_write_failures_are_counted(tmp_path: Path) -> None:
    m = Metrics()

    def count(kind: str) -> float:
        return samples(m).get(("cdiplug_cdi_spec_write_failures_total", (("kind", kind),)), 0.0)

    before, before_claim = count(FPGA), count("claim")
    (tmp_path / "file").write_text("a file where a folder should be")
    folder = tmp_path / "file" / "cdi"  # fails for root too
    with pytest.raises(CdiError, match="CDI"):
        SpecWriter(folder).write(FPGA, DeviceSnapshot(resource=FPGA, devices=(Device("fpga-0", edits=EDITS),)))
    with pytest.raises(CdiError, match="CDI folder"):
        await claimspec.write(SpecKeepers(folder), "11111111-2222-3333-4444-555555555555", b"{}")
    assert count(FPGA) == before + 1
    assert count("claim") == before_claim + 1
