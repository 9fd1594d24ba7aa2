#!/usr/bin/env bash
# The README's test command, and what .ci/run runs: install what the tests need, check, test.
#
#   hack/test.sh [PYTEST ARGS...]
#
# 1. Debian packages the end-to-end tests use (podman and runc for CDI, QEMU and busybox for the
#    VFIO VM test, shellcheck, iproute2) through apt, as root or with sudo;
# 2. the project with its test extra into .venv (hack/lib/venv.sh);
# 3. the static checks: ruff format and lint, mypy --strict, import-linter's layer contracts;
# 4. pytest, as root (the tests bind devices, mount, write /var/run/cdi; sudo for a normal
#    user). pytest's "no test collected" (exit 5) is a failure.
# With PYTEST ARGS only pytest gets them and the checks are skipped (a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib/venv.sh
source hack/lib/venv.sh

apt_install podman runc qemu-system-x86 busybox-static shellcheck iproute2
ensure_venv
.venv/bin/python -m pip install -q -e '.[test]'

status=0
step() {
  local what=$1 rc=0
  shift
  "$@" || rc=$?
  if ((rc == 5)) && [[ $what == pytest* ]]; then
    echo "$0: $what collected no tests; that is a failure" >&2
    rc=1
  fi
  ((rc == 0)) || { echo "$0: $what failed (exit $rc)" >&2; status=1; }
}

if (($# == 0)); then
  step "ruff format" .venv/bin/ruff format --check --quiet .
  step "ruff check" .venv/bin/ruff check --quiet .
  step "mypy --strict" .venv/bin/mypy
  step "import contracts" .venv/bin/lint-imports --no-cache
fi
step "pytest" as_root .venv/bin/python -m pytest "$@"
exit $status
