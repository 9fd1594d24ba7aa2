"""The DRA front end's API side against a REAL kube-apiserver 1.36 (the node kit in ../shared/k8s).

etcd and kube-apiserver run on free loopback ports in a temporary folder (token auth, nothing
else of a cluster: no kubelet, no scheduler), so this never disturbs a local cluster. Covers what
the stand-in only imitates: lightkube with a kubeconfig over TLS; the slice publisher's pools
(several slices, generations, field selectors) as the real server stores them; device taints kept
by the 1.36 server (so unhealthy devices are tainted, not withdrawn); a slice deleted behind the
publisher's back comes back; a ResourceClaim's allocation read back from the status the
scheduler would write; the DRA overlay and example claims accepted by the server (dry run).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from cdiplug.dra.claims import AllocatedDevice, ClaimRef, allocated
from cdiplug.dra.kubeclient import LightkubeClient, load_config
from cdiplug.dra.publisher import SlicePublisher
from cdiplug.dra.slices import UnhealthyPolicy
from cdiplug.model import Device, DeviceSnapshot, Health

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
KIT = REPO.parent / "shared" / "k8s"
DRIVER = "fpga.example.com"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def apiserver_binary(folder: Path) -> Path:
    """kube-apiserver of the node kit: an unpacked copy in /var/tmp/cdiplug-cache, else unpacked here."""
    cached = sorted(Path("/var/tmp/cdiplug-cache").glob("k8s-*/kube-apiserver"))
    if cached:
        return cached[0]
    archives = sorted(KIT.glob("kubernetes-*.tar.xz"))
    assert archives, f"no node kit in {KIT} (kubernetes-*.tar.xz)"
    with tarfile.open(archives[0]) as tar:
        tar.extract("kube-apiserver", folder, filter="data")
    binary = folder / "kube-apiserver"
    binary.chmod(0o755)
    return binary


def wait_ready(url: str, token: str, ca: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until /readyz answers ok (the process starting: nothing to await but the port)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"kube-apiserver exited: {log.read_text()[-3000:]}"
        done = subprocess.run(
            ["curl", "-sf", "--cacert", str(ca), "-H", f"Authorization: Bearer {token}", f"{url}/readyz"],
            capture_output=True,
            check=False,
        )
        if done.stdout == b"ok":
            return
        time.sleep(0.5)
    raise AssertionError(f"kube-apiserver not ready: {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real API server; yields its kubeconfig."""
    missing = [t for t in ("etcd", "openssl", "curl", "kubectl") if shutil.which(t) is None]
    assert not missing, f"needs {', '.join(missing)} (apt-get install etcd-server openssl curl; kubectl)"
    folder = tmp_path_factory.mktemp("apiserver")
    binary = apiserver_binary(folder)
    ssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        [*ssl, "-keyout", "tls.key", "-out", "tls.crt", "-addext", "subjectAltName=IP:127.0.0.1"],
        cwd=folder,
        check=True,
        capture_output=True,
    )
    subprocess.run(["openssl", "genrsa", "-out", "sa.key", "2048"], cwd=folder, check=True, capture_output=True)
    token = "dra-e2e-token"
    (folder / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    etcd_port, peer_port, port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    procs = []
    try:
        etcd_log = (folder / "etcd.log").open("wb")
        procs.append(
            subprocess.Popen(
                ["etcd", "--data-dir", str(folder / "etcd"), "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                 "--listen-peer-urls", f"http://127.0.0.1:{peer_port}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-cluster", f"default=http://127.0.0.1:{peer_port}"],
                stdout=etcd_log, stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        log = folder / "apiserver.log"
        procs.append(
            subprocess.Popen(
                [str(binary), "--etcd-servers", etcd_url, "--bind-address", "127.0.0.1", "--secure-port", str(port),
                 "--advertise-address", "127.0.0.1", "--tls-cert-file", "tls.crt", "--tls-private-key-file", "tls.key",
                 "--token-auth-file", "tokens.csv", "--authorization-mode", "AlwaysAllow",
                 "--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", "sa.key",
                 "--service-account-signing-key-file", "sa.key", "--endpoint-reconciler-type", "none",
                 "--service-cluster-ip-range", "10.96.0.0/16"],
                cwd=folder, stdout=log.open("wb"), stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        url = f"https://127.0.0.1:{port}"
        wait_ready(url, token, folder / "tls.crt", procs[-1], log)
        kubeconfig = folder / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "e2e", "cluster": {"server": url, "certificate-authority": str(folder / "tls.crt")}}],
                    "users": [{"name": "admin", "user": {"token": token}}],
                    "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
                    "current-context": "e2e",
                }
            )
        )
        kubectl(kubeconfig, "create", "-f", "-", input={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        yield kubeconfig
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def kubectl(kubeconfig: Path, *args: str, input: Any = None) -> str:
    # --validate=false where it applies: this kube-apiserver build cannot serve its OpenAPI document.
    validate = ["--validate=false"] if args and args[0] in ("create", "replace", "apply") else []
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args[:1], *validate, *args[1:]],
        input=json.dumps(input) if input is not None else None,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture
async def client(apiserver: Path) -> AsyncIterator[LightkubeClient]:
    client = LightkubeClient(load_config(apiserver))
    yield client
    await client.close()


async def test_publisher_against_the_real_server(client: LightkubeClient, apiserver: Path) -> None:
    publisher = SlicePublisher(client, DRIVER, "n1", backoff=(0.05, 0.5))
    task = asyncio.create_task(publisher.run(), name="publisher")
    try:
        devices = [Device(f"fpga-{i}", attributes={"speed": i, "fast": i > 5}) for i in range(300)]
        publisher.want(DeviceSnapshot("example.com/fpga", devices))
        await asyncio.wait_for(publisher.wait_published(1), 30)
        items, _ = await client.list_slices(DRIVER, "n1")
        assert sorted((len(i["spec"]["devices"]), i["spec"]["pool"]["resourceSliceCount"]) for i in items) == [
            (44, 3),
            (128, 3),
            (128, 3),
        ]
        assert all(i["metadata"]["ownerReferences"][0]["name"] == "n1" for i in items)

        sick = [attrs.evolve(d, health=Health.UNHEALTHY) if d.id == "fpga-3" else d for d in devices]
        publisher.want(DeviceSnapshot("example.com/fpga", sick))
        await asyncio.wait_for(publisher.wait_published(2), 30)
        assert publisher.policy is UnhealthyPolicy.TAINT  # the 1.36 server keeps device taints
        items, _ = await client.list_slices(DRIVER, "n1")
        tainted = [(d["name"], d["taints"][0]["effect"]) for i in items for d in i["spec"]["devices"] if d.get("taints")]
        assert tainted == [("fpga-3", "NoSchedule")]
        assert len(items) == 5 and {i["spec"]["pool"]["generation"] for i in items} == {2}  # 64 per tainted slice

        kubectl(apiserver, "delete", "resourceslice", f"n1-{DRIVER}-0")
        await asyncio.wait_for(publisher.wait_published(3), 30)
        items, _ = await client.list_slices(DRIVER, "n1")
        assert len(items) == 5 and {i["spec"]["pool"]["generation"] for i in items} == {3}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await publisher.withdraw()
    assert (await client.list_slices(DRIVER, "n1"))[0] == []


async def test_claim_allocation_as_the_scheduler_writes_it(client: LightkubeClient, apiserver: Path) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    created = json.loads(kubectl(apiserver, "create", "-f", "-", "-o", "json", input=claim))
    results = [{"request": "fpga", "driver": DRIVER, "pool": "n1", "device": "fpga-7"}]
    created["status"] = {"allocation": {"devices": {"results": results}}}
    kubectl(apiserver, "replace", "--subresource=status", "-f", "-", input=created)
    got = await client.get_claim("default", "c1")
    ref = ClaimRef("default", "c1", got["metadata"]["uid"])
    assert allocated(got, ref, DRIVER, "n1") == (AllocatedDevice("fpga", "n1", "fpga-7"),)


def test_the_dra_manifests_are_accepted(apiserver: Path) -> None:
    kubectl(apiserver, "create", "namespace", "cdiplug-system")
    out = kubectl(apiserver, "apply", "--dry-run=server", "-k", str(REPO / "deploy/overlays/dra"))
    for what in ("deviceclass.resource.k8s.io/fpga.example.com", "validatingadmissionpolicy", "clusterrole", "daemonset"):
        assert what in out
    rendered = kubectl(apiserver, "kustomize", str(REPO / "deploy/examples/dra"))
    claims = "\n---\n".join(d for d in rendered.split("\n---\n") if "kind: ResourceClaimTemplate" in d)
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(apiserver), "apply", "--validate=false", "--dry-run=server", "-o", "json", "-f", "-"],
        input=claims,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    fastest = next(i for i in items if i["metadata"]["name"] == "fastest-fpga")
    (request,) = fastest["spec"]["spec"]["devices"]["requests"]
    assert [s["name"] for s in request["firstAvailable"]] == ["fast", "any"]  # kept by the server: prioritized lists are on
