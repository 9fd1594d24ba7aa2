"""Admission checks of our drivers' claim configuration: refused with the message the prepare path
gives (the same decoders), other drivers' entries never looked at; and the webhook's HTTPS
server answering real AdmissionReviews over TLS."""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.resource_v1 import DeviceClass

from cdiplug.cli.webhook import drivers_of
from cdiplug.dra import claim_config
from cdiplug.dra.admission import review
from cdiplug.dra.claims import ClaimRef, ConfigEntry, ConfigSource
from cdiplug.dra.webhook import WebhookServer
from cdiplug.errors import InvalidRequest
from cdiplug.testing.certs import make_pki

CONFIG = """\
resources:
  - name: example.com/fpga
    backend: fake
    api: dra
    options: {count: 2}
  - name: nvidia.com/gpu
    backend: nvidia
    api: dra
    dra_driver: gpu.example.com
  - name: example.com/dongle
    backend: fake
    options: {count: 1}
"""
FPGA = "fpga.example.com"
GPU = "gpu.example.com"
API = "cdiplug.dev/v1alpha1"


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(CONFIG)
    return drivers_of(str(path))


def claim(params: Any, driver: str = FPGA, requests: list[str] | None = None, name: str = "bad") -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "default", "name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "fpga", "exactly": {"deviceClassName": "fpga.example.com"}}],
                "config": [entry],
            }
        },
    }


def fake(**body: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "FakeConfig", **body}


# (what is wrong, parameters, the message)
BAD = [
    ("unknown field", fake(shairng=True), 'unknown field "shairng" @ $.parameters (claim default/bad, request fpga)'),
    ("wrong type", fake(env=["A"]), "@ $.parameters.env (claim default/bad, request fpga)"),
    ("bad value", fake(mode="sometimes"), "@ $.parameters.mode (claim default/bad, request fpga)"),
    ("unknown kind", {"apiVersion": API, "kind": "GpuConfig"}, "expected FakeConfig, got 'GpuConfig' @ $.parameters.kind"),
    ("wrong apiVersion", {"apiVersion": "cdiplug.dev/v1", "kind": "FakeConfig"}, "@ $.parameters.apiVersion"),
    ("no kind", {"apiVersion": API}, "kind is required (FakeConfig) @ $.parameters.kind"),
    ("bad env name", fake(env={"1A": "x"}), "not an environment variable name: '1A' @ $.parameters.env"),
    ("too many variables", fake(env={f"V{i}": "x" for i in range(65)}), "has 65 variables, more than 64 @ $.parameters.env"),
    ("value too long", fake(env={"LONG": "x" * 5000}), "is 5000 characters long, more than 4096 @ $.parameters.env.LONG"),
    ("not an object", "mode: shared", "must be an object, got 'mode: shared' @ $.spec.devices.config[0].opaque.parameters"),
]


@pytest.mark.parametrize(("what", "params", "message"), BAD, ids=[b[0] for b in BAD])
async def test_bad_configuration_is_refused_as_prepare_would(
    drivers: dict[str, Any], what: str, params: Any, message: str
) -> None:
    got = await review(claim(params), "ResourceClaim", drivers)
    assert got is not None and message in got, got
    if isinstance(params, dict):  # the prepare path's own message for the same entry, word for word
        entry = ConfigEntry(ConfigSource.CLAIM, (), params)
        d = drivers[FPGA]
        with pytest.raises(InvalidRequest) as prepared:
            claim_config.device_config([entry], d.configurable, d.resource, ClaimRef("default", "bad", "u"), "fpga")
        assert got == str(prepared.value)


@pytest.mark.parametrize(("what", "params", "message"), BAD, ids=[b[0] for b in BAD])
async def test_the_same_for_another_driver_is_admitted(drivers: dict[str, Any], what: str, params: Any, message: str) -> None:
    assert await review(claim(params, driver="gpu.other-vendor.com"), "ResourceClaim", drivers) is None


async def test_good_configuration_and_no_configuration_are_admitted(drivers: dict[str, Any]) -> None:
    assert await review(claim(fake(mode="shared", env={"A": "1"})), "ResourceClaim", drivers) is None
    plain = claim(fake())
    plain["spec"]["devices"]["config"] = []
    assert await review(plain, "ResourceClaim", drivers) is None


async def test_in_a_template_and_a_device_class(drivers: dict[str, Any]) -> None:
    template = {
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": "ns", "name": "tpl"},
        "spec": {"spec": claim(fake(shairng=1))["spec"]},
    }
    assert await review(template, "ResourceClaimTemplate", drivers) == (
        'unknown field "shairng" @ $.parameters (ResourceClaimTemplate ns/tpl, request fpga)'
    )
    device_class = {
        "kind": "DeviceClass",
        "metadata": {"name": "fpga.example.com"},
        "spec": {"config": [{"opaque": {"driver": FPGA, "parameters": fake(env={"A": 1})}}]},
    }
    got = await review(device_class, "DeviceClass", drivers)
    assert got is not None and got == "expected a string, got int 1 @ $.parameters.env['A'] (DeviceClass fpga.example.com)"


async def test_checks_across_fields_see_the_class_configuration(drivers: dict[str, Any]) -> None:
    """An MPS setting is right when the class chose MPS, as at prepare (class first, then claim)."""
    gpu_claim = claim(
        {"apiVersion": API, "kind": "NvidiaConfig", "sharing": {"mpsConfig": {"defaultActiveThreadPercentage": 50}}}, GPU
    )
    gpu_claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu-mps"
    refused = await review(gpu_claim, "ResourceClaim", drivers)
    assert refused is not None and "is for strategy MPS, not TimeSlicing @ $.parameters.sharing.mpsConfig" in refused
    mps_class = {
        "spec": {
            "config": [
                {
                    "opaque": {
                        "driver": GPU,
                        "parameters": {"apiVersion": API, "kind": "NvidiaConfig", "sharing": {"strategy": "MPS"}},
                    }
                }
            ]
        }
    }

    async def read_class(name: str) -> DeviceClass:
        assert name == "gpu-mps"
        return DeviceClass.from_dict(mps_class)

    assert await review(gpu_claim, "ResourceClaim", drivers, read_class) is None


async def test_a_request_the_entry_does_not_name_is_not_judged_by_it(drivers: dict[str, Any]) -> None:
    obj = claim(fake(shairng=1), requests=["other"])
    obj["spec"]["devices"]["requests"].append({"name": "other", "exactly": {"deviceClassName": "x"}})
    assert (
        await review(obj, "ResourceClaim", drivers) == 'unknown field "shairng" @ $.parameters (claim default/bad, request other)'
    )


def review_body(obj: dict[str, Any], kind: str, operation: str = "CREATE", old: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "r-1", "kind": {"kind": kind}, "operation": operation, "object": obj, "oldObject": old},
    }


async def post(port: int, ca: Path, body: bytes, path: str = "/validate") -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    data = await reader.read()
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), payload


async def test_webhook_answers_admission_reviews_over_tls(drivers: dict[str, Any], tmp_path: Path) -> None:
    pki = make_pki("127.0.0.1")
    for name, text in (("ca.crt", pki.ca.cert_pem), ("tls.crt", pki.server.cert_pem), ("tls.key", pki.server.key_pem)):
        (tmp_path / name).write_text(text)
    async with WebhookServer(drivers, tmp_path / "tls.crt", tmp_path / "tls.key", "127.0.0.1", 0) as server:
        status, payload = await post(
            server.port, tmp_path / "ca.crt", json.dumps(review_body(claim(fake(shairng=1)), "ResourceClaim")).encode()
        )
        assert status == 200
        response = json.loads(payload)["response"]
        assert response["uid"] == "r-1" and response["allowed"] is False
        assert response["status"]["message"] == 'unknown field "shairng" @ $.parameters (claim default/bad, request fpga)'
        good = review_body(claim(fake(mode="shared")), "ResourceClaim")
        assert json.loads((await post(server.port, tmp_path / "ca.crt", json.dumps(good).encode()))[1])["response"]["allowed"]
        # An update that leaves the spec as it was (a finalizer added) is never refused.
        bad = claim(fake(shairng=1))
        finalized = copy.deepcopy(bad)
        finalized["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        update = review_body(finalized, "ResourceClaim", "UPDATE", bad)
        assert json.loads((await post(server.port, tmp_path / "ca.crt", json.dumps(update).encode()))[1])["response"]["allowed"]
        assert (await post(server.port, tmp_path / "ca.crt", b"not json"))[0] == 400
        assert (await post(server.port, tmp_path / "ca.crt", b"{}", "/elsewhere"))[0] == 404
