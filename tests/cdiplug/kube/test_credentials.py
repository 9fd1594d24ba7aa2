"""Where cdiplug finds Kubernetes credentials (cdiplug.kube.credentials): kubectl's order.

Real files in a temporary folder for every source (``--kubeconfig``, ``$KUBECONFIG`` with several
files merged, ``~/.kube/config``, the in-cluster service account), their precedence, and the
errors for missing or bad files, each naming the file. The environment, home folder and
service-account folder are passed in, so nothing of this machine's own configuration is read.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdiplug.errors import KubernetesError
from cdiplug.kube.credentials import CredentialsError, find_credentials, in_cluster, load_kubeconfig

IN_POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def kubeconfig(
    path: Path,
    server: str = "https://api.example:6443",
    user: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    *,
    names: tuple[str, str, str] = ("test", "c", "u"),
    current: str | None = "test",
) -> Path:
    context, cluster_name, user_name = names
    data: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "contexts": [{"name": context, "context": {"cluster": cluster_name, "user": user_name}}],
        "clusters": [{"name": cluster_name, "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": user_name, "user": user if user is not None else {"token": "t"}}],
    }
    if current:
        data["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    """One of each: a file for the flag, one for $KUBECONFIG, ~/.kube/config, a service account."""
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("sa-token\n")
    (account / "ca.crt").write_text("SA CA")
    return {
        "flag": kubeconfig(tmp_path / "flag", "http://flag:1"),
        "env": kubeconfig(tmp_path / "env", "http://env:1"),
        "home": tmp_path / "home",
        "account": account,
        "_home_config": kubeconfig(tmp_path / "home" / ".kube" / "config", "http://home:1"),
    }


def find(sources: dict[str, Path], flag: bool, env: bool, home: bool, pod: bool) -> str:
    environ = {**(IN_POD if pod else {}), **({"KUBECONFIG": str(sources["env"])} if env else {})}
    found = find_credentials(
        sources["flag"] if flag else None,
        env=environ,
        home=sources["home"] if home else sources["home"].parent / "nobody",
        account_dir=sources["account"],
    )
    return found.server


def test_kubectl_order_each_source_and_what_it_beats(sources: dict[str, Path]) -> None:
    assert find(sources, flag=True, env=True, home=True, pod=True) == "http://flag:1"
    assert find(sources, flag=False, env=True, home=True, pod=True) == "http://env:1"
    assert find(sources, flag=False, env=False, home=True, pod=True) == "http://home:1"
    assert find(sources, flag=False, env=False, home=False, pod=True) == "https://10.96.0.1:443"
    with pytest.raises(CredentialsError, match="no Kubernetes credentials") as info:
        find(sources, flag=False, env=False, home=False, pod=False)
    assert "--kubeconfig, $KUBECONFIG, ~/.kube/config, then the in-cluster service account" in str(info.value)
    assert isinstance(info.value, KubernetesError)  # what the DRA front end reports at start


def test_sources_are_named_for_later_errors(sources: dict[str, Path]) -> None:
    flag = find_credentials(sources["flag"], env={}, home=sources["home"])
    assert flag.source == f"{sources['flag']} (context test)"
    assert flag.where == f"http://flag:1 (credentials from {sources['flag']} (context test))"
    pod = find_credentials(None, env=IN_POD, home=sources["home"].parent / "nobody", account_dir=sources["account"])
    assert pod.source == f"the service account in {sources['account']}"
    assert (pod.token, pod.ca_pem, pod.token_file) == ("sa-token", "SA CA", sources["account"] / "token")


def test_kubeconfig_list_is_merged_as_kubectl_merges_it(tmp_path: Path) -> None:
    # first: the current context and its cluster; second: the same cluster name again (ignored) and the user.
    first = kubeconfig(
        tmp_path / "a" / "first", "https://first:6443", {"token": "first"}, names=("work", "k", "u1"), current="work"
    )
    data = yaml.safe_load(first.read_text())
    data["contexts"][0]["context"]["user"] = "u2"
    data["users"] = []
    first.write_text(yaml.safe_dump(data))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "token").write_text("second-token\n")
    (tmp_path / "b" / "ca.crt").write_text("SECOND CA")
    second = kubeconfig(
        tmp_path / "b" / "second",
        "https://second:6443",
        {"tokenFile": "token"},
        {"certificate-authority": "ca.crt"},
        names=("other", "k", "u2"),
        current="other",
    )
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "absent"), str(first), str(second)])}
    found = find_credentials(None, env=env, home=tmp_path / "nobody")
    assert found.server == "https://first:6443"  # cluster "k" of the first file, current-context of the first
    assert found.token == "second-token"  # user u2 from the second file, its token file beside it
    assert found.token_file == tmp_path / "b" / "token"
    assert found.source == f"{first} (context work)"
    assert find_credentials(None, "other", env=env, home=tmp_path / "nobody").server == "https://first:6443"


def test_a_kubeconfig_list_of_which_no_file_exists(tmp_path: Path) -> None:
    env = {"KUBECONFIG": f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}", **IN_POD}
    with pytest.raises(CredentialsError, match="none of the files in \\$KUBECONFIG exist") as info:
        find_credentials(None, env=env, home=tmp_path)
    assert str(tmp_path / "a") in str(info.value)


def test_a_missing_kubeconfig_flag_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="No such file") as info:
        find_credentials(tmp_path / "missing", env=IN_POD)
    assert str(tmp_path / "missing") in str(info.value)


def test_context_without_kubeconfig_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="--context prod names a kubeconfig context"):
        find_credentials(None, "prod", env=IN_POD, home=tmp_path)


def test_files_named_in_a_kubeconfig_are_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA PEM")
    (tmp_path / "token").write_text("from-file\n")
    path = kubeconfig(
        tmp_path / "config", "https://api.example:6443/", {"tokenFile": "token"}, {"certificate-authority": "ca.crt"}
    )
    found = load_kubeconfig(path)
    assert (found.server, found.token, found.ca_pem) == ("https://api.example:6443", "from-file", "CA PEM")


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("user", "cluster", "message"),
    [
        ({"exec": {"command": "aws"}}, {}, "exec or auth-provider plugin"),
        ({"auth-provider": {"name": "gcp"}}, {}, "exec or auth-provider plugin"),
        ({"client-certificate-data": b64("x")}, {}, "without its key"),
        ({"client-key-data": "!!notbase64"}, {}, "not base64"),
        ({"tokenFile": "missing"}, {}, "cannot read token file"),
        ({"client-certificate": "missing.crt", "client-key-data": b64("k")}, {}, "cannot read client certificate"),
        ({"token": "t"}, {"certificate-authority": "missing-ca.crt"}, "cannot read certificate authority"),
        ({"token": "t"}, {"server": "api.example:6443"}, "has no http(s) server URL"),
    ],
)
def test_bad_kubeconfigs_name_the_file(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any], message: str) -> None:
    path = kubeconfig(tmp_path / "config", "https://api.example:6443", user, cluster)
    with pytest.raises(CredentialsError) as info:
        load_kubeconfig(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "is not a mapping"),
        ("clusters: {}\n", "clusters in kubeconfig"),
        ("current-context: x\ncontexts: [{name: x}]\n", "needs a name and a 'context' mapping"),
        ("key: [unclosed\n", "not valid YAML"),
        ("", "has no current-context"),
    ],
)
def test_malformed_kubeconfigs_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(CredentialsError) as info:
        load_kubeconfig(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_context_choice(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", current=None)
    with pytest.raises(CredentialsError, match="no current-context; name one with --context"):
        load_kubeconfig(path)
    with pytest.raises(CredentialsError, match="context 'other' not found"):
        load_kubeconfig(path, "other")
    assert load_kubeconfig(path, "test").token == "t"
    data = yaml.safe_load(path.read_text())
    data["contexts"][0]["context"]["cluster"] = "gone"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(CredentialsError, match="cluster 'gone' of context 'test' not found"):
        load_kubeconfig(path, "test")


def test_in_cluster_ipv6_and_missing_token(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA")
    with pytest.raises(CredentialsError, match="cannot read token") as info:
        in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1"}, tmp_path)
    assert str(tmp_path / "token") in str(info.value)
    (tmp_path / "token").write_text("t")
    found = in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, tmp_path)
    assert found.server == "https://[fd00::1]:6443"


def test_finding_credentials_loads_no_http_client() -> None:
    code = (
        "import sys; from cdiplug.kube.credentials import find_credentials;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2', 'urllib3')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
