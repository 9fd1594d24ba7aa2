#!/usr/bin/env bash
# Regenerate the example CDI specs in cdi-specs/ exactly as cdiplug writes them.
#
#   hack/update-cdi-specs.sh [OUTPUT_DIR]     (default: cdi-specs/ of this checkout)
#
# tests/cdiplug/cdi/test_example_specs.py runs this into a temporary folder and fails when
# cdi-specs/ differs, so run it after changing anything that shapes a spec. PYTHON picks the
# interpreter that has cdiplug installed (default: python3).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$repo/cdi-specs}"
python="${PYTHON:-python3}"
mkdir -p "$out"
# Only cdiplug's own files are regenerated; drop the old ones so a removed example goes away.
find "$out" -maxdepth 1 -name 'cdiplug-*.json' -type f -delete

# The fake FPGA of the built-in default configuration (no --config), whatever the caller's
# environment says.
env -u CDIPLUG_CONFIG -u CDIPLUG_SYSFS_ROOT -u CDIPLUG_DEV_ROOT \
  "$python" -m cdiplug cdi generate --output-dir "$out" >/dev/null
