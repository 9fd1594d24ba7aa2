"""``cdiplug cleanup [--instance NAME]``: leave the node clean of one instance's files, at uninstall.

Run it once the instance's daemon is stopping (a Helm ``post-delete`` hook, or by hand after
removing the DaemonSet): it waits up to ``--wait`` seconds until no process of the instance holds
its resource claims (the daemon has stopped), then, touching only what the instance owns
(:mod:`cdiplug.models.instance`):

1. each backend undoes what it left on the node (PCI: functions bound to vfio-pci go back to the
   driver they had, from the journal in the instance's state folder);
2. the instance's CDI specs (resource and claim specs, temporary files) are removed;
3. the sockets of the resources and DRA drivers it served (the claims in ``<state-dir>/owners``
   name them), when nobody answers on them, and its DRA drivers' folders below ``--plugins-dir``;
4. its state folder (the default instance: its files at the top of ``--state-dir``, nothing
   else there), then its claims.

With ``--api`` (credentials as kubectl finds them, or ``--kubeconfig``) it also deletes this
node's ResourceSlices of the DRA drivers the instance served and removes the node labels of its
resources (``cdiplug.dev/<vendor>.<class>.*``); without, ``kubectl delete resourceslices
--field-selector spec.driver=<driver>,spec.nodeName=<node>`` does the first.

Exit status: 0 done (each thing removed is printed), 1 the instance still runs after ``--wait``
or something could not be removed (named on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import stat
import sys
import time
from pathlib import Path

from cdiplug.cli import add_dra_options, add_log_level, add_option, add_world_options, world_from_args
from cdiplug.errors import CdiplugError, ConfigError
from cdiplug.models.instance import DRA_DRIVER, RESOURCE, owners_dir
from cdiplug.models.names import socket_name
from cdiplug.models.world import World

DEFAULT_WAIT = 120.0
# What the default instance keeps at the top of --state-dir (beside other instances' folders and
# the claims): the PCI journal, the DRA rolling-update locks, the DRA checkpoint with its lock,
# temporary files and copies set aside.
DEFAULT_STATE = ("pci", "dra-instances")
DEFAULT_STATE_PREFIXES = ("dra-claims.json", ".dra-claims.json")
POLL = 0.2
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cleanup",
        help="remove one instance's CDI specs, sockets and state from this node (uninstall)",
        description="Remove one instance's CDI specs, sockets and state from this node, once its daemon has stopped "
        "(uninstall; a Helm post-delete hook). Touches no other instance's files.",
    )
    add_world_options(parser)
    add_dra_options(parser)
    add_option(parser, "--wait", str(DEFAULT_WAIT), help="seconds to wait for the instance's daemon to stop")
    parser.add_argument(
        "--api",
        action="store_true",
        help="also delete this node's ResourceSlices of the instance's DRA drivers and its resources' node labels",
    )
    add_log_level(parser)
    parser.set_defaults(func=run)


class Cleanup:
    """What ``cdiplug cleanup`` does, against one world (blocking file work in threads)."""

    def __init__(self, world: World, out: list[str], problems: list[str]) -> None:
        self.world = world
        self.names = world.names
        self.out = out
        self.problems = problems

    def claims(self) -> list[tuple[Path, str, str]]:
        """This instance's claim files: (path, kind, name)."""
        from cdiplug.host.owners import read_owner

        found = []
        try:
            entries = sorted(owners_dir(self.world.state_dir).glob("*.lock"))
        except OSError:
            return []
        for path in entries:
            owner = read_owner(path)
            if owner.get("instance") != self.world.instance:
                continue
            for kind in (RESOURCE, DRA_DRIVER):
                if isinstance(name := owner.get(kind), str):
                    found.append((path, kind, name))
        return found

    async def wait_stopped(self, wait: float) -> bool:
        from cdiplug.host.owners import describe, read_owner
        from cdiplug.toolkit.filelock import is_held

        deadline = time.monotonic() + wait
        while True:
            held = [p for p, _, _ in self.claims() if is_held(p)]
            if not held:
                return True
            if time.monotonic() >= deadline:
                owner = describe(read_owner(held[0]))
                self.problems.append(f"{owner} still runs (it holds {held[0]}); stop its daemon first")
                return False
            await asyncio.sleep(POLL)  # another process's lock: nothing to wait on but time

    async def backends(self) -> None:
        from cdiplug.backend import load_plugins

        plugins = load_plugins()
        for name in plugins:
            try:
                clean_up = plugins[name].clean_up
                if clean_up is not None:
                    self.out += [f"{name}: {line}" for line in await clean_up(self.world)]
            except CdiplugError as exc:
                self.problems.append(f"backend {name}: {exc}")

    def specs(self) -> None:
        from cdiplug.cdi.sweep import sweep

        try:
            removed = sweep(self.world.cdi_dir, lambda n: self.names.owns_spec(n) or self.names.is_leftover(n))
        except CdiplugError as exc:
            self.problems.append(str(exc))
            return
        self.out += [f"removed CDI spec {p}" for p in removed]

    def sockets(self, claims: list[tuple[Path, str, str]]) -> None:
        w = self.world
        for _, kind, name in claims:
            if kind == RESOURCE:
                self._socket(w.kubelet_dir / socket_name(name))
                continue
            pattern = re.compile(rf"{re.escape(name)}(-{_UUID})?-reg\.sock")
            try:
                registrations = [w.plugins_registry_dir / n for n in os.listdir(w.plugins_registry_dir) if pattern.fullmatch(n)]
            except OSError:
                registrations = []
            for path in registrations:
                self._socket(path)
            folder = w.plugins_dir / name
            if folder.is_dir() and not folder.is_symlink():
                live = [p for p in folder.glob("dra*.sock") if _live(p)]
                if live:
                    self.problems.append(f"{live[0]} is served by a process: {folder} left as it is")
                else:
                    self._remove(folder)

    def _socket(self, path: Path) -> None:
        try:
            st = path.lstat()
        except OSError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            self.problems.append(f"{path} is no socket: left as it is")
        elif _live(path):
            self.problems.append(f"a process serves on {path}: left as it is")
        else:
            self._remove(path)

    def state(self) -> None:
        own = self.world.own_state_dir
        if self.world.instance:
            self._remove(own)
            return
        try:
            entries = sorted(os.listdir(own))
        except OSError:
            return
        for name in entries:  # only what the default instance writes: the folder may hold anything else
            if name in DEFAULT_STATE or any(name.startswith(p) for p in DEFAULT_STATE_PREFIXES):
                self._remove(own / name)

    def release_claims(self, claims: list[tuple[Path, str, str]]) -> None:
        from cdiplug.host.owners import GUARD, GUARD_WAIT
        from cdiplug.toolkit.filelock import is_held, locked

        if not claims:
            return
        try:
            with locked(owners_dir(self.world.state_dir) / GUARD, "the resource claims of this node", wait=GUARD_WAIT):
                for path in dict.fromkeys(p for p, _, _ in claims):
                    if not is_held(path):
                        self._remove(path)
        except CdiplugError as exc:
            self.problems.append(str(exc))

    def _remove(self, path: Path) -> None:
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.problems.append(f"cannot remove {path}: {exc.strerror or exc}")
            return
        self.out.append(f"removed {path}")

    async def api_objects(self, claims: list[tuple[Path, str, str]]) -> None:
        """This node's slices of the instance's DRA drivers, and its resources' node labels."""
        from cdiplug.kube.client import connect
        from cdiplug.kube.node_labels import PREFIX, owned, resource_part

        node = self.world.node_name
        try:
            client = connect(self.world.kubeconfig)
        except CdiplugError as exc:
            self.problems.append(f"slices and node labels left as they are: {exc}")
            return
        try:
            for _, kind, name in claims:
                if kind == DRA_DRIVER:
                    slices, _ = await client.list_slices(name, node)
                    for item in slices:
                        assert item.metadata is not None and item.metadata.name is not None
                        await client.delete_slice(item.metadata.name)
                        self.out.append(f"deleted ResourceSlice {item.metadata.name} of {name}")
            parts = tuple(f"{PREFIX}{resource_part(n)}." for _, k, n in claims if k == RESOURCE)
            labels = (await client.get_node(node)).metadata.labels or {}  # type: ignore[union-attr]
            gone = sorted(k for k in labels if owned(k) and k.startswith(parts))
            if gone:
                await client.patch_node(node, {"metadata": {"labels": dict.fromkeys(gone)}})
                self.out += [f"removed node label {k}" for k in gone]
        except CdiplugError as exc:
            self.problems.append(str(exc))
        finally:
            await client.close()

    async def run(self, wait: float, api: bool = False) -> None:
        if not await self.wait_stopped(wait):
            return
        claims = self.claims()
        if api:
            await self.api_objects(claims)
        await self.backends()  # before the state goes: the PCI journal says what goes back where
        await asyncio.to_thread(self.specs)
        await asyncio.to_thread(self.sockets, claims)
        await asyncio.to_thread(self.state)
        await asyncio.to_thread(self.release_claims, claims)


def _live(path: Path) -> bool:
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.connect(str(path))
    except TimeoutError:
        return True
    except OSError:
        return False
    finally:
        sock.close()
    return True


def run(args: argparse.Namespace) -> int:
    try:
        wait = float(args.wait)
    except ValueError:
        raise ConfigError(f"--wait (or $CDIPLUG_WAIT) must be a number of seconds, got {args.wait!r}") from None
    world = world_from_args(args)
    out: list[str] = []
    problems: list[str] = []
    asyncio.run(Cleanup(world, out, problems).run(wait, args.api))
    for line in out:
        print(line)
    for problem in problems:
        print(f"cdiplug cleanup: {problem}", file=sys.stderr)
    if not problems:
        print(f"{world.names.label}: nothing of it is left on this node")
    return 1 if problems else 0
