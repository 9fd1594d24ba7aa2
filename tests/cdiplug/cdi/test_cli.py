"""``cdiplug cdi generate|validate|list`` run as real subprocesses (``python -m cdiplug``) against
temporary folders, with the fake backend from its installed entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cdiplug.cdi.validate import check_file


def cdiplug(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDIPLUG_")}
    return subprocess.run([sys.executable, "-m", "cdiplug", *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd)


def test_generate_writes_specs_and_leaves_other_files(tmp_path: Path, schema_errors) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "resources:\n"
        "  - {name: example.com/fpga, backend: fake, options: {count: 3}}\n"
        "  - {name: example.com/nic, backend: fake, options: {count: 2}, cdi_kind: example.com/fake-nic}\n"
        "  - {name: example.com/none, backend: fake, options: {count: 0}}\n"
    )
    out = tmp_path / "cdi"
    out.mkdir()
    (out / "cdiplug-example.com-gone.json").write_text("{}")  # generate never removes anything
    result = cdiplug("cdi", "generate", "--config", str(config), "--output-dir", str(out))
    assert result.returncode == 0, result.stderr
    assert "3 devices, written" in result.stdout and "example.com/none: no devices, no spec" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "cdiplug-example.com-fake-nic.json",
        "cdiplug-example.com-fpga.json",
        "cdiplug-example.com-gone.json",
    ]
    for name in ("cdiplug-example.com-fake-nic.json", "cdiplug-example.com-fpga.json"):
        assert check_file(out / name) == []
        assert schema_errors(json.loads((out / name).read_text())) == []
    again = cdiplug("cdi", "generate", "--config", str(config), "--output-dir", str(out))
    assert "3 devices, unchanged" in again.stdout


def test_generate_default_config(tmp_path: Path) -> None:
    result = cdiplug("cdi", "generate", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    spec = json.loads((tmp_path / "cdiplug-example.com-fpga.json").read_text())
    assert [d["name"] for d in spec["devices"]] == ["fpga-0", "fpga-1"]


def test_generate_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("resources:\n  - {name: example.com/fpga, backend: fake, options: {count: -1}}\n")
    result = cdiplug("cdi", "generate", "--config", str(config), "--output-dir", str(tmp_path))
    assert result.returncode == 2
    assert "$.resources[0].options.count" in result.stderr and str(config) in result.stderr


def test_validate(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps(
            {"cdiVersion": "0.3.0", "kind": "example.com/fpga", "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}
        )
    )
    ok = cdiplug("cdi", "validate", str(good))
    assert ok.returncode == 0 and "1 spec file valid" in ok.stdout
    badfile = tmp_path / "bad.json"
    badfile.write_text(
        json.dumps({"cdiVersion": "0.3.0", "kind": "fpga", "devices": [{"name": "0a", "containerEdits": {}}], "x": 1})
    )
    result = cdiplug("cdi", "validate", str(good), str(badfile))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 4, lines  # unknown field, kind, empty edits, version for the digit
    assert all(line.endswith(f"(in {badfile})") for line in lines)
    assert {line.split(" @ ")[1].split(" ")[0] for line in lines} == {
        "$.x",
        "$.kind",
        "$.devices[0].containerEdits",
        "$.cdiVersion",
    }


def test_list_includes_specs_of_others(tmp_path: Path) -> None:
    cdiplug("cdi", "generate", "--output-dir", str(tmp_path))
    (tmp_path / "vendor.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: vendor.com/gpu\ndevices:\n- name: '0'\n  containerEdits: {env: [A=1]}\n"
    )
    (tmp_path / "notes.txt").write_text("not a spec")
    result = cdiplug("cdi", "list", "--cdi-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["example.com/fpga=fpga-0", "example.com/fpga=fpga-1", "vendor.com/gpu=0"]
    (tmp_path / "broken.json").write_text("{")
    broken = cdiplug("cdi", "list", "--cdi-dir", str(tmp_path))
    assert broken.returncode == 1 and "broken.json" in broken.stderr
    assert len(broken.stdout.split()) == 3
    (tmp_path / "broken.json").write_text(
        json.dumps({"cdiVersion": "0.3.0", "kind": "vendor.com/xx", "devices": [{"name": "a/b"}]})
    )
    bad_name = cdiplug("cdi", "list", "--cdi-dir", str(tmp_path))
    assert bad_name.returncode == 1 and "broken.json: CDI device name 'a/b'" in bad_name.stderr
    assert len(bad_name.stdout.split()) == 3
    missing = cdiplug("cdi", "list", "--cdi-dir", str(tmp_path / "missing"))
    assert missing.returncode == 1 and missing.stdout == ""
    assert f"cdiplug cdi list: {tmp_path / 'missing'}: no such folder" in missing.stderr
