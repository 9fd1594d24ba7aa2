"""Generated hostile inputs (hypothesis, derandomized, ``max_examples`` set per test): configuration
files, health files, journal and record files, sysfs trees, and gRPC requests over a real socket.

Each input must end in a value or one of our errors naming its source, on one short line: never a
hang, another exception class, a traceback, or a status other than OK or INVALID_ARGUMENT.
Bound: about 1,000 inputs in all, ~60 s.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.backend import Abilities
from cdiplug.config import load_config
from cdiplug.deviceplugin.allocator import Allocator
from cdiplug.deviceplugin.server import MAX_DETAILS, ResourceServer
from cdiplug.deviceplugin.settings import DevicePluginSettings
from cdiplug.errors import ConfigError, InputError
from cdiplug.models.devices import MAX_NUMA_NODE, Device, DeviceSnapshot
from cdiplug.models.resource import ResourceConfig
from cdiplug_backends.fake.backend import read_health_file
from cdiplug_backends.pci.journal import Journal
from cdiplug_backends.pci.sysfs import PciSysfs
from cdiplug_backends.pci.testing import SysfsTree

from .conftest import SCALE, figure

SETTINGS = {"derandomize": True, "deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
TRIED: dict[str, int] = {}


def tried(kind: str) -> None:
    TRIED[kind] = TRIED.get(kind, 0) + 1
    figure("generated inputs tried per class", dict(TRIED))


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cdp-fuzz-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.sampled_from(["fake", "example.com/fpga", "dra", "device-plugin", "cdi-cri", "Healthy", "Unhealthy"]),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(["resources", "name", "backend", "options", "count", "numa_nodes", "replicas", "health_file"])
            | st.text(max_size=8),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=20,
)
config_like = st.builds(
    lambda name, count, numa, replicas, kind: {
        "resources": [
            {"name": name, "backend": "fake", "options": {"count": count, "numa_nodes": numa}, "replicas": replicas, **kind}
        ]
    },
    st.sampled_from(["example.com/fpga", "example.com/" + "x" * 70, "nodomain", "a/b/c"]),
    st.integers(min_value=-5, max_value=200_000),
    st.lists(st.integers(min_value=-3, max_value=2**40), max_size=3),
    st.integers(min_value=-2, max_value=2**40),
    st.sampled_from([{}, {"cdi_kind": "a" * 300 + ".io/b"}, {"api": "dra"}, {"allocate": []}]),
)


def as_text(document: object) -> bytes:
    return yaml.safe_dump(document).encode()


file_bytes = st.one_of(
    documents.map(as_text),
    config_like.map(as_text),
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"a: &a [*a]", b"\t- x", b"[" * 200, b"x: 1" + b"0" * 5000, b'{"a": 1}', b"---\n---\n"]),
)


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(data=file_bytes)
def test_generated_configuration_files(folder: Path, data: bytes) -> None:
    path = folder / "config.yaml"
    path.write_bytes(data)
    tried("configuration files")
    try:
        load_config(path)
    except ConfigError as exc:
        text = str(exc)
        assert f"(in {path})" in text and "\n" not in text and len(text) < 1500, text[:500]


@settings(max_examples=200 * SCALE, **SETTINGS)
@given(data=file_bytes, suffix=st.sampled_from([".yaml", ".json"]))
def test_generated_health_files(folder: Path, data: bytes, suffix: str) -> None:
    path = folder / f"health{suffix}"
    path.write_bytes(data)
    tried("health files")
    try:
        health = read_health_file(path)
    except InputError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc) and len(str(exc)) < 1500
    else:
        assert all(isinstance(k, str) for k in health)


journal_like = st.fixed_dictionaries(
    {"op": st.sampled_from(["bind", "restore", "x"]), "group": st.sampled_from(["40", "../x", "noiommu:0000:00:01.0", "4 0"])},
    optional={
        "functions": st.lists(
            st.fixed_dictionaries({"address": st.sampled_from(["0000:3b:02.0", "../../etc", "x"])}), max_size=2
        ),
        "step": st.sampled_from(["record", "verify", "bogus"]),
        "started_at": st.one_of(st.floats(allow_nan=False), st.text(max_size=5)),
    },
)


@settings(max_examples=150 * SCALE, **SETTINGS)
@given(data=st.one_of(file_bytes, journal_like.map(lambda d: yaml.safe_dump(d, default_flow_style=True).encode())))
def test_generated_journal_and_record_files(folder: Path, data: bytes) -> None:
    state = folder / "state"
    shutil.rmtree(state, ignore_errors=True)
    journal = Journal(state)
    journal.ensure()
    (journal.journal_dir / "40.json").write_bytes(data)
    (journal.bound_dir / "0000:3b:02.0.json").write_bytes(data)
    tried("journal and record files")
    for entry in journal.pending():
        assert entry.group == "40"
    record = journal.bound("0000:3b:02.0")
    assert record is None or record.address == "0000:3b:02.0"
    left = os.listdir(journal.journal_dir) + os.listdir(journal.bound_dir)
    assert all(n.endswith(".json") or ".corrupt-" in n for n in left)


@settings(max_examples=150 * SCALE, **SETTINGS)
@given(
    group=st.one_of(
        st.integers(0, 10**6).map(str),
        st.sampled_from(["..", ".", "vfio", "-1", "1e3", " 7", "٣"]),
        st.text(alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=20),
    ),
    numa=st.one_of(st.integers(-(2**40), 2**40).map(str), st.text(max_size=12), st.just("9" * 4000)),
)
def test_generated_sysfs_trees(folder: Path, group: str, numa: str) -> None:
    root = folder / "sys"
    shutil.rmtree(root, ignore_errors=True)
    tree = SysfsTree(root)
    tree.add_function("0000:3b:00.0", iommu_group=5)
    function = tree.function_dir("0000:3b:00.0")
    (function / "numa_node").write_text(numa)
    target = root / "kernel" / "iommu_groups" / group
    if group not in (".", ".."):
        target.mkdir(parents=True, exist_ok=True)
    (function / "iommu_group").unlink()
    (function / "iommu_group").symlink_to(target)
    tried("sysfs trees")
    fn = PciSysfs(root).read_function("0000:3b:00.0")
    assert fn is not None
    assert fn.iommu_group is None or (fn.iommu_group.isascii() and fn.iommu_group.isdigit())
    assert fn.iommu_group is not None or fn.problem is not None
    assert fn.numa_node is None or 0 <= fn.numa_node <= MAX_NUMA_NODE


# -- gRPC requests over a real socket ------------------------------------------------------------


@pytest.fixture(scope="module")
def grpc_target() -> Iterator[str]:
    """A real ResourceServer with the real Allocator, on its own loop in a thread."""
    folder = Path(tempfile.mkdtemp(prefix="cdp-g-"))
    loop = asyncio.new_event_loop()
    config = ResourceConfig(name="example.com/fpga", backend="fake", options=None, settings=DevicePluginSettings(replicas=2))
    allocator = Allocator(config, Abilities())
    allocator.update(DeviceSnapshot("example.com/fpga", [Device(f"fpga-{i}", numa_nodes=(i % 2,)) for i in range(4)]))
    server = ResourceServer("example.com/fpga", "fpga.sock", folder, allocator)
    thread = threading.Thread(target=loop.run_forever, name="fuzz grpc", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield f"unix://{server.socket_path}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        shutil.rmtree(folder, ignore_errors=True)


ids = st.one_of(
    st.sampled_from(["fpga-0::0", "fpga-1::1", "fpga-3::0", "fpga-0", ""]),
    st.text(max_size=40),
    st.integers(1, 300_000).map(lambda n: "z" * n),  # long IDs, up to 300 KB
)
requests = st.one_of(
    st.builds(
        lambda cs: (
            "Allocate",
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in cs]).SerializeToString(),
        ),
        st.lists(st.lists(ids, max_size=5), max_size=3),
    ),
    st.builds(
        lambda a, m, n: (
            "GetPreferredAllocation",
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=a, must_include_deviceIDs=m, allocation_size=n)
                ]
            ).SerializeToString(),
        ),
        st.lists(ids, max_size=6),
        st.lists(ids, max_size=2),
        st.integers(-(2**31), 2**31 - 1),
    ),
    st.tuples(st.sampled_from(["Allocate", "GetPreferredAllocation", "PreStartContainer"]), st.binary(max_size=200)),
)


@settings(max_examples=200 * SCALE, **SETTINGS)
@given(request=requests)
def test_generated_grpc_requests(grpc_target: str, request: tuple[str, bytes]) -> None:
    method, data = request
    tried("gRPC requests")
    with grpc.insecure_channel(grpc_target) as channel:
        call = channel.unary_unary(f"/v1beta1.DevicePlugin/{method}")
        try:
            call(data, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details()[:300])
            assert len(exc.details()) <= MAX_DETAILS + 40
