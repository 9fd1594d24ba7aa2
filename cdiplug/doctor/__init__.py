"""``cdiplug doctor``: whether this node has what cdiplug needs, and how to fix what it lacks.

Everything is passed in (the :class:`~cdiplug.models.world.World`'s folders, the runtime's
configuration files, ``/proc``), so tests run it on fake trees. Checked, in order:

- the configuration file (as ``serve`` would read it);
- the kubelet's folders: the device-plugin folder and its ``kubelet.sock``, the plugin
  registration and plugins folders (DRA), the PodResources socket;
- the container runtime's CDI settings (:mod:`cdiplug.doctor.runtime`) and the CDI folder;
- each configured backend's own needs, through its optional
  :class:`~cdiplug.models.checks.NodeChecker` ability (the IOMMU and vfio-pci for PCI, the
  driver and NVML for NVIDIA, a resource's options against the node).

A check about something the configuration does not use (the DRA folders with only device-plugin
resources) is a warning rather than a problem.
"""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from cdiplug.backend import BackendPlugin, load_plugins
from cdiplug.config import Config, load_config
from cdiplug.doctor import runtime
from cdiplug.errors import CdiplugError
from cdiplug.host import group_by_backend
from cdiplug.models.checks import Finding, NodeChecker, Verdict, ok, problem, warning
from cdiplug.models.resource import Api
from cdiplug.models.world import World

KUBELET_FIX = (
    "the kubelet makes it at start: start the kubelet, or name its folders with the --kubelet-dir, "
    "--plugins-registry-dir, --plugins-dir and --pod-resources-socket flags (in a pod: mount the host's /var/lib/kubelet)"
)


@frozen
class RuntimeFiles:
    """Where the runtimes' configuration is. ``containerd`` None: the ``--config`` of a containerd
    running here (found in ``proc_root``), else ``containerd_default`` when it is there;
    ``crio`` None: ``crio_default`` when it or ``crio_dir`` is there."""

    containerd: Path | None = None
    crio: Path | None = None
    crio_dir: Path = Path("/etc/crio/crio.conf.d")
    proc_root: Path = Path("/proc")
    containerd_default: Path = Path("/etc/containerd/config.toml")
    crio_default: Path = Path("/etc/crio/crio.conf")


def _kind_of(path: Path) -> str | None:
    """``folder``, ``socket``, ``file``, or None when nothing is there."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return "folder" if stat.S_ISDIR(mode) else "socket" if stat.S_ISSOCK(mode) else "file"


def kubelet_findings(world: World, config: Config | None) -> list[Finding]:
    """The kubelet's folders and sockets, as cdiplug is told where they are."""
    apis = {r.api for r in config.resources} if config is not None else {Api.DEVICE_PLUGIN}
    wanted = {
        ("device-plugin folder", world.kubelet_dir, "folder", Api.DEVICE_PLUGIN in apis),
        ("kubelet registration socket", world.kubelet_socket, "socket", Api.DEVICE_PLUGIN in apis),
        ("plugin registration folder", world.plugins_registry_dir, "folder", Api.DRA in apis),
        ("DRA plugins folder", world.plugins_dir, "folder", Api.DRA in apis),
        ("PodResources socket", world.pod_resources_socket, "socket", Api.DEVICE_PLUGIN in apis),
    }
    findings = []
    for subject, path, kind, needed in sorted(wanted, key=lambda w: str(w[1])):
        found = _kind_of(path)
        if found == kind:
            findings.append(ok(subject, f"{path} is there"))
            continue
        detail = f"{path} is a {found}, not a {kind}" if found else f"no {kind} at {path}"
        if not needed:
            detail += " (not needed by this configuration)"
        findings.append((problem if needed else warning)(subject, detail, KUBELET_FIX))
    return findings


def cdi_folder_findings(world: World) -> list[Finding]:
    kind = _kind_of(world.cdi_dir)
    if kind == "folder":
        return [ok("CDI folder", f"{world.cdi_dir} is there")]
    if kind is not None:
        return [problem("CDI folder", f"{world.cdi_dir} is a {kind}, not a folder", "remove it, or pass --cdi-dir")]
    return [warning("CDI folder", f"no folder at {world.cdi_dir} yet", "cdiplug serve makes it; or pass --cdi-dir")]


def runtime_findings(world: World, files: RuntimeFiles) -> list[Finding]:
    """The CDI settings of every runtime whose configuration is found."""
    findings: list[Finding] = []
    containerd = files.containerd or runtime.running_containerd_config(files.proc_root)
    if containerd is None and files.containerd_default.exists():
        containerd = files.containerd_default
    if containerd is not None:
        findings.extend(runtime.containerd_findings(containerd, world.cdi_dir))
    crio = files.crio
    if crio is None and (files.crio_default.exists() or files.crio_dir.is_dir()):
        crio = files.crio_default
    if crio is not None:
        findings.extend(runtime.crio_findings(crio, files.crio_dir, world.cdi_dir))
    if not findings:
        findings.append(
            warning(
                "container runtime",
                f"found no containerd or CRI-O configuration (no running containerd, no {files.containerd_default}, "
                f"no {files.crio_default})",
                "pass --containerd-config or --crio-config",
            )
        )
    return findings


async def backend_findings(
    config: Config, world: World, plugins: Mapping[str, BackendPlugin[Any]] | None = None
) -> list[Finding]:
    """Each configured backend's own checks (created, never run); a backend that cannot even be
    created is a problem."""
    plugins = load_plugins() if plugins is None else plugins
    findings: list[Finding] = []
    for name, resources in group_by_backend(config.resources).items():
        subject = f"backend {name}"
        try:
            backend = plugins[name].create(resources, world)
        except (CdiplugError, OSError) as exc:
            findings.append(problem(subject, f"cannot start: {exc}", "see the message; cdiplug serve would fail the same way"))
            continue
        if not isinstance(backend, NodeChecker):
            findings.append(ok(subject, "has no checks of its own"))
            continue
        try:
            findings.extend(await backend.node_checks())
        except (CdiplugError, OSError) as exc:
            findings.append(problem(subject, f"its checks failed: {exc}"))
    return findings


async def examine(
    world: World,
    config_path: str | None,
    files: RuntimeFiles,
    configuration: str | None = None,
    plugins: Mapping[str, BackendPlugin[Any]] | None = None,
) -> list[Finding]:
    """Every finding about this node, in the order of the module docstring."""
    findings: list[Finding] = []
    config: Config | None = None
    try:
        config = await asyncio.to_thread(load_config, config_path, plugins, configuration)
        findings.append(ok("configuration", f"{config.source}: {len(config.resources)} resources"))
    except CdiplugError as exc:
        findings.append(problem("configuration", str(exc), "fix the file (cdiplug serve refuses it and exits 2)"))
    findings.extend(await asyncio.to_thread(kubelet_findings, world, config))
    findings.extend(await asyncio.to_thread(runtime_findings, world, files))
    findings.extend(await asyncio.to_thread(cdi_folder_findings, world))
    if config is not None:
        findings.extend(await backend_findings(config, world, plugins))
    return findings


def worst(findings: Sequence[Finding]) -> Verdict:
    verdicts = {f.verdict for f in findings}
    return next((v for v in (Verdict.PROBLEM, Verdict.WARNING) if v in verdicts), Verdict.OK)
