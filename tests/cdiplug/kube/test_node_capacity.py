"""``cdiplug node-capacity``: the JSON Patch on a node's status, through cdiplug's Kubernetes client.

Against the API-server stand-in (cdiplug.testing.ApiServerStandIn: real HTTP, and HTTPS with a
CA and client certificates of its own, on 127.0.0.1), which applies the patch as the API server
does and answers with the node or a Status (401, 403, 404, 422). Checks the exact method, path,
content type, body and Authorization header of every request, the command line's output and exit
status, and its error messages (naming the node, the server and where the credentials came from).
The real API server is tests/cluster/test_node_capacity.py's. Where credentials are found is
tests/cdiplug/kube/test_credentials.py's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from cdiplug.cli import main
from cdiplug.kube.credentials import Credentials, load_kubeconfig
from cdiplug.kube.node_capacity import CapacityUsageError, NodeCapacity, NodeCapacityError, json_pointer_escape, parse_quantity
from cdiplug.testing import ApiServerStandIn
from cdiplug.testing.certs import make_pki


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    async with ApiServerStandIn() as server:
        server.put_node("worker-1", capacity={"cpu": "2", "pods": "110"})
        yield server


def credentials(api: ApiServerStandIn, tmp_path: Path, **kwargs: bool) -> Credentials:
    return load_kubeconfig(api.kubeconfig(tmp_path / "kubeconfig", **kwargs))


async def cli(api: ApiServerStandIn, tmp_path: Path, *argv: str) -> int:
    """``cdiplug node-capacity ARGV --kubeconfig FILE`` in a thread (it runs an event loop of its own)."""
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    return await asyncio.to_thread(main, ["node-capacity", *argv, "--kubeconfig", str(kubeconfig)])


def patches(api: ApiServerStandIn) -> list[object]:
    return [json.loads(r.body) for r in api.received if r.method == "PATCH"]


async def test_set_sends_the_documented_patch(api: ApiServerStandIn, tmp_path: Path) -> None:
    client = NodeCapacity(credentials(api, tmp_path))
    capacity = await asyncio.to_thread(client.set, "worker-1", {"example.com/dongle": 4, "example.com/licence": 0})
    assert capacity == {"cpu": "2", "pods": "110", "example.com/dongle": "4", "example.com/licence": "0"}
    (sent,) = api.received
    assert (sent.method, sent.path, sent.content_type, sent.authorization) == (
        "PATCH",
        "/api/v1/nodes/worker-1/status",
        "application/json-patch+json",
        f"Bearer {api.token}",
    )
    assert json.loads(sent.body) == [
        {"op": "add", "path": "/status/capacity/example.com~1dongle", "value": "4"},
        {"op": "add", "path": "/status/capacity/example.com~1licence", "value": "0"},
    ]
    assert api.node("worker-1")["status"]["capacity"]["example.com/dongle"] == "4"


async def test_remove_sends_remove_ops(api: ApiServerStandIn, tmp_path: Path) -> None:
    api.put_node("worker-1", capacity={"cpu": "2", "example.com/dongle": "4"})
    client = NodeCapacity(credentials(api, tmp_path))
    capacity = await asyncio.to_thread(client.remove, "worker-1", ["example.com/dongle", "example.com/dongle"])
    assert capacity == {"cpu": "2"}
    assert patches(api) == [[{"op": "remove", "path": "/status/capacity/example.com~1dongle"}]]


def test_json_pointer_escapes_tilde_before_slash() -> None:
    assert json_pointer_escape("example.com/a~b") == "example.com~1a~0b"
    assert json_pointer_escape("a~1") == "a~01"  # not "a~1", which would read back as "a/"


async def test_cli_set_and_remove_with_kubeconfig(
    api: ApiServerStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await cli(api, tmp_path, "set", "worker-1", "example.com/dongle=4") == 0
    assert capsys.readouterr().out == "node worker-1: example.com/dongle=4\n"
    assert api.node("worker-1")["status"]["capacity"]["example.com/dongle"] == "4"
    assert await cli(api, tmp_path, "remove", "worker-1", "example.com/dongle") == 0
    assert capsys.readouterr().out == "node worker-1: example.com/dongle removed\n"
    assert "example.com/dongle" not in api.node("worker-1")["status"]["capacity"]
    assert [p[0]["op"] for p in patches(api)] == ["add", "remove"]  # type: ignore[index]


async def test_node_not_found_names_node_server_and_credentials(api: ApiServerStandIn, tmp_path: Path) -> None:
    found = credentials(api, tmp_path)
    with pytest.raises(NodeCapacityError) as info:
        await asyncio.to_thread(NodeCapacity(found).set, "worker-9", {"example.com/dongle": 1})
    assert str(info.value) == (
        f"node 'worker-9' on {api.url} (credentials from {tmp_path / 'kubeconfig'} (context standin)): "
        'node not found (nodes "worker-9" not found)'
    )


async def test_forbidden_mentions_rbac(api: ApiServerStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.forbidden.add("patch nodes/status")
    assert await cli(api, tmp_path, "set", "worker-1", "example.com/dongle=4") == 1
    err = capsys.readouterr().err
    assert "node 'worker-1'" in err and api.url in err
    assert "'patch' on the 'nodes/status'" in err and "deploy/rbac-node-capacity.yaml" in err


async def test_unauthorized_and_missing_resource(api: ApiServerStandIn, tmp_path: Path) -> None:
    found = credentials(api, tmp_path)
    with pytest.raises(NodeCapacityError, match="unauthorized"):
        await asyncio.to_thread(NodeCapacity(attrs.evolve(found, token="wrong")).set, "worker-1", {"example.com/d": 1})
    with pytest.raises(NodeCapacityError, match="not in its capacity"):
        await asyncio.to_thread(NodeCapacity(found).remove, "worker-1", ["example.com/d"])
    assert api.node("worker-1")["status"]["capacity"] == {"cpu": "2", "pods": "110"}


async def test_unreachable_server(tmp_path: Path) -> None:
    async with ApiServerStandIn() as gone:
        found = credentials(gone, tmp_path)
    with pytest.raises(NodeCapacityError, match=rf"cannot reach the API server for node 'n1' on http://127.0.0.1:{gone.port} "):
        await asyncio.to_thread(NodeCapacity(found, timeout=5).set, "n1", {"example.com/d": 1})


async def test_a_silent_server_is_given_up_on_at_the_timeout(
    api: ApiServerStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.stall = True
    assert await cli(api, tmp_path, "set", "worker-1", "example.com/d=1", "--timeout", "0.3") == 1
    assert "cannot reach the API server for node 'worker-1'" in (err := capsys.readouterr().err)
    assert "no answer within 0.3 s" in err


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops", "HTTP 500 Internal Server Error: oops"),
        (
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: https://elsewhere.example/\r\nContent-Length: 0\r\n\r\n",
            "HTTP 307 Temporary Redirect to https://elsewhere.example/",
        ),
    ],
    ids=["500", "307"],
)
async def test_an_answer_without_a_content_type_is_one_line(
    api: ApiServerStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str], answer: bytes, said: str
) -> None:
    api.raw_answer = answer  # a proxy's answer, or a broken server's: no Kubernetes Status, no Content-Type
    assert await cli(api, tmp_path, "set", "worker-1", "example.com/dongle=2") == 1
    out = capsys.readouterr()
    assert out.out == ""
    (line,) = out.err.splitlines()
    assert line.startswith(f"cdiplug node-capacity set: node 'worker-1' on {api.url} (credentials from ")
    assert said in line


async def test_unusable_credentials_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["node-capacity", "set", "worker-1", "example.com/d=1", "--kubeconfig", str(tmp_path / "missing")]
    assert await asyncio.to_thread(main, argv) == 2
    assert f"cannot read kubeconfig: No such file or directory @ $ (in {tmp_path / 'missing'})" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["set", "worker-1", "dongle=4"], "needs a domain prefix"),
        (["set", "worker-1", "example.com/dongle=-1"], "not a non-negative integer"),
        (["set", "worker-1", "example.com/dongle=1.5"], "not a non-negative integer"),
        (["set", "worker-1", "example.com/dongle"], "expected NAME=COUNT"),
        (["set", "worker-1", "example.com/d=1", "example.com/d=2"], "named twice"),
        (["set", "Worker_1", "example.com/d=1"], "not a DNS-1123 subdomain"),
        (["set", "worker-1\n", "example.com/d=1"], "not a DNS-1123 subdomain"),
        (["remove", "worker-1", "kubernetes.io/d"], "reserved for native resources"),
        (["set", "worker-1", "example.com/d=1", "--timeout", "0"], "must be a number of seconds above 0"),
    ],
)
async def test_bad_arguments_exit_2(
    argv: list[str], message: str, api: ApiServerStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await cli(api, tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert api.received == []


def test_parse_quantity() -> None:
    assert parse_quantity("example.com/dongle=4") == ("example.com/dongle", 4)
    with pytest.raises(CapacityUsageError):
        parse_quantity("example.com/dongle=٣")  # a digit, but not an ASCII one


# -- TLS: a CA, a server certificate for 127.0.0.1, a client certificate (as kind's kubeconfig has) --


async def test_https_with_ca_and_client_certificate_data(tmp_path: Path) -> None:
    async with ApiServerStandIn(tls=True) as api:
        api.put_node("worker-1", capacity={})
        found = credentials(api, tmp_path, certificate=True)
        capacity = await asyncio.to_thread(NodeCapacity(found).set, "worker-1", {"example.com/dongle": 2})
        assert capacity == {"example.com/dongle": "2"}
        assert api.received[0].authorization is None


async def test_https_refuses_an_unknown_ca(tmp_path: Path) -> None:
    async with ApiServerStandIn(tls=True) as api:
        api.put_node("worker-1", capacity={})
        found = attrs.evolve(credentials(api, tmp_path, certificate=True), ca_pem=make_pki().ca.cert_pem)
        with pytest.raises(NodeCapacityError, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.to_thread(NodeCapacity(found, timeout=5).set, "worker-1", {"example.com/dongle": 2})
        assert api.received == []
