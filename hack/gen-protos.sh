#!/usr/bin/env bash
# Regenerates the gRPC stubs in cdiplug/api from the .proto files beside them.
# Usage: hack/gen-protos.sh [OUTPUT_DIR]   (default: cdiplug/api; the stale-stub test passes a temp dir)
# PYTHON: the interpreter with grpcio-tools (default python3; the test passes its own).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-cdiplug/api}
mkdir -p "$out"
protos=(deviceplugin_v1beta1 podresources_v1 dra_v1 dra_v1beta1 pluginregistration_v1 drahealth_v1alpha1 drahealth_v1beta1)
"${PYTHON:-python3}" -m grpc_tools.protoc -I cdiplug/api \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "${protos[@]/%/.proto}"
# grpc_tools writes absolute imports ("import x_pb2"); make them package-relative.
for p in "${protos[@]}"; do
  sed -i -E "s/^import (${p})_pb2 as/from . import \1_pb2 as/" "$out/${p}_pb2_grpc.py"
done
