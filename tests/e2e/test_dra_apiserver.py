"""The DRA front end's API side against a REAL kube-apiserver 1.36 (the node kit in ../shared/k8s).

etcd and kube-apiserver run on free loopback ports in a temporary folder (token auth, nothing
else of a cluster: no kubelet, no scheduler), so this never disturbs a local cluster. Covers what
the stand-in only imitates: lightkube with a kubeconfig over TLS; the slice publisher's pools
(several slices, generations, field selectors) as the real server stores them; device taints kept
by the 1.36 server (so unhealthy devices are tainted, not withdrawn); a slice deleted behind the
publisher's back comes back; a ResourceClaim's allocation read back from the status the
scheduler would write; ``node-capacity``'s JSON Patch on a node's status as the real server applies it; the DRA overlay and example claims accepted by the server (dry run). The server runs
``--authorization-mode Node,RBAC``: the claim device status (KEP-4817) our driver applies is
refused (422) by 1.36's granular status authorization to the overlay's role less
``resourceclaims/driver`` and to a pod's token on another node, accepted with the role as
shipped, keeps another driver's entry, is cleared by an empty apply, and a wrong UID is refused.
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
import yaml

from cdiplug.dra import status
from cdiplug.dra.claims import AllocatedDevice, ClaimRef, allocated
from cdiplug.dra.publisher import SlicePublisher
from cdiplug.dra.slices import UnhealthyPolicy
from cdiplug.errors import KubernetesError
from cdiplug.kube.client import LightkubeClient
from cdiplug.kube.credentials import load_kubeconfig
from cdiplug.kube.node_capacity import NodeCapacity, NodeCapacityError
from cdiplug.models.devices import Device, DeviceSnapshot, Health

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
                 "--token-auth-file", "tokens.csv", "--authorization-mode", "Node,RBAC",
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
    client = LightkubeClient(load_kubeconfig(apiserver))
    yield client
    await client.close()


async def test_publisher_against_the_real_server(client: LightkubeClient, apiserver: Path) -> None:
    publisher = SlicePublisher(client, DRIVER, "n1", backoff=(0.05, 0.5))
    task = asyncio.create_task(publisher.run(), name="publisher")
    try:
        devices = [Device(f"fpga-{i}", attributes={"speed": i, "fast": i > 5}) for i in range(300)]
        publisher.want(DeviceSnapshot("example.com/fpga", devices))
        await asyncio.wait_for(publisher.wait_published(1), 30)
        items = [i.to_dict() for i in (await client.list_slices(DRIVER, "n1"))[0]]
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
        items = [i.to_dict() for i in (await client.list_slices(DRIVER, "n1"))[0]]
        tainted = [(d["name"], d["taints"][0]["effect"]) for i in items for d in i["spec"]["devices"] if d.get("taints")]
        assert tainted == [("fpga-3", "NoSchedule")]
        assert len(items) == 5 and {i["spec"]["pool"]["generation"] for i in items} == {2}  # 64 per tainted slice

        kubectl(apiserver, "delete", "resourceslice", f"n1-{DRIVER}-0")
        await asyncio.wait_for(publisher.wait_published(3), 30)
        items = [i.to_dict() for i in (await client.list_slices(DRIVER, "n1"))[0]]
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

    def opaque(driver: str, mode: str) -> dict[str, object]:
        return {"driver": driver, "parameters": {"apiVersion": "cdiplug.dev/v1alpha1", "kind": "FakeConfig", "mode": mode}}

    # as the scheduler copies them: the claim's entries may come first in the list; the class's still rank below
    config = [
        {"source": "FromClaim", "requests": ["fpga"], "opaque": opaque(DRIVER, "claim")},
        {"source": "FromClass", "opaque": opaque(DRIVER, "class")},
        {"source": "FromClaim", "opaque": opaque("other.example.com", "not ours")},
    ]
    created["status"] = {"allocation": {"devices": {"results": results, "config": config}}}
    kubectl(apiserver, "replace", "--subresource=status", "-f", "-", input=created)
    got = await client.get_claim("default", "c1")
    assert got.metadata is not None and got.metadata.uid is not None
    ref = ClaimRef("default", "c1", got.metadata.uid)
    claim = allocated(got, ref, DRIVER, "n1")
    assert claim.results == (AllocatedDevice("fpga", "n1", "fpga-7"),)
    assert [(c.source.value, c.requests, c.parameters["mode"]) for c in claim.configs_for("fpga")] == [
        ("FromClass", (), "class"),
        ("FromClaim", ("fpga",), "claim"),
    ]


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


def test_node_capacity_through_the_real_server(apiserver: Path) -> None:
    # No kubelet here: the node's status gets the capacity a kubelet would have reported.
    status = json.dumps({"status": {"capacity": {"cpu": "2", "pods": "110"}}})
    kubectl(apiserver, "patch", "node", "n1", "--subresource=status", "--type=merge", "-p", status)
    client = NodeCapacity(load_kubeconfig(apiserver), timeout=30)
    assert client.set("n1", {"example.com/dongle": 4})["example.com/dongle"] == "4"
    node = json.loads(kubectl(apiserver, "get", "node", "n1", "-o", "json"))
    assert node["status"]["capacity"]["example.com/dongle"] == "4"
    assert client.remove("n1", ["example.com/dongle"]) == {"cpu": "2", "pods": "110"}
    with pytest.raises(NodeCapacityError, match="n1.*cannot remove, most likely a named resource is not in its capacity"):
        client.remove("n1", ["example.com/dongle"])
    with pytest.raises(NodeCapacityError, match="node 'n9' on https://127.0.0.1:.*node not found"):
        client.set("n9", {"example.com/dongle": 1})


def _as_user(apiserver: Path, token: str, path: Path) -> Path:
    config = json.loads(apiserver.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    path.write_text(json.dumps(config))
    return path


def _roles(without_driver: bool) -> list[dict[str, Any]]:
    """The overlay's DRA ClusterRole rules (optionally less resourceclaims/driver), as the daemon gets them."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/overlays/dra/rbac.yaml").read_text()) if d]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    rules: list[dict[str, Any]] = role["rules"]
    return [r for r in rules if not (without_driver and "resourceclaims/driver" in r["resources"])]


async def test_claim_device_status_needs_the_driver_verb_and_keeps_others(apiserver: Path, tmp_path: Path) -> None:
    # KEP-4817 with 1.36's granular status authorization, against the real server with Node,RBAC:
    # the overlay's role less resourceclaims/driver is refused; the role as shipped writes our
    # entries of status.devices (server-side apply), another driver's entry is kept, and clearing
    # removes only ours. The token is bound to a pod on n1, as the DaemonSet's is (its node name).
    ns = "status-e2e"
    kubectl(apiserver, "create", "namespace", ns)
    kubectl(apiserver, "create", "serviceaccount", "driver", "-n", ns)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "driver-pod", "namespace": ns},
        "spec": {"nodeName": "n1", "serviceAccountName": "driver", "containers": [{"name": "c", "image": "cdiplug"}]},
    }
    kubectl(apiserver, "create", "-f", "-", input=pod)
    for which, without in (("less", True), ("full", False)):
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"status-e2e-{which}"},
            "rules": _roles(without),
        }
        kubectl(apiserver, "create", "-f", "-", input=role)
    kubectl(
        apiserver, "create", "clusterrolebinding", "status-e2e", "--clusterrole=status-e2e-less", f"--serviceaccount={ns}:driver"
    )
    bound = ["create", "token", "driver", "-n", ns, "--bound-object-kind", "Pod", "--bound-object-name", "driver-pod"]
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(apiserver), *bound], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    results = [
        {"request": "fpga", "driver": DRIVER, "pool": "n1", "device": "fpga-1"},
        {"request": "other", "driver": "other.example.com", "pool": "n1", "device": "x"},
    ]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c-status", "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "fpga", "exactly": {"deviceClassName": DRIVER}},
                    {"name": "other", "exactly": {"deviceClassName": "other"}},
                ]
            }
        },
    }
    created = json.loads(kubectl(apiserver, "create", "-f", "-", "-o", "json", input=claim))
    selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
    created["status"] = {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}
    kubectl(apiserver, "replace", "--subresource=status", "-f", "-", input=created)
    uid = created["metadata"]["uid"]
    theirs = {"driver": "other.example.com", "pool": "n1", "device": "x", "data": {"theirs": True}}
    admin = LightkubeClient(load_kubeconfig(apiserver))
    driver = LightkubeClient(load_kubeconfig(_as_user(apiserver, token, tmp_path / "driver.kubeconfig")))
    try:
        await admin.apply_claim_status(ns, "c-status", status.apply_body(ns, "c-status", uid, [theirs]), "other-driver")
        device = Device("fpga-1", numa_nodes=(0,), attributes={"speed": 9, "model": "fake fpga"})
        ours = status.device_status(DRIVER, "n1", "fpga-1", device)
        body = status.apply_body(ns, "c-status", uid, [ours])
        with pytest.raises(KubernetesError) as refused:
            await driver.apply_claim_status(ns, "c-status", body, status.field_manager(DRIVER))
        # refused by the status strategy's validation (a field error), so 422 rather than RBAC's 403
        assert refused.value.status == 422, refused.value
        assert 'cannot associated-node:patch resource "resourceclaims/driver"' in str(refused.value), refused.value

        kubectl(apiserver, "delete", "clusterrolebinding", "status-e2e")
        kubectl(
            apiserver,
            "create",
            "clusterrolebinding",
            "status-e2e",
            "--clusterrole=status-e2e-full",
            f"--serviceaccount={ns}:driver",
        )
        deadline = time.monotonic() + 30  # RBAC's informer picks the binding up: nothing to await from here
        while True:
            try:
                written = (await driver.apply_claim_status(ns, "c-status", body, status.field_manager(DRIVER))).to_dict()
                break
            except KubernetesError as exc:
                assert exc.status == 422 and time.monotonic() < deadline, exc
                await asyncio.sleep(0.2)
        got = json.loads(kubectl(apiserver, "get", "resourceclaim", "c-status", "-n", ns, "-o", "json"))
        assert [(d["driver"], d["device"]) for d in written["status"]["devices"]] == [
            (d["driver"], d["device"]) for d in got["status"]["devices"]
        ]
        by_driver = {d["driver"]: d for d in got["status"]["devices"]}
        assert by_driver["other.example.com"]["data"] == {"theirs": True}
        kept = by_driver[DRIVER]
        assert kept["conditions"][0]["type"] == "Ready" and kept["conditions"][0]["status"] == "True"
        assert kept["data"] == {"id": "fpga-1", "attributes": {"speed": 9, "model": "fake fpga"}, "numaNodes": [0]}
        assert got["status"]["allocation"]["devices"]["results"] == results

        # associated-node: the same role from a pod on another node (n2; the claim is on n1) is refused:
        # that would need arbitrary-node:patch. (Unchanged entries need no driver verb at all, so
        # the entry is changed here.)
        kubectl(apiserver, "create", "-f", "-", input={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}})
        kubectl(
            apiserver,
            "create",
            "-f",
            "-",
            input={**pod, "metadata": {"name": "elsewhere", "namespace": ns}, "spec": {**pod["spec"], "nodeName": "n2"}},
        )
        bound[-1] = "elsewhere"
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(apiserver), *bound], capture_output=True, text=True, check=False, timeout=60
        )
        assert done.returncode == 0, done.stderr
        other_node = LightkubeClient(load_kubeconfig(_as_user(apiserver, done.stdout.strip(), tmp_path / "n2.kubeconfig")))
        try:
            with pytest.raises(KubernetesError) as elsewhere:
                changed = status.device_status(DRIVER, "n1", "fpga-1", device, now="2020-01-01T00:00:00Z")
                await other_node.apply_claim_status(
                    ns, "c-status", status.apply_body(ns, "c-status", uid, [changed]), status.field_manager(DRIVER)
                )
            assert elsewhere.value.status == 422 and "arbitrary-node:patch" in str(elsewhere.value), elsewhere.value
        finally:
            await other_node.close()

        # data over the server's limit is refused; what device_data makes of such a device is accepted
        big = Device("fpga-1", attributes={f"a{i}": "v" * 400 for i in range(30)})
        raw = {**ours, "data": {"attributes": dict(big.attributes)}}
        with pytest.raises(KubernetesError) as too_big:
            await driver.apply_claim_status(
                ns, "c-status", status.apply_body(ns, "c-status", uid, [raw]), status.field_manager(DRIVER)
            )
        assert too_big.value.status == 422 and "data" in str(too_big.value), too_big.value
        cut = status.device_status(DRIVER, "n1", "fpga-1", big)
        await driver.apply_claim_status(
            ns, "c-status", status.apply_body(ns, "c-status", uid, [cut]), status.field_manager(DRIVER)
        )

        # a recreated claim of the same name is never written: the UID is a precondition
        stale = status.apply_body(ns, "c-status", "00000000-0000-0000-0000-000000000000", [ours])
        with pytest.raises(KubernetesError) as conflict:
            await driver.apply_claim_status(ns, "c-status", stale, status.field_manager(DRIVER))
        assert conflict.value.status == 422 and "metadata.uid" in str(conflict.value), conflict.value

        cleared = (
            await driver.apply_claim_status(
                ns, "c-status", status.apply_body(ns, "c-status", uid, []), status.field_manager(DRIVER)
            )
        ).to_dict()
        assert [d["driver"] for d in cleared["status"]["devices"]] == ["other.example.com"]
        assert cleared["status"]["allocation"]["devices"]["results"] == results
    finally:
        await driver.close()
        await admin.close()
