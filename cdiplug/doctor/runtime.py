"""Whether the container runtime reads the CDI specs cdiplug writes: containerd's and CRI-O's configuration.

- containerd: ``config.toml`` (and the files its ``imports`` name). Version 2 keeps the CRI
  settings under ``[plugins."io.containerd.grpc.v1.cri"]``, version 3 (containerd 2.x) under
  ``[plugins."io.containerd.cri.v1.runtime"]``: ``enable_cdi`` (containerd 1.7 defaults to off,
  2.x to on) and ``cdi_spec_dirs`` (default ``/etc/cdi`` and ``/var/run/cdi``).
- CRI-O: ``crio.conf`` then every ``crio.conf.d/*.conf`` in name order (a later file wins),
  ``[crio.runtime] cdi_spec_dirs`` (same default); CRI-O has read CDI specs since 1.23 without a
  switch.

Each check says where the setting is, and how to put it right.
"""

from __future__ import annotations

import glob
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cdiplug.models.checks import Finding, ok, problem, warning

DEFAULT_CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_V3 = "io.containerd.cri.v1.runtime"
CONTAINERD = "containerd CDI"
CRIO = "CRI-O CDI"


def _read_toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, tables merged key by key (as containerd's imports and CRI-O's drop-ins)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _same_folder(a: str, b: str) -> bool:
    """``/var/run/cdi`` and ``/run/cdi`` are one folder on every distribution that links them."""
    norm = [p.rstrip("/").removeprefix("/var") if p.startswith("/var/run") else p.rstrip("/") for p in (a, b)]
    return norm[0] == norm[1]


def _spec_dirs_finding(subject: str, dirs: Sequence[str], cdi_dir: Path, where: str, key: str) -> Finding:
    if any(_same_folder(d, str(cdi_dir)) for d in dirs):
        return ok(subject, f"reads CDI specs from {', '.join(dirs)} ({where}), cdiplug writes into {cdi_dir}")
    return problem(
        subject,
        f"reads CDI specs from {', '.join(dirs) or 'no folder'} ({where}), but cdiplug writes them into {cdi_dir}",
        f"add {str(cdi_dir)!r} to {key} in {where}, or run cdiplug with --cdi-dir set to one of those folders",
    )


def containerd_findings(path: Path, cdi_dir: Path) -> Iterator[Finding]:
    """The CDI settings of containerd's configuration file ``path``."""
    try:
        data = _read_toml(path)
    except FileNotFoundError:
        yield warning(
            CONTAINERD, f"no containerd configuration at {path}", "pass --containerd-config FILE if containerd runs here"
        )
        return
    except (OSError, tomllib.TOMLDecodeError) as exc:
        yield problem(CONTAINERD, f"cannot read {path}: {exc}", "fix the file; containerd refuses it too")
        return
    sources = [str(path)]
    for pattern in data.get("imports", []) if isinstance(data.get("imports"), list) else []:
        for name in sorted(glob.glob(str(pattern) if str(pattern).startswith("/") else str(path.parent / str(pattern)))):
            try:
                data = _merge(data, _read_toml(Path(name)))
                sources.append(name)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                yield problem(CONTAINERD, f"cannot read {name} (imported by {path}): {exc}", "fix the file")
    version = data.get("version", 1)
    section_name = CRI_V3 if version == 3 else CRI_V2
    plugins = data.get("plugins", {})
    section = plugins.get(section_name, {}) if isinstance(plugins, Mapping) else {}
    where = " and ".join(sources)
    table = f'[plugins."{section_name}"]'
    enabled = section.get("enable_cdi") if isinstance(section, Mapping) else None
    if enabled is False:
        yield problem(
            CONTAINERD,
            f"CDI is turned off: enable_cdi = false in {table} of {where}; pods get no CDI devices "
            "(the kubelet's CDI names are ignored, DRA claims fail to start)",
            f"set enable_cdi = true in {table} of {path} and restart containerd",
        )
    elif enabled is None and version != 3:
        yield warning(
            CONTAINERD,
            f"enable_cdi is not set in {table} of {where} (version {version}): containerd 1.7 leaves CDI off, 2.x turns it on",
            f"set enable_cdi = true in {table} of {path} and restart containerd",
        )
    else:
        yield ok(CONTAINERD, f"CDI is on ({'enable_cdi = true' if enabled else 'the default of version 3'} in {where})")
    dirs = section.get("cdi_spec_dirs", list(DEFAULT_CDI_SPEC_DIRS)) if isinstance(section, Mapping) else DEFAULT_CDI_SPEC_DIRS
    yield _spec_dirs_finding(CONTAINERD, [str(d) for d in dirs], cdi_dir, where, f"cdi_spec_dirs in {table}")


def crio_findings(path: Path, drop_in_dir: Path, cdi_dir: Path) -> Iterator[Finding]:
    """The CDI settings of CRI-O's ``crio.conf`` and its drop-in folder."""
    data: dict[str, Any] = {}
    sources = []
    files = [path, *sorted(drop_in_dir.glob("*.conf"))] if drop_in_dir.is_dir() else [path]
    for name in files:
        try:
            data = _merge(data, _read_toml(name))
            sources.append(str(name))
        except FileNotFoundError:
            continue
        except (OSError, tomllib.TOMLDecodeError) as exc:
            yield problem(CRIO, f"cannot read {name}: {exc}", "fix the file; CRI-O refuses it too")
    if not sources:
        yield warning(CRIO, f"no CRI-O configuration at {path} or in {drop_in_dir}", "pass --crio-config FILE if CRI-O runs here")
        return
    runtime = data.get("crio", {}).get("runtime", {}) if isinstance(data.get("crio"), Mapping) else {}
    dirs = runtime.get("cdi_spec_dirs", list(DEFAULT_CDI_SPEC_DIRS)) if isinstance(runtime, Mapping) else DEFAULT_CDI_SPEC_DIRS
    if runtime.get("enable_cdi") is False if isinstance(runtime, Mapping) else False:
        yield problem(CRIO, f"CDI is turned off: enable_cdi = false in [crio.runtime] of {', '.join(sources)}", "remove it")
    yield _spec_dirs_finding(CRIO, [str(d) for d in dirs], cdi_dir, " and ".join(sources), "cdi_spec_dirs in [crio.runtime]")


def running_containerd_config(proc_root: Path) -> Path | None:
    """The ``--config`` of a containerd process running on this node, if one is found in ``proc_root``."""
    try:
        entries = [e for e in proc_root.iterdir() if e.name.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or Path(argv[0].decode(errors="replace")).name != "containerd":
            continue
        words = [w.decode(errors="replace") for w in argv[1:] if w]
        for i, word in enumerate(words):
            if word in ("--config", "-c") and i + 1 < len(words):
                return Path(words[i + 1])
            if word.startswith("--config="):
                return Path(word.partition("=")[2])
        return None
    return None
