#!/usr/bin/env bash
# The README's first command: install cdiplug into .venv in this checkout and run `cdiplug demo`
# (the daemon on the built-in default, two fake FPGAs, against the kubelet stand-in; no cluster).
# Works as root and as a normal user (apt, for python3-venv where it is missing, goes through
# sudo then). Arguments go to `cdiplug demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib/venv.sh
source hack/lib/venv.sh

ensure_venv
.venv/bin/python -m pip install -q .
exec .venv/bin/cdiplug demo "$@"
