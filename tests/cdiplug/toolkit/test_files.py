"""Bounded reading and safe loading of the files cdiplug is given (cdiplug.toolkit.files, cdiplug.toolkit.safeload),
and their use for the configuration and kubeconfigs.

Real files in a temporary folder: FIFOs without a writer, /dev/zero, folders, symlinks, files past
the size limit, non-UTF-8 bytes, deep nesting, huge integers, YAML alias bombs, recursive aliases.
Each must be a one-line InputError naming the file (and where known the place in it), never a
hang, a MemoryError or another exception class; legitimate anchors still work.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdiplug.config import load_config
from cdiplug.errors import ConfigError, InputError
from cdiplug.kube.credentials import CredentialsError, load_kubeconfig
from cdiplug.toolkit.files import CONFIG_LIMIT, read_bounded, read_text
from cdiplug.toolkit.safeload import MAX_ALIAS_NODES, load_json, load_yaml


def laughs(levels: int = 9) -> str:
    text = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for prev, name in zip("abcdefghijk", "bcdefghijkl"[: levels - 1]):
        text += f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]\n"
    return text


HOSTILE = {
    "fifo": (lambda p: os.mkfifo(p), "it is a FIFO, not a regular file"),
    "folder": (lambda p: p.mkdir(), "it is a folder, not a regular file"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "it is a character device"),
    "too-big": (lambda p: p.write_bytes(b"#" * (CONFIG_LIMIT + 1)), "too big: more than 1,048,576 bytes"),
    "not-utf8": (lambda p: p.write_bytes(b"resources:\n- name: \xc3\x28\n"), "not UTF-8 text (byte 19 is 0xc3, on line 2)"),
    "deep": (lambda p: p.write_text("resources: " + "[" * 10_000 + "]" * 10_000), "nested more than 64 levels deep"),
    "huge-int": (lambda p: p.write_text("resources:\n- replicas: " + "1" * 100_000), "integer of 100,000 characters"),
    "laughs": (lambda p: p.write_text(laughs()), f"more nodes (at most {MAX_ALIAS_NODES:,})"),
    "recursive-alias": (lambda p: p.write_text("resources: &r [*r]\n"), "an alias refers to a node that contains it"),
    "tab-soup": (lambda p: p.write_text("\t\x00\x01"), "not valid YAML"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_configuration_is_one_clear_error(tmp_path: Path, case: str) -> None:
    make, expected = HOSTILE[case]
    path = tmp_path / "config.yaml"
    make(path)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert expected in text and f"(in {path})" in text
    assert "\n" not in text and len(text) < 400


@pytest.mark.parametrize("case", ["fifo", "dev-zero", "not-utf8", "laughs", "too-big"])
def test_hostile_kubeconfig_is_one_clear_error(tmp_path: Path, case: str) -> None:
    make, expected = HOSTILE[case]
    path = tmp_path / "kubeconfig"
    make(path)
    with pytest.raises(CredentialsError) as info:
        load_kubeconfig(path)
    assert expected in str(info.value) and str(path) in str(info.value)


def test_a_kubeconfig_naming_a_fifo_as_its_token_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "token")
    (tmp_path / "kubeconfig").write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {tokenFile: token}}]\n"
    )
    with pytest.raises(CredentialsError, match="it is a FIFO.*named in"):
        load_kubeconfig(tmp_path / "kubeconfig")


def test_read_bounded_reads_regular_files_and_follows_links_only_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.write_bytes(b"x" * 10)
    link = tmp_path / "l"
    link.symlink_to(target)
    assert read_bounded(link, 10, "file") == b"x" * 10
    with pytest.raises(InputError, match="it is a symbolic link"):
        read_bounded(link, 10, "file", follow=False)
    with pytest.raises(InputError, match="too big: more than 9 bytes"):
        read_bounded(target, 9, "file")
    assert read_bounded(tmp_path / "missing", 9, "file", missing_ok=True) is None
    assert read_text(target, 10, "file") == "x" * 10
    with pytest.raises(InputError, match="No such file"):
        read_bounded(tmp_path / "missing", 9, "file")


def test_sysfs_and_proc_files_whose_size_lies_are_read() -> None:
    """sysfs attributes report 4096 bytes and /proc files 0: the limit is on what is read."""
    assert read_bounded("/proc/self/stat", 4096, "stat")
    numa = Path("/sys/devices/system/node/node0/cpulist")
    if numa.exists():
        assert numa.stat().st_size == 4096 and 0 < len(read_bounded(numa, 64, "cpulist") or b"") < 64


def test_anchors_within_the_budget_still_work() -> None:
    text = "base: &o {count: 2, numa_nodes: [0, 1]}\nresources:\n- {name: a.io/x, options: *o}\n- {name: a.io/y, options: *o}\n"
    data = load_yaml(text, "c.yaml")
    assert data["resources"][1]["options"] == {"count": 2, "numa_nodes": [0, 1]}
    assert load_yaml("", "c.yaml") is None
    with pytest.raises(InputError, match="more nodes"):
        load_yaml(laughs(5), "c.yaml")  # 9^5 = 59,049 repeated nodes


def test_json_bounds() -> None:
    assert load_json('{"a": [1, 2, {"b": 3}]}', "f.json") == {"a": [1, 2, {"b": 3}]}
    for text, expected in (
        ("[" * 100 + "]" * 100, "nested more than 64"),
        ("[" * 100_000 + "]" * 100_000, "nested more than 64"),
        ("1" * 5000, "integer of 5,000 digits"),
        ('{"a": }', "not valid JSON at line 1, column 7"),
    ):
        with pytest.raises(InputError, match=expected):
            load_json(text, "f.json")


def test_yaml_reads_as_pyyaml_does_with_libyamls_parser() -> None:
    # PyYAML's wheels carry libyaml: its C parser makes the events (the configuration is read
    # before the kubelet hears from us), while the nodes are composed in Python under our bounds.
    import yaml
    from yaml.cyaml import CParser

    from cdiplug.toolkit.safeload import _loader_class

    assert yaml.__with_libyaml__ and issubclass(_loader_class(), CParser)
    repo = Path(__file__).resolve().parents[3]
    # Helm's templates are Go templates that render to YAML, not YAML themselves.
    files = [p for p in sorted(repo.glob("deploy/**/*.yaml")) if "templates" not in p.relative_to(repo).parts]
    documents = [p.read_text() for p in files if "---" not in p.read_text()]
    documents += [
        "resources:\n  - name: example.com/fpga\n    backend: fake\n    options: {count: 2, numa_nodes: [0, 1]}\n",
        "a: &x {k: [1, 2.5, true, null, '08', 0x1f, 1e3, ~, 2001-12-14]}\nb: *x\nc: |\n  text\n  lines\nd: >-\n  folded\n",
        "fpga-0: Unhealthy\nfpga-1: Healthy\n'quoted: key': \"é\\u00e9\\t\"\n",
        "",
        "- [a, {b: c}]\n- ? complex\n  : key\n",
    ]
    assert len(documents) > 8
    for text in documents:
        assert load_yaml(text, "doc") == yaml.load(text, Loader=yaml.SafeLoader), text[:80]


# JSON documents: what the Helm chart renders, and JSON that YAML 1.1 reads otherwise.
JSON_DOCUMENTS = {
    "chart": '{\n  "resources": [\n    {\n      "backend": "fake",\n      "name": "example.com/fpga",\n      "options": {\n        "count": 2\n      }\n    }\n  ]\n}\n',
    "compact": '{"resources":[{"name":"a.io/x","options":{"count":2,"numa_nodes":[0,1],"ratio":0.5,"neg":-1.25,"z":-0}}],"node_labels":false,"n":null,"s":"a\\"b\\\\c\\/d\\n\\t"}',
    "empty": "{}",
    "with-crlf": '{\r\n  "a": [true, false, null],\r\n  "b": {"c": {"d": []}}\r\n}\r\n',
}
JSON_LEFT_TO_YAML = {  # JSON, but only the YAML reader knows what YAML makes of it: (text, its data or error)
    "exponent": ('{"a": 1e3, "b": 1.5E+2}', {"a": "1e3", "b": 150.0}),  # YAML 1.1 wants a dot and a sign
    "escape": ('{"a": "\\u00e9 \\u003c"}', {"a": "\u00e9 <"}),
    "non-ascii": ('{"a": "\u00e9"}', {"a": "\u00e9"}),
    "nan": ('{"a": NaN}', {"a": "NaN"}),
    "tab-indent": ('{\n\t"a": 1\n}', {"a": 1}),  # libyaml takes it, PyYAML's own scanner does not
    "surrogates": ('{"a": "\\ud83d\\ude00"}', "found invalid Unicode character escape code"),
    "del": ('{"a": "x\x7fy"}', "control characters are not allowed"),
    "duplicate": ('{"a": 1,\n "a": 2}', "duplicate key 'a' (first at line 1, again at line 2)"),
    "deep": ('{"a": ' + "[" * 100 + "]" * 100 + "}", "nested more than 64 levels deep"),
    "huge-int": ('{"a": ' + "9" * 100 + "}", "integer of 100 characters"),
    "truncated": ('{"a": [1, 2}', "not valid YAML at line 1"),
}


def test_json_documents_are_read_without_pyyaml_and_as_pyyaml_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from cdiplug.toolkit import safeload

    def outcome(text: str) -> object:
        try:
            return load_yaml(text, "doc")
        except InputError as exc:
            return exc.message

    by_json = {text: outcome(text) for text in [*JSON_DOCUMENTS.values(), *(t for t, _ in JSON_LEFT_TO_YAML.values())]}
    for name, text in JSON_DOCUMENTS.items():
        assert safeload._as_json(text) is not safeload._NOT_JSON, name  # the JSON reader took it
        assert by_json[text] == yaml.load(text, Loader=yaml.SafeLoader), name
    for name, (text, expected) in JSON_LEFT_TO_YAML.items():
        assert safeload._as_json(text) is safeload._NOT_JSON, name
        if isinstance(expected, dict):
            assert by_json[text] == expected, name
        else:
            assert expected in str(by_json[text]), name
    monkeypatch.setattr(safeload, "_as_json", lambda text: safeload._NOT_JSON)
    assert by_json == {text: outcome(text) for text in by_json}  # the YAML reader alone: the same


def test_a_json_configuration_is_read_without_importing_pyyaml(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "config.yaml"
    path.write_text(JSON_DOCUMENTS["chart"])
    script = (
        "import sys; from cdiplug.config import load_config; "
        f"config = load_config({str(path)!r}); "
        "print(config.resources[0].name, 'yaml' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["example.com/fpga", "False"]


@pytest.mark.parametrize("libyaml", [True, False], ids=["libyaml", "pure-python"])
def test_the_bounds_hold_with_either_parser(monkeypatch: pytest.MonkeyPatch, libyaml: bool) -> None:
    import yaml

    from cdiplug.toolkit.safeload import _loader_class

    monkeypatch.setattr(yaml, "__with_libyaml__", libyaml)
    _loader_class.cache_clear()
    try:
        assert load_yaml("a: &x [1, 2]\nb: *x\n", "doc") == {"a": [1, 2], "b": [1, 2]}
        for text, expected in [
            ("[" * 100 + "]" * 100, "nested more than 64"),
            ("n: " + "9" * 100, "integer of 100 characters"),
            (laughs(), "aliases would expand to"),
            ("a: [1\n", "not valid YAML at line 2"),
        ]:
            with pytest.raises(InputError, match=expected):
                load_yaml(text, "doc")
    finally:
        _loader_class.cache_clear()
