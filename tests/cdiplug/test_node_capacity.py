"""``cdiplug node-capacity``: the JSON Patch on a node's status, against a local API-server stand-in.

The stand-in is a real ``http.server`` on 127.0.0.1 in a thread (plain HTTP, and HTTPS with a CA
and client certificates made here with ``cryptography``). It checks the exact method, path, content
type, body and Authorization header of every request, and answers like the API server does
(the node object, or a Status with 403/404/422). Also covers kubeconfig parsing, the in-cluster
service account and the error messages.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cdiplug.cli import main
from cdiplug.node_capacity import (
    ApiServer,
    CapacityUsageError,
    KubeconfigError,
    NodeCapacity,
    NodeCapacityError,
    find_api_server,
    in_cluster,
    json_pointer_escape,
    load_kubeconfig,
    parse_quantity,
)

TOKEN = "s3cret-token"


class StandIn(ThreadingHTTPServer):
    """Holds nodes' capacity; applies add/remove ops on /status/capacity/* as the API server would."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.nodes: dict[str, dict[str, str]] = {"worker-1": {"cpu": "2", "pods": "110"}}
        self.requests: list[dict[str, Any]] = []
        self.token: str | None = TOKEN
        self.forbid = False


class _Handler(BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, *_args: Any) -> None:
        pass

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append(
            {
                "method": self.command,
                "path": self.path,
                "content_type": self.headers["Content-Type"],
                "authorization": self.headers.get("Authorization"),
                "body": json.loads(body),
            }
        )
        if self.server.token and self.headers.get("Authorization") != f"Bearer {self.server.token}":
            return self._status(401, "Unauthorized")
        if self.server.forbid:
            return self._status(
                403, 'nodes "worker-1" is forbidden: User "system:serviceaccount:x:y" cannot patch resource "nodes/status"'
            )
        if self.headers["Content-Type"] != "application/json-patch+json":
            return self._status(415, "unsupported media type")
        parts = self.path.split("/")
        if len(parts) != 6 or parts[:4] != ["", "api", "v1", "nodes"] or parts[5] != "status":
            return self._status(404, "the server could not find the requested resource")
        capacity = self.server.nodes.get(parts[4])
        if capacity is None:
            return self._status(404, f'nodes "{parts[4]}" not found')
        updated = dict(capacity)
        for op in json.loads(body):
            prefix = "/status/capacity/"
            assert op["path"].startswith(prefix)
            key = op["path"][len(prefix) :].replace("~1", "/").replace("~0", "~")
            if op["op"] == "add":
                updated[key] = op["value"]
            elif op["op"] == "remove" and key in updated:
                del updated[key]
            else:
                return self._status(422, f"the server rejected our request due to an error in our request: {op}")
        self.server.nodes[parts[4]] = updated
        self._json(200, {"kind": "Node", "metadata": {"name": parts[4]}, "status": {"capacity": updated}})

    def _status(self, code: int, message: str) -> None:
        self._json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})

    def _json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _serve(server: StandIn) -> Iterator[StandIn]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    yield from _serve(StandIn(("127.0.0.1", 0)))


def url_of(server: StandIn, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{server.server_address[1]}"


def write_kubeconfig(path: Path, server: str, user: dict[str, Any], cluster_extra: dict[str, Any] | None = None) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": {"server": server, **(cluster_extra or {})}}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


def test_set_sends_the_documented_patch(stand_in: StandIn) -> None:
    api = ApiServer(url=url_of(stand_in), source="test", token=TOKEN)
    capacity = NodeCapacity(api).set("worker-1", {"example.com/dongle": 4, "example.com/licence": 0})
    assert capacity["example.com/dongle"] == "4"
    assert capacity["example.com/licence"] == "0"
    assert stand_in.requests == [
        {
            "method": "PATCH",
            "path": "/api/v1/nodes/worker-1/status",
            "content_type": "application/json-patch+json",
            "authorization": f"Bearer {TOKEN}",
            "body": [
                {"op": "add", "path": "/status/capacity/example.com~1dongle", "value": "4"},
                {"op": "add", "path": "/status/capacity/example.com~1licence", "value": "0"},
            ],
        }
    ]


def test_remove_sends_remove_ops(stand_in: StandIn) -> None:
    stand_in.nodes["worker-1"]["example.com/dongle"] = "4"
    api = ApiServer(url=url_of(stand_in), source="test", token=TOKEN)
    capacity = NodeCapacity(api).remove("worker-1", ["example.com/dongle", "example.com/dongle"])
    assert "example.com/dongle" not in capacity
    assert stand_in.requests[0]["body"] == [{"op": "remove", "path": "/status/capacity/example.com~1dongle"}]


def test_json_pointer_escapes_tilde_before_slash() -> None:
    assert json_pointer_escape("example.com/a~b") == "example.com~1a~0b"
    assert json_pointer_escape("a~1") == "a~01"  # not "a~1", which would read back as "a/"


def test_cli_set_and_remove_with_kubeconfig(stand_in: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "config", url_of(stand_in), {"token": TOKEN})
    assert main(["node-capacity", "set", "worker-1", "example.com/dongle=4", "--kubeconfig", str(kubeconfig)]) == 0
    assert capsys.readouterr().out == "node worker-1: example.com/dongle=4\n"
    assert stand_in.nodes["worker-1"]["example.com/dongle"] == "4"
    assert main(["node-capacity", "remove", "worker-1", "example.com/dongle", "--kubeconfig", str(kubeconfig)]) == 0
    assert capsys.readouterr().out == "node worker-1: example.com/dongle removed\n"
    assert "example.com/dongle" not in stand_in.nodes["worker-1"]
    assert [r["body"][0]["op"] for r in stand_in.requests] == ["add", "remove"]


def test_node_not_found_names_node_and_server(stand_in: StandIn) -> None:
    api = ApiServer(url=url_of(stand_in), source="test", token=TOKEN)
    with pytest.raises(NodeCapacityError, match=rf"node 'worker-9' on {url_of(stand_in)} .*node not found"):
        NodeCapacity(api).set("worker-9", {"example.com/dongle": 1})


def test_forbidden_mentions_rbac(stand_in: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stand_in.forbid = True
    kubeconfig = write_kubeconfig(tmp_path / "config", url_of(stand_in), {"token": TOKEN})
    assert main(["node-capacity", "set", "worker-1", "example.com/dongle=4", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert "node 'worker-1'" in err and url_of(stand_in) in err
    assert "'patch' on the 'nodes/status'" in err and "deploy/rbac-node-capacity.yaml" in err


def test_unauthorized_and_missing_resource(stand_in: StandIn) -> None:
    with pytest.raises(NodeCapacityError, match="unauthorized"):
        NodeCapacity(ApiServer(url=url_of(stand_in), source="test", token="wrong")).set("worker-1", {"example.com/d": 1})
    with pytest.raises(NodeCapacityError, match="not in its capacity"):
        NodeCapacity(ApiServer(url=url_of(stand_in), source="test", token=TOKEN)).remove("worker-1", ["example.com/d"])


def test_unreachable_server() -> None:
    # A port nothing listens on: bind one, then close it.
    probe = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()
    with pytest.raises(NodeCapacityError, match=rf"cannot reach the API server for node 'n1' on http://127.0.0.1:{port}"):
        NodeCapacity(ApiServer(url=f"http://127.0.0.1:{port}", source="test"), timeout=5).set("n1", {"example.com/d": 1})


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
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], message: str, stand_in: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "config", url_of(stand_in), {"token": TOKEN})
    assert main(["node-capacity", *argv, "--kubeconfig", str(kubeconfig)]) == 2
    assert message in capsys.readouterr().err
    assert stand_in.requests == []


def test_parse_quantity() -> None:
    assert parse_quantity("example.com/dongle=4") == ("example.com/dongle", 4)
    with pytest.raises(CapacityUsageError):
        parse_quantity("example.com/dongle=٣")  # a digit, but not an ASCII one


# -- kubeconfig and in-cluster --------------------------------------------------------------------


def test_kubeconfig_files_relative_to_its_folder(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA PEM")
    (tmp_path / "token").write_text("from-file\n")
    path = write_kubeconfig(
        tmp_path / "config", "https://api.example:6443/", {"tokenFile": "token"}, {"certificate-authority": "ca.crt"}
    )
    api = load_kubeconfig(path)
    assert (api.url, api.token, api.ca_pem) == ("https://api.example:6443", "from-file", "CA PEM")
    assert api.headers() == {"Authorization": "Bearer from-file"}
    assert "context test" in api.source


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"exec": {"command": "aws"}}, "exec or auth-provider plugin"),
        ({"client-certificate-data": base64.b64encode(b"x").decode()}, "without its key"),
        ({"client-key-data": "!!notbase64"}, "not base64"),
        ({"tokenFile": "missing"}, "cannot read token file"),
    ],
)
def test_kubeconfig_errors(tmp_path: Path, user: dict[str, Any], message: str) -> None:
    path = write_kubeconfig(tmp_path / "config", "https://api.example:6443", user)
    with pytest.raises(KubeconfigError, match=message) as caught:
        load_kubeconfig(path)
    assert str(path) in str(caught.value)


def test_kubeconfig_context_choice(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", "http://127.0.0.1:1", {"token": "t"})
    with pytest.raises(KubeconfigError, match="context 'other' not found"):
        load_kubeconfig(path, "other")
    data = yaml.safe_load(path.read_text())
    del data["current-context"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(KubeconfigError, match="no current-context"):
        load_kubeconfig(path)
    assert load_kubeconfig(path, "test").token == "t"


def test_where_credentials_come_from(tmp_path: Path) -> None:
    first = write_kubeconfig(tmp_path / "first", "http://first:1", {"token": "a"})
    home_config = tmp_path / "home" / ".kube" / "config"
    home_config.parent.mkdir(parents=True)
    write_kubeconfig(home_config, "http://home:1", {"token": "h"})
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("sa-token\n")
    (account / "ca.crt").write_text("SA CA")
    home = tmp_path / "home"
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}

    assert find_api_server(str(first), None, env=in_pod, home=home, account_dir=account).url == "http://first:1"
    env = {"KUBECONFIG": f"{tmp_path / 'absent'}:{first}", **in_pod}
    assert find_api_server(None, None, env=env, home=home, account_dir=account).url == "http://first:1"
    api = find_api_server(None, None, env=in_pod, home=home, account_dir=account)
    assert (api.url, api.token, api.ca_pem) == ("https://10.96.0.1:443", "sa-token", "SA CA")
    assert find_api_server(None, None, env={}, home=home, account_dir=account).url == "http://home:1"
    with pytest.raises(KubeconfigError, match="no kubeconfig"):
        find_api_server(None, None, env={}, home=tmp_path / "nobody", account_dir=account)
    with pytest.raises(KubeconfigError, match="none of the files in KUBECONFIG exist"):
        find_api_server(None, None, env={"KUBECONFIG": str(tmp_path / "absent")}, home=home, account_dir=account)


def test_in_cluster_ipv6_and_missing_token(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA")
    with pytest.raises(KubeconfigError, match="cannot read token"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1"}, tmp_path)
    (tmp_path / "token").write_text("t")
    assert (
        in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, tmp_path).url
        == "https://[fd00::1]:6443"
    )


# -- TLS: a CA, a server certificate for 127.0.0.1, a client certificate (as kind's kubeconfig has) --


def _key_and_cert(
    name: str, issuer: tuple[Any, x509.Name] | None, ca: bool = False, ip: str | None = None
) -> tuple[Any, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signing_key, issuer_name = issuer if issuer else (key, subject)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
    return key, builder.sign(signing_key, hashes.SHA256())


def _pem(obj: Any) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@pytest.fixture
def tls_stand_in(tmp_path: Path) -> Iterator[tuple[StandIn, bytes, bytes, bytes]]:
    ca_key, ca_cert = _key_and_cert("test CA", None, ca=True)
    server_key, server_cert = _key_and_cert("apiserver", (ca_key, ca_cert.subject), ip="127.0.0.1")
    client_key, client_cert = _key_and_cert("kubernetes-admin", (ca_key, ca_cert.subject))
    (tmp_path / "server.pem").write_bytes(_pem(server_cert) + _pem(server_key))
    (tmp_path / "ca.pem").write_bytes(_pem(ca_cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem")
    context.load_verify_locations(tmp_path / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED  # like an API server authenticating by client certificate
    server = StandIn(("127.0.0.1", 0))
    server.token = None
    server.socket = context.wrap_socket(server.socket, server_side=True)
    for running in _serve(server):
        yield running, _pem(ca_cert), _pem(client_cert), _pem(client_key)


def test_https_with_ca_and_client_certificate_data(tls_stand_in: tuple[StandIn, bytes, bytes, bytes], tmp_path: Path) -> None:
    server, ca, cert, key = tls_stand_in
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    path = write_kubeconfig(
        tmp_path / "kind",
        url_of(server, "https"),
        {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
        {"certificate-authority-data": b64(ca)},
    )
    capacity = NodeCapacity(load_kubeconfig(path)).set("worker-1", {"example.com/dongle": 2})
    assert capacity["example.com/dongle"] == "2"
    assert server.requests[0]["authorization"] is None


def test_https_refuses_an_unknown_ca(tls_stand_in: tuple[StandIn, bytes, bytes, bytes]) -> None:
    server, _ca, cert, key = tls_stand_in
    other_ca = _pem(_key_and_cert("other CA", None, ca=True)[1]).decode()
    api = ApiServer(
        url=url_of(server, "https"), source="test", ca_pem=other_ca, client_cert_pem=cert.decode(), client_key_pem=key.decode()
    )
    with pytest.raises(NodeCapacityError, match="CERTIFICATE_VERIFY_FAILED"):
        NodeCapacity(api, timeout=5).set("worker-1", {"example.com/dongle": 2})
    assert server.requests == []
