"""The command line tried with bad input, each case with the message a user sees.

In-process through ``cdiplug.cli.main`` (argparse's own errors are SystemExit 2 with the message on
stderr); the help texts of every command, walked from the parser itself.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdiplug.cli import build_parser, main
from cdiplug.models.world import World
from cdiplug_backends.pci.testing import SysfsTree


def leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command parser (``serve``, ``cdi generate``, ...) with its words."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from leaves(child, (*path, name))


def all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from all_parsers(child)


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _no_cdiplug_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No CDIPLUG_* from the caller's environment; the root logger as it was afterwards."""
    import logging
    import os

    for name in [n for n in os.environ if n.startswith("CDIPLUG_")]:
        monkeypatch.delenv(name)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_help_texts_have_no_markup() -> None:
    for parser in all_parsers(build_parser()):
        text = parser.format_help()
        assert "``" not in text and ":class:" not in text and ":mod:" not in text, f"{parser.prog}:\n{text}"


def test_each_command_lists_only_the_folders_it_uses() -> None:
    commands = dict(leaves(build_parser()))
    for words in [("discover",), ("vfio", "status"), ("vfio", "bind"), ("cdi", "generate")]:
        assert not flags(commands[words]) & {"--kubelet-dir", "--cdi-dir", "--pod-resources-socket"}, words
    assert {"--sysfs-root", "--dev-root", "--state-dir"} <= flags(commands[("discover",)])
    assert flags(commands[("cdi", "list")]) >= {"--cdi-dir"}
    assert {"--kubelet-dir", "--cdi-dir", "--plugins-dir"} <= flags(commands[("serve",)])


def test_every_command_has_log_level() -> None:
    for words, parser in leaves(build_parser()):
        assert "--log-level" in flags(parser), words


def test_bad_log_level_from_the_environment(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDIPLUG_LOG_LEVEL", "loud")
    code, _, err = run(capsys, "discover")
    assert code == 2
    assert "--log-level (or $CDIPLUG_LOG_LEVEL) must be one of debug, info, warning, error, got 'loud'" in err


def test_log_level_debug_shows_debug_records(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    code, _, _ = run(capsys, "discover", "--log-level", "debug", "-o", "json")
    assert code == 0
    assert logging.getLogger().level == logging.DEBUG


def path_flags() -> Iterator[tuple[tuple[str, ...], str]]:
    """Every node-path flag of every command (those that must be absolute)."""
    for words, parser in leaves(build_parser()):
        for action in parser._actions:
            check = getattr(action.type, "__qualname__", "")
            if action.option_strings and check.startswith("path_type") and action.default is not None:
                yield words, action.option_strings[0]


@pytest.mark.parametrize(("words", "flag"), list(path_flags()), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_relative_node_paths_are_refused(capsys: pytest.CaptureFixture[str], words: tuple[str, ...], flag: str) -> None:
    extra = ["0000:3b:02.0"] if words[0] == "vfio" else []
    code, _, err = run(capsys, *words, *extra, flag, "rel/k")
    assert code == 2
    assert f"argument {flag}: 'rel/k' (from {flag} or $CDIPLUG_" in err
    assert "is a relative path; give an absolute one" in err
    assert "Traceback" not in err


def test_serve_relative_kubelet_dir_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDIPLUG_KUBELET_DIR", "rel/k")
    code, _, err = run(capsys, "serve")
    assert code == 2
    assert "argument --kubelet-dir: 'rel/k' (from --kubelet-dir or $CDIPLUG_KUBELET_DIR) is a relative path" in err


def test_empty_config_path(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "discover", "--config", "")
    assert code == 2 and "argument --config: an empty path" in err


def test_cdi_generate_prints_to_stdout_without_a_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "cdi", "generate")
    assert code == 0, err
    spec = json.loads(out)
    assert spec["kind"] == "example.com/fpga" and [d["name"] for d in spec["devices"]] == ["fpga-0", "fpga-1"]
    assert "printed cdiplug-example.com-fpga.json (2 devices)" in err
    assert list(tmp_path.iterdir()) == []


def test_cdi_list_of_a_missing_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "cdi", "list", "--cdi-dir", str(tmp_path / "nowhere"))
    assert code == 1 and out == ""
    assert f"cdiplug cdi list: {tmp_path / 'nowhere'}: no such folder" in err


def test_vfio_status_of_an_absent_address(capsys: pytest.CaptureFixture[str], world: World) -> None:
    tree = SysfsTree(world.sysfs_root, world.dev_root)
    tree.enable_vfio()
    tree.add_function("0000:3b:00.0", driver="i40e", iommu_group=5)
    argv = ["--sysfs-root", str(world.sysfs_root), "--dev-root", str(world.dev_root), "--state-dir", str(world.state_dir)]
    code, _, err = run(capsys, "vfio", "status", "0000:3b:09.0", *argv)
    assert code == 1
    assert "cdiplug vfio status: no such device 0000:3b:09.0" in err
    assert "cannot prepare" not in err


def discover_with(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> tuple[int, str, Path]:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    code, _, err = run(capsys, "discover", "--config", str(config))
    return code, err, config


def test_duplicate_keys_are_refused_with_both_lines(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = "resources:\n  - name: example.com/fpga\n    backend: fake\n    options: {count: 1}\n    backend: fake\n"
    code, err, config = discover_with(capsys, tmp_path, text)
    assert code == 2
    assert "duplicate key 'backend' (first at line 3, again at line 5)" in err and str(config) in err


def test_a_configmap_passed_as_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cdiplug}\n"
        "data:\n  config.yaml: |\n    resources:\n      - {name: example.com/fpga, backend: fake}\n"
    )
    code, err, config = discover_with(capsys, tmp_path, text)
    assert code == 2
    assert "this is a Kubernetes ConfigMap, not a cdiplug configuration: pass the file it holds, its data's 'config.yaml'" in err
    assert str(config) in err


def test_an_unquoted_hex_id(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = "resources:\n  - name: example.com/nic\n    backend: pci\n    options:\n      selectors: [{vendor: 0x8086}]\n"
    code, err, _ = discover_with(capsys, tmp_path, text)
    assert code == 2
    assert 'got int 32902 (YAML reads an unquoted 0x8086 as the number 32902: quote it, "0x8086")' in err
    assert "$.resources[0].options.selectors[0].vendor" in err


def test_a_tab_in_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err, config = discover_with(capsys, tmp_path, "resources:\n\t- name: example.com/fpga\n")
    assert code == 2
    assert "at line 2, column 1: a tab: tabs are not allowed in YAML indentation, indent with spaces" in err
    assert str(config) in err


def test_discover_warns_about_options_the_node_contradicts(
    capsys: pytest.CaptureFixture[str], world: World, tmp_path: Path
) -> None:
    tree = SysfsTree(world.sysfs_root, world.dev_root)
    tree.add_function("0000:3b:00.0", driver="i40e", iommu_group=5)
    config = tmp_path / "config.yaml"
    config.write_text(
        "resources:\n"
        f"  - {{name: example.com/fpga, backend: fake, options: {{health_file: {tmp_path}/health.yaml}}}}\n"
        "  - name: example.com/nic\n"
        "    backend: pci\n"
        "    options:\n"
        "      selectors: [{vendor: '0x8086'}, {addresses: ['3b:00.0']}, {vendor: '0x15b3'}]\n"
    )
    argv = ["--sysfs-root", str(world.sysfs_root), "--dev-root", str(world.dev_root), "--state-dir", str(world.state_dir)]
    code, out, err = run(capsys, "discover", "--config", str(config), *argv)
    assert code == 0, err
    assert "example.com/nic: 1 devices" in out
    lines = err.splitlines()
    assert (
        f"cdiplug discover: warning: health file: example.com/fpga: options.health_file: {tmp_path}/health.yaml does not exist: "
        "every device is Healthy until it is made" in "\n".join(lines)
    )
    assert any(
        line.startswith(
            "cdiplug discover: warning: PCI address: example.com/nic: options.selectors[1].addresses[0]: "
            "'3b:00.0' has no PCI domain, so it matches no function (sysfs names them 0000:3b:00.0)"
        )
        for line in lines
    ), lines
    selectors = [line for line in lines if "warning: selector: example.com/nic" in line]
    assert [line.split(": ")[4] for line in selectors] == ["options.selectors[1]", "options.selectors[2]"], selectors
    assert "matches none of the 1 PCI functions of this node" in selectors[0]
