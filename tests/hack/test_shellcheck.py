"""Every shell script people run (hack/*.sh, .ci/run) is clean under the real shellcheck.

The scripts that need a node, a VM or Docker cannot all run here; shellcheck at least keeps
quoting, unset variables and typos out of them. CI installs shellcheck, so none is skipped.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # shellcheck over every script (hack/test.sh --fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("hack/*.sh"), *ROOT.glob("hack/lib/*.sh"), ROOT / ".ci" / "run"])


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) >= 6


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_is_shellcheck_clean(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed (apt-get install shellcheck)"
    # -x from the checkout root: sourced helpers (hack/lib) are followed and checked in place.
    result = subprocess.run(
        [shellcheck, "-x", "--severity=style", "--shell=bash", str(script)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
