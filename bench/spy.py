"""Where a running Python process's time goes, sampled from outside with py-spy.

``bench_dra_cluster.py --profile`` attaches it to the drivers on the real cluster while the pods
are made. py-spy reads a process's stacks without stopping it (``--nonblocking``), so the process
runs as it would without it; but py-spy's own CPU is taken from the same cores, so a profiled
run's timings are not a bench's figures. A thread is sampled while it is runnable: running, or
woken and waiting for a core (on a busy two-core node that wait is part of a call's time too),
in Python or in a system call it made. A thread asleep, in ``epoll`` or on a lock, is not.

Each sample is charged three times:

- to its **owner**: the innermost frame of the code the profile is about (a module of cdiplug or
  of its backends, a function of a floor script) in the piece of work the sample is in (a
  callback or task step of the event loop, a function in a worker thread), else the leaf frame's
  top-level package: what a step costs with the libraries it calls (``cdiplug.kube.client`` holds
  a request through lightkube and httpx; ``grpc`` alone is the server's own handling of a call);
- to its **work**: the outermost such frame, with its function: the task or worker function
  (``cdiplug.dra.statuswriter:StatusWriter._write``, ``cdiplug.dra.checkpoint:CheckpointFile.locked_change``);
- to its **library**: the leaf frame's top-level package (``httpcore``, ``json``, ``cdiplug``):
  what each library costs, whoever called it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

OWN_PACKAGES = ("cdiplug", "cdiplug_backends")
# where a file's own module path starts, in the paths py-spy prints (it shortens most of them)
_ROOTS = ("/site-packages/", "/dist-packages/", "/lib/python3.")
# an editable install's files are named by their full path in the repository
_EDITABLE = {"/cdiplug/": "cdiplug", "/backends/": "cdiplug_backends"}


def py_spy() -> str:
    """The py-spy beside this Python (the test extra installs it), else the one on PATH."""
    found = Path(sys.executable).with_name("py-spy")
    if found.exists():
        return str(found)
    on_path = shutil.which("py-spy")
    if on_path is None:
        raise SystemExit("py-spy not found: pip install py-spy (the project's test extra has it)")
    return on_path


@contextlib.contextmanager
def record(pid: int, out: Path, rate: int) -> Iterator[Path]:
    """Sample ``pid`` at ``rate`` Hz until the block ends; the raw stacks land in ``out``."""
    argv = [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking", "--threads"]
    argv += ["--format", "raw", "--output", str(out)]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield out
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        try:
            _, err = spy.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            raise
    if not out.exists():
        raise SystemExit(f"py-spy wrote no profile of process {pid}: {err.strip()[-500:]}")


def module_of(filename: str) -> str:
    """The dotted module of a file as py-spy names it (``grpc/aio/_server.py``,
    ``/usr/lib/python3.11/json/decoder.py``, a full path into an editable install)."""
    if filename.startswith("<"):
        return filename  # <string>, <frozen importlib._bootstrap>
    path = filename
    for root in _ROOTS:
        if root in path:
            path = path.rsplit(root, 1)[1]
            if root == "/lib/python3.":
                path = path.partition("/")[2]  # past the "11/" of the version
            break
    else:
        # the innermost of the two folders: a repository may itself be called cdiplug
        folder = max(_EDITABLE, key=path.rfind)
        if folder in path:
            path = _EDITABLE[folder] + "/" + path.rsplit(folder, 1)[1]
    path = path.removesuffix(".py").removesuffix("/__init__")
    return path.strip("/").replace("/", ".") or filename


def parse(lines: Iterable[str]) -> Iterator[tuple[list[tuple[str, str]], int]]:
    """Each stack of a raw profile (outermost frame first) as (function, module) pairs, and its samples."""
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for frame in stack.split(";"):
            function, paren, where = frame.partition(" (")
            if not paren or frame.startswith("thread ("):
                continue  # the thread's name, not a frame
            frames.append((function, module_of(where.rpartition(":")[0])))
        if frames:
            yield frames, int(count)


# The frames that run pieces of work: the event loop (each callback or task step it runs lies
# below its ``_run_once``) and a worker thread of an executor. What lies above them (``asyncio.run``
# and the ``main`` that called it) is no work's owner.
_RUNNERS = {("BaseEventLoop._run_once", "asyncio.base_events"), ("_worker", "concurrent.futures.thread")}


def _work(frames: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The frames of the piece of work a sample is in: below the innermost runner, if any."""
    runner = max((i for i, frame in enumerate(frames) if frame in _RUNNERS), default=-1)
    return frames[runner + 1 :]


def _own(frame: tuple[str, str], own_functions: str | None) -> str | None:
    function, module = frame
    if own_functions is not None and module.rpartition(".")[2] == own_functions:
        return f"{own_functions}:{function}"
    if module.split(".", 1)[0] in OWN_PACKAGES:
        return module
    return None


def owner(frames: list[tuple[str, str]], own_functions: str | None = None) -> str:
    """The innermost frame of the profiled code (a cdiplug module; a function of the module
    ``own_functions``) in the piece of work the sample is in, else the leaf frame's top-level
    package (``grpc`` for the server's own handling of a call; ``selectors`` for the loop woken
    from its wait, ``concurrent`` for a worker thread between two functions: no work's)."""
    for frame in reversed(_work(frames)):
        if (name := _own(frame, own_functions)) is not None:
            return name
    return frames[-1][1].split(".", 1)[0]


def work(frames: list[tuple[str, str]], own_functions: str | None = None) -> str:
    """The outermost frame of the profiled code in the piece of work the sample is in, with its
    function (``cdiplug.dra.statuswriter:StatusWriter._write``): the task, callback or worker
    function that the sample is part of; else ``(no work's)``."""
    for frame in _work(frames):
        if (name := _own(frame, own_functions)) is not None:
            return name if ":" in name else f"{name}:{frame[0]}"
    return "(no work's)"


def summarize(path: Path, rate: int, calls: int, own_functions: str | None = None, top: int = 12) -> dict[str, Any]:
    """Sampled ms per call of a raw profile, by owner, by piece of work and by library (the
    ``top`` largest of each, the rest summed as ``(the rest)``)."""
    by_owner: Counter[str] = Counter()
    by_work: Counter[str] = Counter()
    by_library: Counter[str] = Counter()
    samples = 0
    with path.open() as lines:
        for frames, count in parse(lines):
            samples += count
            by_owner[owner(frames, own_functions)] += count
            by_work[work(frames, own_functions)] += count
            by_library[frames[-1][1].split(".", 1)[0]] += count
    per_call = 1000 / rate / max(calls, 1)

    def table(counter: Counter[str]) -> dict[str, float]:
        shown = dict(counter.most_common(top))
        rest = samples - sum(shown.values())
        out = {name: round(n * per_call, 3) for name, n in shown.items()}
        if rest:
            out["(the rest)"] = round(rest * per_call, 3)
        return out

    return {
        "samples": samples,
        "calls": calls,
        "ms_per_call": round(samples * per_call, 3),
        "by_owner_ms": table(by_owner),
        "by_work_ms": table(by_work),
        "by_library_ms": table(by_library),
    }
