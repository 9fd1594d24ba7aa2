"""A second full run of hack/test.sh on one machine waits for the first (its lock), rather than
taking over the first run's cluster: `local-cluster.sh up` starts only what is not running."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_full_run_waits_for_the_lock_and_does_nothing_meanwhile(tmp_path: Path) -> None:
    lock = tmp_path / "test.lock"
    env = {k: v for k, v in os.environ.items() if k != "CDIPLUG_TEST_LOCKED"}
    env["CDIPLUG_TEST_LOCK"] = str(lock)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run = subprocess.Popen(
            [str(ROOT / "hack" / "test.sh")], env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert run.stderr is not None
            line = run.stderr.readline()
            assert f"waiting for the full run that holds {lock}" in line
            # Still waiting on the lock (flock has not started the run yet).
            assert run.poll() is None
        finally:
            run.kill()
            run.communicate(timeout=10)
