"""Claims read (cdiplug.dra.claims) and per-claim CDI specs (claimspec).

Claims: only results of our driver in our pool, in order; our opaque configuration entries, class
ones before claim ones, each applying to the requests it names (a request covers its
subrequests); a replaced, unallocated or malformed claim is an InvalidRequest naming the claim and
the field, bounded in length, whatever the hostile input (1 MiB names, 10,000 results, deep or
huge parameters); a field of the wrong type is refused by the client as it reads the claim (over
HTTP, from the API-server stand-in), naming the claim and the field, and what the client reads
carries everything a prepare takes from the claim. Specs: kind ``k8s.<driver>/claim``, devices ``<uid>-<name>``, the claim's ID
env, 0644, stale ones removed but kept ones left; a bad UID never becomes a path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightkube.resources.resource_v1 import ResourceClaim

from cdiplug.dra import claims, claimspec
from cdiplug.dra.claims import AllocatedClaim, AllocatedDevice, ClaimRef, ConfigEntry, ConfigSource
from cdiplug.dra.plan import read_claim
from cdiplug.errors import CdiError, InvalidRequest, KubernetesError
from cdiplug.host import SpecKeepers
from cdiplug.kube.client import KubeClient
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot
from cdiplug.models.instance import Instance
from cdiplug.testing import ApiServerStandIn

UID = "0b0c7f6e-1111-2222-3333-444455556666"
REF = ClaimRef("ns", "c", UID)


def allocated(obj: dict[str, object], ref: ClaimRef, driver: str, pool: str) -> AllocatedClaim:
    """The claim ``obj`` (JSON) read as the client reads it, then as the DRA front end does (a
    field of the wrong type is the client's to refuse: the last test here)."""
    return claims.allocated(ResourceClaim.from_dict(obj), ref, driver, pool)


def claim(results: list[dict[str, str]], uid: str = UID) -> dict[str, object]:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}


def test_allocated_picks_our_driver_and_pool() -> None:
    results = [
        {"request": "a", "driver": "d.example.com", "pool": "n1", "device": "x"},
        {"request": "b", "driver": "other.example.com", "pool": "n1", "device": "y"},
        {"request": "c", "driver": "d.example.com", "pool": "n2", "device": "z"},
        {"request": "big/fast", "driver": "d.example.com", "pool": "n1", "device": "w"},
    ]
    assert allocated(claim(results), REF, "d.example.com", "n1").results == (
        AllocatedDevice("a", "n1", "x"),
        AllocatedDevice("big/fast", "n1", "w"),
    )


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim([], uid="other"), "replaced"),
        ({"metadata": {"uid": UID}, "status": {}}, "not allocated"),
        (
            claim([{"request": "", "driver": "d.example.com", "pool": "n1", "device": "x"}]),
            r"must be a non-empty string, got '' @ \$\.status\.allocation\.devices\.results\[0\]\.request",
        ),
    ],
)
def test_claims_we_cannot_prepare(obj: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        allocated(obj, REF, "d.example.com", "n1")


async def test_claim_spec(tmp_path: Path) -> None:
    snap = DeviceSnapshot(
        "example.com/fpga",
        [Device("fpga-0", edits=ContainerEdits(env={"A": "0"})), Device("fpga-1", edits=ContainerEdits(env={"A": "1"}))],
        ids_env="FAKE_FPGA_DEVICES",
    )
    content = claimspec.render("fpga.example.com", UID, snap, [("fpga-1", snap.devices[1])])
    specs = SpecKeepers(tmp_path)
    await claimspec.write(specs, UID, content)
    path = tmp_path / claimspec.file_name(specs.names, UID)
    assert path.name == f"cdiplug-claim-{UID}.json" and path.stat().st_mode & 0o777 == 0o644
    spec = json.loads(path.read_text())
    assert spec["kind"] == "k8s.fpga.example.com/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-fpga-1"]
    assert spec["containerEdits"]["env"] == ["FAKE_FPGA_DEVICES=fpga-1"]
    assert claimspec.cdi_name("fpga.example.com", UID, "fpga-1") == f"k8s.fpga.example.com/claim={UID}-fpga-1"
    other = tmp_path / "cdiplug-claim-deadbeef.json"
    other.write_text("{}")
    per_resource = tmp_path / "cdiplug-example.com-fpga.json"
    per_resource.write_text("{}")
    named = tmp_path / "cdiplug.blue.claim-deadbeef.json"  # another instance's
    named.write_text("{}")
    assert await claimspec.remove_stale(specs, [UID]) == [other]
    assert path.exists() and per_resource.exists() and named.exists()
    assert await claimspec.remove(specs, UID) and not await claimspec.remove(specs, UID)


def test_a_uid_never_becomes_a_path(tmp_path: Path) -> None:
    with pytest.raises(CdiError):
        claimspec.file_name(Instance(), "../../etc/passwd")


def test_the_per_resource_writer_leaves_claim_specs_alone(tmp_path: Path) -> None:
    from cdiplug.cdi.writer import SpecWriter

    (tmp_path / f"cdiplug-claim-{UID}.json").write_text("{}")
    (tmp_path / "cdiplug-example.com-old.json").write_text("{}")
    removed = SpecWriter(tmp_path).remove_stale([])
    assert [p.name for p in removed] == ["cdiplug-example.com-old.json"]


def with_configs(configs: list[object], results: list[dict[str, str]] | None = None) -> dict[str, object]:
    obj = claim(results or [{"request": "gpu/small", "driver": "d.example.com", "pool": "n1", "device": "x"}])
    obj["status"]["allocation"]["devices"]["config"] = configs  # type: ignore[index]
    return obj


def opaque(source: str, params: object, requests: list[str] | None = None, driver: str = "d.example.com") -> dict[str, object]:
    entry: dict[str, object] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def test_configuration_entries_in_precedence_order_per_request() -> None:
    """Class entries before claim entries whatever their order in the allocation; other drivers' left out."""
    obj = with_configs(
        [
            opaque("FromClaim", {"mode": "claim-all"}),
            opaque("FromClass", {"mode": "class"}),
            opaque("FromClaim", {"mode": "theirs"}, driver="other.example.com"),
            opaque("FromClaim", {"mode": "for-gpu"}, requests=["gpu"]),
            opaque("FromClaim", {"mode": "for-nic"}, requests=["nic"]),
            {"source": "FromClaim"},  # a kind of configuration this API version lacks: not ours
        ]
    )
    got = allocated(obj, REF, "d.example.com", "n1")
    assert [c.parameters["mode"] for c in got.configs] == ["class", "claim-all", "for-gpu", "for-nic"]
    assert got.configs[0] == ConfigEntry(ConfigSource.CLASS, (), {"mode": "class"})
    # The subrequest gpu/small is covered by an entry naming its request gpu; nic's is not its.
    assert [c.parameters["mode"] for c in got.configs_for("gpu/small")] == ["class", "claim-all", "for-gpu"]
    assert [c.parameters["mode"] for c in got.configs_for("nic")] == ["class", "claim-all", "for-nic"]


def deep(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("configs", "field", "message"),
    [
        ([opaque("FromElsewhere", {})], "config[0].source", "must be FromClass or FromClaim"),
        ([opaque("FromClaim", {}, requests=[""])], "config[0].requests[0]", "must be a non-empty string"),
        ([opaque("FromClaim", deep(40))], "config[0].opaque.parameters", "nests deeper than 32"),
        ([opaque("FromClaim", {"big": "x" * (70 << 10)})], "config[0].opaque.parameters", "more than 65,536"),
        ([opaque("FromClaim", {})] * 65, "config", "65 entries, more than 64"),
    ],
)
def test_bad_configuration_names_the_claim_and_field(configs: list[object], field: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        allocated(with_configs(configs), REF, "d.example.com", "n1")
    text = str(caught.value)
    assert (
        text.startswith(f"ResourceClaim {REF}: ") and message in text and text.endswith(f"@ $.status.allocation.devices.{field}")
    )
    assert len(text) < 400


@pytest.mark.parametrize(
    ("results", "field"),
    [
        ([{"request": "a", "driver": "d.example.com", "pool": "n1", "device": "x" * (1 << 20)}], "results[0].device"),
        ([{"request": "a", "driver": "d.example.com", "pool": "n1", "device": "x", "shareID": "../x"}], "results[0].shareID"),
        (
            [{"request": "a", "driver": "d.example.com", "pool": "n1", "device": "x", "consumedCapacity": {"m": "lots"}}],
            "results[0].consumedCapacity.m",
        ),
        ([{"request": "a", "driver": "d.example.com", "pool": "n1", "device": "x"}] * 10_000, "results"),
    ],
)
def test_hostile_results_are_one_bounded_error(results: list[object], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        allocated(claim(results), REF, "d.example.com", "n1")  # type: ignore[arg-type]
    text = str(caught.value)
    assert text.endswith(f"@ $.status.allocation.devices.{field}") and len(text) < 400


def result(**fields: object) -> dict[str, object]:
    return {"request": "gpu", "driver": "d.example.com", "pool": "n1", "device": "x"} | fields


async def test_the_client_reads_a_claim_with_all_that_prepare_takes_from_it(api: ApiServerStandIn, client: KubeClient) -> None:
    """The client's ResourceClaim, as read over HTTP, carries what a prepare reads: the UID, our
    results with their shares, capacity and admin access, our configuration in precedence order,
    and the pod's name for the claim."""
    share = "5e2b7c1a-0000-4000-8000-000000000001"
    results = [result(shareID=share, consumedCapacity={"memory": "4Gi"}, adminAccess=True), result(driver="other.example.com")]
    configs = [opaque("FromClaim", {"mode": "claim"}, requests=["gpu"]), opaque("FromClass", {"mode": "class"})]
    meta = {"name": "c", "namespace": "ns", "uid": UID, "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}}
    api.put_claim({"metadata": meta, "status": {"allocation": {"devices": {"results": results, "config": configs}}}})
    read = await read_claim(client, REF, "d.example.com", "n1", pod_claim=True)
    assert read.claim.results == (AllocatedDevice("gpu", "n1", "x", share, (("memory", "4Gi"),), admin_access=True),)
    assert [(c.source, c.requests, dict(c.parameters)) for c in read.claim.configs] == [
        (ConfigSource.CLASS, (), {"mode": "class"}),
        (ConfigSource.CLAIM, ("gpu",), {"mode": "claim"}),
    ]
    assert read.pod_claim == "gpu"


@pytest.mark.parametrize(
    ("devices", "field", "message"),
    [
        ({"results": [result(device=5)]}, "results[0].device", "Expected str, got int"),
        ({"results": ["not an object"]}, "results[0]", "Expected object, got str"),
        ({"results": [{"driver": "d.example.com", "pool": "n1", "device": "x"}]}, "results[0]", "missing required field request"),
        ({"results": [result(adminAccess="yes")]}, "results[0].adminAccess", "Expected bool | null, got str"),
        ({"config": ["x"]}, "config[0]", "Expected object, got str"),
        ({"config": [opaque("FromClaim", [1, 2])]}, "config[0].opaque.parameters", "Expected object, got array"),
        ({"config": [opaque("FromClaim", "not json {")]}, "config[0].opaque.parameters", "Expected object, got str"),
        ({"config": [opaque("FromClaim", {}, requests=[7])]}, "config[0].requests[0]", "Expected str, got int"),
    ],
)
async def test_a_claim_with_a_field_of_the_wrong_type_is_refused_as_it_is_read(
    api: ApiServerStandIn, client: KubeClient, devices: dict[str, object], field: str, message: str
) -> None:
    """The client refuses it, naming the claim and the field; the daemon answers that claim with the error."""
    api.put_claim({"metadata": {"name": "c", "namespace": "ns", "uid": UID}, "status": {"allocation": {"devices": devices}}})
    with pytest.raises(KubernetesError) as caught:
        await read_claim(client, REF, "d.example.com", "n1")
    text = str(caught.value)
    assert text.startswith("cannot read ResourceClaim ns/c on ") and message in text, text
    assert text.endswith(f"@ $.status.allocation.devices.{field}") and len(text) < 400, text
