"""cdiplug's Kubernetes client (cdiplug.kube.client, lightkube) against the API-server stand-in.

The stand-in (cdiplug.testing.ApiServerStandIn) serves real HTTP on 127.0.0.1, and HTTPS with a
CA of its own for the TLS cases: token auth from a kubeconfig, a client certificate as kind's
kubeconfig has, an unknown CA refused, an in-cluster token rotated under a running client, a
server that never answers cut at the timeout, JSON Patch on a node's status, and errors that name
the API object, the server and where the credentials came from. The real kube-apiserver is
tests/e2e/test_dra_apiserver.py's.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from cdiplug.errors import KubernetesError
from cdiplug.kube.client import ApiCallError, LightkubeClient, connect
from cdiplug.kube.credentials import find_credentials, load_kubeconfig
from cdiplug.testing import ApiServerStandIn
from cdiplug.testing.certs import make_pki


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    async with ApiServerStandIn() as server:
        server.put_node("n1", capacity={"cpu": "2"})
        yield server


@pytest.fixture
async def tls_api() -> AsyncIterator[ApiServerStandIn]:
    async with ApiServerStandIn(tls=True) as server:
        server.put_node("n1")
        yield server


async def test_token_from_a_kubeconfig(api: ApiServerStandIn, tmp_path: Path) -> None:
    client = connect(api.kubeconfig(tmp_path / "kubeconfig"))
    try:
        node = await client.get_node("n1")
    finally:
        await client.close()
    assert node.metadata is not None and node.metadata.name == "n1"
    assert api.received[-1].authorization == f"Bearer {api.token}"


@pytest.mark.slow
async def test_an_idle_connection_is_kept_for_the_next_call(tls_api: ApiServerStandIn, tmp_path: Path) -> None:
    # Pods that start a few seconds apart: each claim read goes over the connection the last one
    # left, not through a new TLS handshake (httpx alone closes a connection idle for 5 s).
    client = LightkubeClient(load_kubeconfig(tls_api.kubeconfig(tmp_path / "kubeconfig", certificate=True)))
    try:
        await client.get_node("n1")
        await asyncio.sleep(6)  # the idle time is what is tested
        await client.get_node("n1")
    finally:
        await client.close()
    assert tls_api.connections == 1


async def test_patch_node_status_sends_a_json_patch(api: ApiServerStandIn, tmp_path: Path) -> None:
    client = LightkubeClient(load_kubeconfig(api.kubeconfig(tmp_path / "kubeconfig")))
    try:
        ops = [{"op": "add", "path": "/status/capacity/example.com~1dongle", "value": "4"}]
        node = await client.patch_node_status("n1", ops)
    finally:
        await client.close()
    assert node.status is not None and node.status.capacity == {"cpu": "2", "example.com/dongle": "4"}
    assert api.node("n1")["status"]["capacity"]["example.com/dongle"] == "4"
    sent = api.received[-1]
    assert (sent.method, sent.path, sent.content_type) == ("PATCH", "/api/v1/nodes/n1/status", "application/json-patch+json")


async def test_errors_name_the_object_the_server_and_the_credentials(api: ApiServerStandIn, tmp_path: Path) -> None:
    path = api.kubeconfig(tmp_path / "kubeconfig")
    client = LightkubeClient(load_kubeconfig(path))
    try:
        with pytest.raises(KubernetesError) as info:
            await client.get_node("n9")
        assert info.value.status == 404
        assert (
            str(info.value)
            == f'cannot read Node n9 on {api.url} (credentials from {path} (context standin)): nodes "n9" not found'
        )
        api.forbidden.add("patch nodes/status")
        with pytest.raises(KubernetesError, match='cannot patch resource "nodes/status"') as info:
            await client.patch_node_status("n1", [])
        assert info.value.status == 403
    finally:
        await client.close()


async def test_a_wrong_token_is_401(api: ApiServerStandIn, tmp_path: Path) -> None:
    api.token = "another"
    client = LightkubeClient(load_kubeconfig(api.kubeconfig(tmp_path / "kubeconfig")))
    api.token = "rotated"
    try:
        with pytest.raises(KubernetesError) as info:
            await client.get_claim("default", "c1")
    finally:
        await client.close()
    assert info.value.status == 401 and "cannot read ResourceClaim default/c1" in str(info.value)


async def test_client_certificate_over_tls(tls_api: ApiServerStandIn, tmp_path: Path) -> None:
    client = connect(tls_api.kubeconfig(tmp_path / "kind", certificate=True))
    try:
        node = await client.get_node("n1")
        assert node.metadata is not None and node.metadata.name == "n1"
    finally:
        await client.close()
    assert tls_api.url.startswith("https://")
    assert tls_api.received[-1].authorization is None  # the certificate authenticated


async def test_an_unknown_ca_is_refused(tls_api: ApiServerStandIn, tmp_path: Path) -> None:
    path = tls_api.kubeconfig(tmp_path / "kubeconfig")
    other_ca = make_pki().ca.cert_pem
    client = LightkubeClient(attrs.evolve(load_kubeconfig(path), ca_pem=other_ca))
    try:
        with pytest.raises(KubernetesError, match="CERTIFICATE_VERIFY_FAILED") as info:
            await client.get_node("n1")
    finally:
        await client.close()
    assert info.value.status is None and str(path) in str(info.value)
    assert tls_api.received == []


async def test_in_cluster_token_is_read_again_when_rotated(tls_api: ApiServerStandIn, tmp_path: Path) -> None:
    assert tls_api.pki is not None
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(f"{tls_api.token}\n")
    (account / "ca.crt").write_text(tls_api.pki.ca.cert_pem)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(tls_api.port)}
    credentials = find_credentials(None, env=env, home=tmp_path / "nobody", account_dir=account)
    client = LightkubeClient(credentials)
    try:
        await client.get_node("n1")
        tls_api.token = "rotated-by-the-kubelet"
        (account / "token").write_text("rotated-by-the-kubelet\n")
        await client.get_node("n1")  # a 401 first, then the file again
    finally:
        await client.close()
    assert [r.authorization for r in tls_api.received[-2:]] == ["Bearer test-token", "Bearer rotated-by-the-kubelet"]


async def test_a_server_that_never_answers_is_cut_at_the_timeout(api: ApiServerStandIn, tmp_path: Path) -> None:
    client = LightkubeClient(load_kubeconfig(api.kubeconfig(tmp_path / "kubeconfig")), timeout=1)
    api.stall = True
    started = time.monotonic()
    try:
        with pytest.raises(KubernetesError, match="cannot read Node n1 on .*: no answer within 1 s") as info:
            await client.get_node("n1")
    finally:
        await client.close()
    assert info.value.status is None  # no answer: the caller retries
    assert time.monotonic() - started < 5
    assert api.received[-1].path == "/api/v1/nodes/n1"  # asked, and never answered (1 s: a loaded machine's connect)


async def test_an_unreachable_server(tmp_path: Path) -> None:
    async with ApiServerStandIn() as gone:
        path = gone.kubeconfig(tmp_path / "kubeconfig")
    client = connect(path)
    try:
        with pytest.raises(KubernetesError, match="cannot list the ResourceSlices of d on n1 on http://127.0.0.1") as info:
            await asyncio.wait_for(client.list_slices("d", "n1"), 30)
    finally:
        await client.close()
    assert info.value.status is None


# Answers no Kubernetes API server gives but a proxy, a load balancer or a broken server does:
# (raw answer, the HTTP status the error carries, what the error says after the call).
BROKEN_ANSWERS = {
    "500 without a Content-Type": (
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops",
        500,
        "HTTP 500 Internal Server Error: oops",
    ),
    "307 without a Content-Type": (
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: https://elsewhere.example/\r\nContent-Length: 0\r\n\r\n",
        307,
        "HTTP 307 Temporary Redirect to https://elsewhere.example/ (redirects are not followed)",
    ),
    "200 that is no JSON": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello",
        None,
        "the answer does not decode: ",
    ),
}


@pytest.mark.parametrize("answer", BROKEN_ANSWERS, ids=list(BROKEN_ANSWERS))
async def test_every_failure_of_the_client_library_is_our_error_naming_the_call(
    api: ApiServerStandIn, tmp_path: Path, answer: str
) -> None:
    raw, status, detail = BROKEN_ANSWERS[answer]
    path = api.kubeconfig(tmp_path / "kubeconfig")
    client = LightkubeClient(load_kubeconfig(path))
    api.raw_answer = raw
    try:
        with pytest.raises(ApiCallError) as info:
            await client.get_node("n1")
        with pytest.raises(ApiCallError) as watching:
            async for _ in client.watch_slices("d", "n1", ""):
                pass
    finally:
        await client.close()
    assert str(info.value).startswith(f"cannot read Node n1 on {api.url} (credentials from {path} (context standin)): {detail}")
    assert "\n" not in str(info.value)
    assert info.value.status == status
    assert str(watching.value).startswith(f"watching the ResourceSlices of d on n1 failed on {api.url}")


async def test_one_watch_call_is_one_watch_request(api: ApiServerStandIn, tmp_path: Path) -> None:
    """The server ends the watch after 1 s; lightkube would open it again at once, forever: the call ends instead."""
    api.put_slice(
        {
            "metadata": {"name": "s1"},
            "spec": {"driver": "d", "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}},
        }
    )
    client = LightkubeClient(load_kubeconfig(api.kubeconfig(tmp_path / "kubeconfig")), watch_timeout=1)
    try:
        async with asyncio.timeout(10):  # without the guard: a new watch every second until this
            events = [(kind, obj.metadata and obj.metadata.name) async for kind, obj in client.watch_slices("d", "n1", "")]
    finally:
        await client.close()
    assert events == [("ADDED", "s1")]
    assert api.count("GET", "resourceslices", watch=True) == 1


def test_the_command_line_parsers_load_no_kubernetes_client() -> None:
    code = (
        "import sys; from cdiplug.cli import build_parser; build_parser();"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
