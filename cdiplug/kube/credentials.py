"""Where the Kubernetes API server is and how to authenticate to it, found in kubectl's order.

:func:`find_credentials` looks, first found wins:

1. ``--kubeconfig FILE`` (the file must exist);
2. ``$KUBECONFIG``, a list of files (``:``-separated) merged as kubectl merges them: a cluster,
   context or user is taken from the first file that names it, ``current-context`` from the first
   file that sets it; files in the list that do not exist are skipped, a list of which none
   exists is an error naming them;
3. ``~/.kube/config`` when it exists;
4. in-cluster: ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the pod's service account (token and CA
   in ``/var/run/secrets/kubernetes.io/serviceaccount``).

Every file is read bounded (``cdiplug.toolkit.files``: a regular file, at most 1 MiB, UTF-8) and parsed
safely (``cdiplug.toolkit.safeload``); files a kubeconfig names (CA, client certificate and key, token
file) are resolved against the folder of the kubeconfig that names them and read the same way,
so the HTTP client only gets their contents. exec and auth-provider plugins are refused: a
daemon does not run commands a file names. Each error is a :class:`CredentialsError` naming the
file, and :attr:`Credentials.source` says where the credentials came from, for every later
error message. Nothing here imports lightkube (``cdiplug.kube.client`` does).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen

from cdiplug.errors import InputError, KubernetesError
from cdiplug.toolkit.files import CONFIG_LIMIT, read_text

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Keys of a kubeconfig entry that name a file, per section (each has a ``<key>-data`` sibling but tokenFile).
_FILE_KEYS = {"cluster": ("certificate-authority",), "user": ("client-certificate", "client-key", "tokenFile")}
ORDER = "--kubeconfig, $KUBECONFIG, ~/.kube/config, then the in-cluster service account"


class CredentialsError(KubernetesError):
    """No usable credentials: a kubeconfig that cannot be read or lacks what is needed; names the file."""


@frozen
class Credentials:
    """The API server's URL and how to authenticate; ``source`` says where they came from."""

    server: str
    source: str
    token: str | None = field(default=None, repr=False)
    # Read again by the client when the server answers 401 (the kubelet rotates service-account tokens).
    token_file: Path | None = None
    ca_pem: str | None = field(default=None, repr=False)
    client_cert_pem: str | None = field(default=None, repr=False)
    client_key_pem: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    insecure: bool = False

    @property
    def where(self) -> str:
        """For error messages: ``https://host:6443 (credentials from FILE (context NAME))``."""
        return f"{self.server} (credentials from {self.source})"


def _read(path: Path, what: str, source: str) -> str:
    try:
        return read_text(path, CONFIG_LIMIT, what) or ""
    except InputError as exc:
        raise CredentialsError(f"{exc.message}: {path} (named in {source})") from exc


def _entries(data: Mapping[str, Any], section: str, source: str) -> list[tuple[str, Mapping[str, Any]]]:
    """``clusters`` -> [(name, the cluster mapping)], with relative file paths made absolute."""
    items = data.get(section + "s")
    if items is None:
        return []
    if not isinstance(items, list):
        raise CredentialsError(f"{section}s in kubeconfig {source} is not a list")
    out: list[tuple[str, Mapping[str, Any]]] = []
    for index, item in enumerate(items):
        value = item.get(section) if isinstance(item, Mapping) else None
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not isinstance(value, Mapping):
            raise CredentialsError(f"{section}s[{index}] in kubeconfig {source} needs a name and a {section!r} mapping")
        value = dict(value)
        for key in _FILE_KEYS.get(section, ()):
            if isinstance(value.get(key), str) and value[key]:
                value[key] = Path(source).parent / Path(value[key]).expanduser()
        out.append((item["name"], value))
    return out


def _load_file(path: Path) -> Mapping[str, Any]:
    from cdiplug.toolkit.safeload import load_yaml  # YAML only where a kubeconfig is read

    source = str(path)
    try:
        data = load_yaml(read_text(path, CONFIG_LIMIT, "kubeconfig") or "", source)
    except InputError as exc:
        raise CredentialsError(str(exc)) from exc
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise CredentialsError(f"kubeconfig {source} is not a mapping")
    return data


def _pem(entry: Mapping[str, Any], key: str, what: str, source: str) -> str | None:
    """``<key>-data`` (base64 of a PEM file) or ``<key>`` (a file)."""
    data = entry.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True).decode()
        except (ValueError, UnicodeDecodeError) as exc:
            raise CredentialsError(f"{key}-data in {source} is not base64 of a PEM file") from exc
    path = entry.get(key)
    return _read(path, what, source) if isinstance(path, Path) else None


def load_kubeconfig(paths: Path | str | Sequence[Path | str], context: str | None = None) -> Credentials:
    """The API server of ``context`` (default: the current context) in the kubeconfig file(s) at ``paths``.

    Several files are merged as kubectl merges ``$KUBECONFIG`` (the first to name a thing wins).
    """
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    found: dict[str, dict[str, tuple[Mapping[str, Any], str]]] = {"cluster": {}, "context": {}, "user": {}}
    current: str | None = None
    for path in files:
        data = _load_file(path)
        for section, named in found.items():
            for name, value in _entries(data, section, str(path)):
                named.setdefault(name, (value, str(path)))
        if current is None and data.get("current-context"):
            current = str(data["current-context"])
    sources = ", ".join(map(str, files))
    context = context or current
    if not context:
        raise CredentialsError(f"kubeconfig {sources} has no current-context; name one with --context")
    if context not in found["context"]:
        raise CredentialsError(f"context {context!r} not found in kubeconfig {sources}")
    ctx, ctx_source = found["context"][context]
    source = f"{ctx_source} (context {context})"
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in found["cluster"]:
        raise CredentialsError(f"cluster {cluster_name!r} of context {context!r} not found in kubeconfig {sources}")
    cluster, cluster_source = found["cluster"][str(cluster_name)]
    user: Mapping[str, Any] = {}
    user_source = ctx_source
    if user_name:
        if user_name not in found["user"]:
            raise CredentialsError(f"user {user_name!r} of context {context!r} not found in kubeconfig {sources}")
        user, user_source = found["user"][str(user_name)]
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise CredentialsError(f"cluster {cluster_name!r} in {cluster_source} has no http(s) server URL")
    if "exec" in user or "auth-provider" in user:
        raise CredentialsError(
            f"user {user_name!r} in {user_source} uses an exec or auth-provider plugin, which cdiplug "
            "does not run; use a kubeconfig with a token or a client certificate"
        )
    token, token_file = user.get("token"), user.get("tokenFile")
    if isinstance(token_file, Path):  # as client-go: the file wins over an inline token, and is read again
        token = _read(token_file, "token file", user_source).strip()
    cert = _pem(user, "client-certificate", "client certificate", user_source)
    key = _pem(user, "client-key", "client key", user_source)
    if bool(cert) != bool(key):
        raise CredentialsError(
            f"user {user_name!r} in {user_source} has a client certificate without its key, or a key without its certificate"
        )
    basic = (str(user["username"]), str(user.get("password", ""))) if user.get("username") else None
    return Credentials(
        server=server.rstrip("/"),
        source=source,
        token=str(token) if token else None,
        token_file=token_file if isinstance(token_file, Path) else None,
        ca_pem=_pem(cluster, "certificate-authority", "certificate authority", cluster_source),
        client_cert_pem=cert,
        client_key_pem=key,
        basic_auth=basic,
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
    )


def in_cluster(env: Mapping[str, str], account_dir: Path = SERVICE_ACCOUNT_DIR) -> Credentials:
    """The API server as a pod sees it: ``KUBERNETES_SERVICE_HOST/PORT`` and the service account."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise CredentialsError("KUBERNETES_SERVICE_HOST is not set: not running in a pod")
    source = f"the service account in {account_dir}"
    host = f"[{host}]" if ":" in host else host
    return Credentials(
        server=f"https://{host}:{port}",
        source=source,
        token=_read(account_dir / "token", "token", source).strip(),
        token_file=account_dir / "token",
        ca_pem=_read(account_dir / "ca.crt", "CA certificate", source),
    )


def find_credentials(
    kubeconfig: Path | str | None = None,
    context: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> Credentials:
    """Credentials from the first source that exists, in kubectl's order (see the module)."""
    env = os.environ if env is None else env
    if kubeconfig:
        return load_kubeconfig(kubeconfig, context)
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        existing = [p for p in listed if Path(p).exists()]
        if not existing:
            raise CredentialsError(f"none of the files in $KUBECONFIG exist: {env['KUBECONFIG']}")
        return load_kubeconfig(existing, context)
    default = (home if home is not None else Path.home()) / ".kube" / "config"
    if default.exists():
        return load_kubeconfig(default, context)
    if context:
        raise CredentialsError(f"--context {context} names a kubeconfig context, but there is no kubeconfig ({ORDER})")
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(env, account_dir)
    raise CredentialsError(
        f"no Kubernetes credentials: pass --kubeconfig, set $KUBECONFIG, create {default} or run in a pod (looked in: {ORDER})"
    )
