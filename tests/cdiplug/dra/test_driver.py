"""The DRA driver's socket names (cdiplug.dra.driver.socket_paths) and ``--pod-uid``, which shapes them.

Covers: without a pod UID the plain names (``<driver>/dra.sock``, ``<driver>-reg.sock``); with one
(``--pod-uid`` or ``$CDIPLUG_POD_UID``) each carries it, so two pods of a rolling update never
share a socket; a UID that is no DNS label (a '/', '..', upper case, too long) is refused with an
error naming the flag, before any path is built from it; the socket-length check at start sees
the longer names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdiplug.cli import build_parser, world_from_args
from cdiplug.config import check_against, parse_config
from cdiplug.dra.driver import socket_paths
from cdiplug.errors import ConfigError
from cdiplug.models.world import World

UID = "5f1d7c2e-9b1a-4c3d-8e2f-0a1b2c3d4e5f"
DRIVER = "fpga.example.com"


def test_plain_names_without_a_pod_uid() -> None:
    world = World(plugins_dir=Path("/p"), plugins_registry_dir=Path("/r"))
    assert socket_paths(world, DRIVER) == (Path("/p/fpga.example.com/dra.sock"), Path("/r/fpga.example.com-reg.sock"))


def test_a_pod_uid_goes_into_both_socket_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDIPLUG_POD_UID", UID)
    args = build_parser("serve").parse_args(["serve", "--plugins-dir=/p", "--plugins-registry-dir=/r"])
    world = world_from_args(args)
    assert world.pod_uid == UID
    assert socket_paths(world, DRIVER) == (
        Path(f"/p/fpga.example.com/dra-{UID}.sock"),
        Path(f"/r/fpga.example.com-{UID}-reg.sock"),
    )
    flag = build_parser("serve").parse_args(["serve", "--pod-uid", "other-uid"])
    assert world_from_args(flag).pod_uid == "other-uid"  # the flag wins over the environment


@pytest.mark.parametrize("bad", ["../../etc", "a/b", UID.upper(), "-x", "x" * 64, "uid\n", ""])
def test_a_bad_pod_uid_is_refused_naming_the_flag(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDIPLUG_POD_UID", raising=False)
    args = build_parser("serve").parse_args(["serve", f"--pod-uid={bad}"])
    if bad == "":  # empty: not set (as an empty $CDIPLUG_POD_UID from a manifest)
        assert world_from_args(args).pod_uid is None
        return
    with pytest.raises(ConfigError, match=r"--pod-uid \(or \$CDIPLUG_POD_UID\): pod UID .* must be lower-case"):
        world_from_args(args)
    with pytest.raises(ValueError, match="pod UID"):
        World(pod_uid=bad)


def test_socket_length_is_checked_with_the_pod_uid(tmp_path: Path) -> None:
    config = parse_config({"resources": [{"name": "example.com/fpga", "backend": "fake", "api": "dra"}]}, "d.yaml")
    deep = tmp_path / ("r" * max(1, 100 - len(str(tmp_path)) - len(f"/{DRIVER}-reg.sock")))
    plain = World(plugins_registry_dir=deep, plugins_dir=tmp_path)
    assert len(str(socket_paths(plain, DRIVER)[1]).encode()) <= 107
    check_against(config, plain)  # fits without the UID
    with pytest.raises(ConfigError, match=r"socket path .* @ \$.resources\[0\].dra_driver \(in d.yaml\)"):
        check_against(config, World(plugins_registry_dir=deep, plugins_dir=tmp_path, pod_uid=UID))
