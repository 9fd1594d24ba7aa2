"""``cdiplug demo``: the classic device plugin experiment, no cluster needed.

Runs the daemon in this process with the built-in default (two fake FPGAs, plus a health file so a
device can be turned Unhealthy) against the kubelet stand-in of ``cdiplug.testing``, everything in
a temporary folder, and prints what a cluster would show: the node advertises
``example.com/fpga: 2``; two pods get one device each; a third asking for 3 stays Pending with
``Insufficient example.com/fpga``; an Unhealthy device drops allocatable to 1 and back; the CDI spec
written. Exit status 0 when every step went as expected, 1 with the step that did not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cdiplug.cli import add_log_level, describe
from cdiplug.config import DEFAULT_CONFIG_YAML, Config, parse_config
from cdiplug.errors import CdiplugError
from cdiplug.models.world import World

STEP_TIMEOUT = 5.0  # seconds any one step may take; the whole demo takes well under one


class DemoFailed(CdiplugError):
    """A step of the demo did not go as the kubelet would have it."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the classic experiment against a kubelet stand-in (no cluster needed)",
        description=describe(__doc__, 1),
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and say where it is")
    parser.add_argument("--verbose", action="store_true", help="show the daemon's log (as --log-level info)")
    add_log_level(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.verbose:
        logging.getLogger().setLevel(min(logging.getLogger().level, logging.INFO))
    folder = Path(tempfile.mkdtemp(prefix="cdiplug-demo-"))
    try:
        asyncio.run(demo(folder, print))
    except (DemoFailed, CdiplugError, TimeoutError) as exc:
        print(f"cdiplug demo: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"(kept {folder})")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def demo_config(health_file: Path) -> Config:
    """The built-in default, with a health file for each fake resource."""
    data = yaml.safe_load(DEFAULT_CONFIG_YAML)
    for resource in data["resources"]:
        if resource.get("backend") == "fake":
            resource.setdefault("options", {})["health_file"] = str(health_file)
    return parse_config(data, source="<built-in default>")


def demo_world(folder: Path) -> World:
    paths = {name: folder / name for name in ("kubelet", "cdi", "state", "sys", "dev")}
    for path in paths.values():
        path.mkdir(mode=0o750)
    return World(
        kubelet_dir=paths["kubelet"],
        cdi_dir=paths["cdi"],
        state_dir=paths["state"],
        sysfs_root=paths["sys"],
        dev_root=paths["dev"],
        pod_resources_socket=folder / "pod-resources.sock",
    )


async def demo(folder: Path, say: Callable[[str], Any]) -> None:
    """Run the experiment in ``folder``, reporting each step through ``say``; raises DemoFailed."""
    from cdiplug.testing.daemon import running_daemon
    from cdiplug.testing.kubelet import KubeletStandIn
    from cdiplug.testing.kubelet_records import PodPhase

    health = folder / "health.yaml"
    config = demo_config(health)
    world = demo_world(folder)
    resource = config.resources[0].name
    say(f"cdiplug demo: the daemon (built-in default) and a kubelet stand-in in {folder}")
    async with KubeletStandIn(world.kubelet_dir) as kubelet, running_daemon(config, world, timeout=STEP_TIMEOUT):
        await kubelet.wait_registered(resource, STEP_TIMEOUT)
        capacity, allocatable = kubelet.capacity(resource), kubelet.allocatable(resource)
        check(capacity == allocatable == 2, f"expected {resource}: 2, got capacity {capacity}, allocatable {allocatable}")
        say(f"1. node advertises {resource}: {allocatable}")

        pods = [await kubelet.admit_pod(name, {resource: 1}) for name in ("pod-a", "pod-b")]
        for pod in pods:
            check(pod.admitted, f"{pod.name} was not admitted: {pod.reason} {pod.message}")
            env = " ".join(f"{k}={v}" for k, v in sorted(pod.env.items()))
            say(f"2. {pod.name} got {', '.join(pod.device_ids(resource))}   env: {env}")
        ids = [i for pod in pods for i in pod.device_ids(resource)]
        check(len(set(ids)) == 2, f"the two pods did not get distinct devices: {ids}")

        third = await kubelet.admit_pod("pod-c", {resource: 3})
        check(third.phase is PodPhase.PENDING, f"pod-c asking for 3 should stay Pending, it is {third.phase.value}")
        say(f"3. pod-c asks for 3: {third.phase.value} ({third.reason})")

        device = ids[-1]
        health.write_text(f"{device}: Unhealthy\n")
        await kubelet.wait_until(lambda: kubelet.allocatable(resource) == 1, STEP_TIMEOUT, f"{device} to turn Unhealthy")
        health.write_text(f"{device}: Healthy\n")
        await kubelet.wait_until(lambda: kubelet.allocatable(resource) == 2, STEP_TIMEOUT, f"{device} to be Healthy again")
        say(f"4. {device} Unhealthy: allocatable {resource}: 1; Healthy again: 2")

        say(f"5. {cdi_summary(world.cdi_dir, config.resources[0].cdi_kind, pods)}")
    say("OK: the classic experiment behaved as on a real node")


def cdi_summary(cdi_dir: Path, kind: str, pods: list[Any]) -> str:
    """Where the CDI spec is and what it holds, once the CDI writer exists."""
    try:
        from cdiplug.cdi.writer import SpecWriter
    except ImportError:
        return "CDI spec: not written (this build has no CDI writer)"
    path = SpecWriter(cdi_dir).path_for(kind)
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        raise DemoFailed(f"no CDI spec at {path} after two Allocates") from None
    except ValueError as exc:
        raise DemoFailed(f"the CDI spec {path} is not JSON: {exc}") from exc
    names = [f"{spec.get('kind')}={d.get('name')}" for d in spec.get("devices", [])]
    used = sorted(n for pod in pods for n in pod.cdi_devices)
    return f"CDI spec {path.name} (cdiVersion {spec.get('cdiVersion')}): {', '.join(names)}; pods use {', '.join(used)}"


def check(ok: bool, message: str) -> None:
    if not ok:
        raise DemoFailed(message)
