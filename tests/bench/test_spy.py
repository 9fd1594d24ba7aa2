"""bench/spy.py: a running process sampled with the real py-spy, each sample charged to the right owner and work.

``bench_dra_cluster.py --profile`` reads a driver's profile through it; a sample charged to the
wrong module would send the next change to the wrong place. The names py-spy prints are checked
on their own (fast), and one real recording of a child process whose work is known (slow: py-spy
attaches with ptrace, as root does here and in CI).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import spy


@pytest.mark.parametrize(
    ("printed", "module"),
    [
        ("grpc/aio/_server.py", "grpc.aio._server"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/json/decoder.py", "json.decoder"),
        ("/srv/.venv/lib/python3.11/site-packages/httpcore/_async/connection.py", "httpcore._async.connection"),
        ("/srv/.venv/lib/python3.11/site-packages/cdiplug/dra/checkpoint.py", "cdiplug.dra.checkpoint"),
        ("/home/me/cdiplug/cdiplug/dra/prepare.py", "cdiplug.dra.prepare"),  # an editable install
        ("/home/me/cdiplug/backends/fake/backend.py", "cdiplug_backends.fake.backend"),
        ("asyncio/__init__.py", "asyncio"),
        ("<string>", "<string>"),
        ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap>"),
    ],
)
def test_module_of_names_the_module_py_spy_printed_the_file_of(printed: str, module: str) -> None:
    assert spy.module_of(printed) == module


def test_a_sample_is_charged_to_the_innermost_frame_of_the_profiled_code() -> None:
    frames = [
        ("serve", "cdiplug.cli"),  # asyncio.run(...) in the command's function
        ("BaseEventLoop._run_once", "asyncio.base_events"),
        ("Handle._run", "asyncio.events"),
        ("DraService.NodePrepareResources", "cdiplug.dra.service"),
        ("ClaimPreparer._prepare", "cdiplug.dra.prepare"),
        ("read_claim", "cdiplug.dra.claims"),
        ("AsyncClient.send", "httpx._client"),
        ("_parse", "h11._readers"),
    ]
    assert spy.owner(frames) == "cdiplug.dra.claims"
    assert spy.work(frames) == "cdiplug.dra.service:DraService.NodePrepareResources"
    # the loop woken from its wait: the command that started the loop is not the owner
    waiting = [
        ("serve", "cdiplug.cli"),
        ("BaseEventLoop._run_once", "asyncio.base_events"),
        ("EpollSelector.select", "selectors"),
    ]
    assert spy.owner(waiting) == "selectors"
    assert spy.work(waiting) == "(no work's)"
    # the server's own handling of a call, run by the loop that cdiplug's command started
    grpc = [("serve", "cdiplug.cli"), ("BaseEventLoop._run_once", "asyncio.base_events"), ("_handle_call", "grpc.aio._server")]
    assert spy.owner(grpc) == "grpc"
    worker = [
        ("Thread.run", "threading"),
        ("_worker", "concurrent.futures.thread"),
        ("_WorkItem.run", "concurrent.futures.thread"),
        ("CheckpointFile.save", "cdiplug.dra.checkpoint"),
        ("write_atomic", "cdiplug.toolkit.atomic"),
    ]
    assert spy.owner(worker) == "cdiplug.toolkit.atomic"
    assert spy.work(worker) == "cdiplug.dra.checkpoint:CheckpointFile.save"
    floor = [
        ("main", "floor_dra"),
        ("BaseEventLoop._run_once", "asyncio.base_events"),
        ("FloorDra.save", "floor_dra"),
        ("dumps", "json"),
    ]
    assert spy.owner(floor, own_functions="floor_dra") == "floor_dra:FloorDra.save"


@pytest.mark.slow  # a second of sampling a child process
def test_a_recording_charges_a_process_s_cpu_to_the_function_doing_the_work(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent(
            """
            import json, time

            def encode() -> None:
                deadline = time.monotonic() + 1.5
                while time.monotonic() < deadline:
                    json.dumps({"devices": [{"id": i, "healthy": True} for i in range(200)]})

            def idle() -> None:
                time.sleep(0.5)  # waiting: no samples

            idle()
            encode()
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(child)])
    try:
        with spy.record(proc.pid, tmp_path / "child.spy", rate=200) as raw:
            assert proc.wait(timeout=30) == 0  # py-spy stops on its own when the process ends
    finally:
        proc.kill()
    summary = spy.summarize(raw, rate=200, calls=1, own_functions="child")
    owners = summary["by_owner_ms"]
    assert next(iter(owners)) == "child:encode", owners  # the largest owner
    assert owners.get("child:idle", 0) < owners["child:encode"] / 20, owners  # a sample as it went to sleep, at most
    # sampled CPU time, in ms: most of the 1.5 s of work, never more than the whole run
    assert 500 < summary["ms_per_call"] < 2500, summary
    assert next(iter(summary["by_work_ms"])) == "child:<module>", summary  # a script's work: the module's code
    assert "json" in summary["by_library_ms"], summary
