"""A claim's opaque configuration and admin access, per device (cdiplug.dra.claim_config).

The fake backend's real ``FakeConfig`` (through its ClaimConfigurable ability) stands behind
the decoding. Covers: entries decode strictly (an unknown field, a wrong type, a bad value, a
missing or wrong apiVersion/kind), the error naming the field, the claim and the request; entries
merge in precedence order (class before claim, later over earlier, a mapping key by key), never
changing the entries themselves (they are checkpointed as they were); an
entry naming requests applies to those only; configuration for a backend that takes none is an
error; an admin-access result is not prepared, never released and says so in its env; a claim's
configuration read back from its checkpoint record shapes the devices the same way.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from lightkube.resources.resource_v1 import ResourceClaim

from cdiplug.backend import Configured
from cdiplug.dra import claim_config
from cdiplug.dra.checkpoint import PreparedClaim, PreparedDevice
from cdiplug.dra.claims import AllocatedClaim, AllocatedDevice, ClaimRef, ConfigEntry, ConfigSource, allocated
from cdiplug.errors import InvalidRequest
from cdiplug.models.devices import ContainerEdits, Device
from cdiplug.models.world import World
from cdiplug_backends.fake.backend import FakeBackend

RESOURCE = "example.com/fpga"
REF = ClaimRef("default", "gpu-claim", "u1")
DEVICES = {f"fpga-{i}": Device(f"fpga-{i}", edits=ContainerEdits(env={f"FAKE_FPGA_DEVICE_{i}": f"fpga-{i}"})) for i in range(2)}


def params(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "cdiplug.dev/v1alpha1", "kind": "FakeConfig", **fields}


def claim(*configs: ConfigEntry, admin: bool = False) -> AllocatedClaim:
    results = (AllocatedDevice("gpu", "n1", "fpga-0", admin_access=admin), AllocatedDevice("other", "n1", "fpga-1"))
    return AllocatedClaim(REF, results, configs)


def entry(source: ConfigSource, parameters: dict[str, Any], requests: tuple[str, ...] = ()) -> ConfigEntry:
    return ConfigEntry(source, requests, parameters)


@pytest.fixture
def fake(world: World) -> FakeBackend:
    return FakeBackend([], world)


def env(shaped: Configured) -> dict[str, str]:
    return dict(shaped.device.edits.env)


def test_the_configuration_shapes_the_devices_of_its_requests_only(fake: FakeBackend) -> None:
    c = claim(entry(ConfigSource.CLAIM, params(mode="exclusive", env={"LOG": "debug"}), ("gpu",)))
    out = claim_config.configure(c, DEVICES, RESOURCE, fake)
    assert env(out["fpga-0"]) == {"FAKE_FPGA_DEVICE_0": "fpga-0", "LOG": "debug", "FAKE_FPGA_DEVICE_0_MODE": "exclusive"}
    assert env(out["fpga-1"]) == {"FAKE_FPGA_DEVICE_1": "fpga-1"}  # request "other": not configured
    assert out["fpga-0"].prepare and out["fpga-0"].release


def test_entries_merge_in_precedence_order_field_by_field(fake: FakeBackend) -> None:
    # The order claims.allocated gives: every FromClass entry before every FromClaim one.
    obj = {
        "metadata": {"uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": "d", "pool": "n1", "device": "fpga-0"}],
                    "config": [
                        {"source": "FromClaim", "opaque": {"driver": "d", "parameters": params(env={"B": "claim"})}},
                        {
                            "source": "FromClass",
                            "opaque": {"driver": "d", "parameters": params(mode="shared", env={"A": "1", "B": "class"})},
                        },
                        {
                            "source": "FromClaim",
                            "requests": ["gpu"],
                            "opaque": {"driver": "d", "parameters": params(mode="exclusive")},
                        },
                    ],
                }
            }
        },
    }
    c = allocated(ResourceClaim.from_dict(obj), REF, "d", "n1")
    out = claim_config.configure(c, {"fpga-0": DEVICES["fpga-0"]}, RESOURCE, fake)
    assert env(out["fpga-0"]) == {"FAKE_FPGA_DEVICE_0": "fpga-0", "A": "1", "B": "claim", "FAKE_FPGA_DEVICE_0_MODE": "exclusive"}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (params(shairng=True), 'unknown field "shairng" @ $.parameters (claim default/gpu-claim, request gpu)'),
        (
            params(mode="turbo"),
            "expected one of 'default', 'exclusive', 'shared', got 'turbo' @ $.parameters.mode (claim default/gpu-claim, request gpu)",
        ),
        (params(env={"A": 5}), "@ $.parameters.env['A'] (claim default/gpu-claim, request gpu)"),
        (
            params(env={"9bad": "x"}),
            "not an environment variable name: '9bad' @ $.parameters.env (claim default/gpu-claim, request gpu)",
        ),
        (
            {"kind": "FakeConfig"},
            "apiVersion is required (cdiplug.dev/v1alpha1) @ $.parameters.apiVersion (claim default/gpu-claim, request gpu)",
        ),
        (
            params(kind="NvidiaConfig"),
            "expected FakeConfig, got 'NvidiaConfig' @ $.parameters.kind (claim default/gpu-claim, request gpu)",
        ),
    ],
)
def test_a_bad_entry_is_an_error_naming_the_field_the_claim_and_the_request(
    fake: FakeBackend, parameters: dict[str, Any], message: str
) -> None:
    good = entry(ConfigSource.CLASS, params(mode="shared"))
    with pytest.raises(InvalidRequest) as caught:
        claim_config.configure(claim(good, entry(ConfigSource.CLAIM, parameters, ("gpu",))), DEVICES, RESOURCE, fake)
    assert message in str(caught.value)


def test_configuration_for_a_backend_that_takes_none_is_an_error() -> None:
    c = claim(entry(ConfigSource.CLAIM, params(mode="shared")))
    with pytest.raises(InvalidRequest, match=r"takes no claim configuration.*claim default/gpu-claim, request gpu"):
        claim_config.configure(c, DEVICES, RESOURCE, None)
    assert claim_config.configure(claim(), DEVICES, RESOURCE, None)["fpga-0"].device == DEVICES["fpga-0"]  # none: as ever


def test_an_admin_access_device_is_not_prepared_never_released_and_says_so(fake: FakeBackend) -> None:
    c = claim(entry(ConfigSource.CLAIM, params(mode="shared")), admin=True)
    out = claim_config.configure(c, DEVICES, RESOURCE, fake)
    assert (out["fpga-0"].prepare, out["fpga-0"].release) == (False, False)
    assert env(out["fpga-0"])["CDIPLUG_ADMIN_ACCESS"] == "true" and env(out["fpga-0"])["FAKE_FPGA_DEVICE_0_MODE"] == "shared"
    assert out["fpga-1"].prepare and "CDIPLUG_ADMIN_ACCESS" not in env(out["fpga-1"])


def test_a_checkpoint_record_shapes_the_devices_as_the_claim_did(fake: FakeBackend) -> None:
    c = claim(entry(ConfigSource.CLAIM, params(mode="exclusive"), ("gpu",)), admin=True)
    devices = tuple(
        PreparedDevice((r.request,), "n1", r.device, r.device, (), admin_access=r.admin_access, prepared=not r.admin_access)
        for r in c.results
    )
    record = PreparedClaim(REF.uid, REF.namespace, REF.name, "d", RESOURCE, devices, "f.json", configs=c.configs)
    assert claim_config.configure(claim_config.recorded_claim(record), DEVICES, RESOURCE, fake) == claim_config.configure(
        c, DEVICES, RESOURCE, fake
    )


def test_claims_read_admin_access() -> None:
    """``adminAccess`` true, or unset (false); one of another type is the client's to refuse (test_claims.py)."""

    def obj(value: Any) -> ResourceClaim:
        result = {"request": "gpu", "driver": "d", "pool": "n1", "device": "fpga-0", "adminAccess": value}
        return ResourceClaim.from_dict({"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {"results": [result]}}}})

    assert allocated(obj(True), REF, "d", "n1").results[0].admin_access
    assert not allocated(obj(None), REF, "d", "n1").results[0].admin_access


def test_merging_never_changes_the_entries() -> None:
    first = {"sharing": {"mps": {"a": 1}}, "env": {"A": "1"}}
    second = {"sharing": {"mps": {"b": 2}}, "env": {"B": "2"}}
    before = (json.dumps(first), json.dumps(second))
    assert claim_config.merge([first, second]) == {"sharing": {"mps": {"a": 1, "b": 2}}, "env": {"A": "1", "B": "2"}}
    assert claim_config.merge([first, {"sharing": "off"}]) == {"sharing": "off", "env": {"A": "1"}}
    assert (json.dumps(first), json.dumps(second)) == before
