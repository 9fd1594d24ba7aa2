#!/usr/bin/env bash
# Regenerates the gRPC stubs in cdiplug/api from the .proto files beside them.
# Usage: hack/gen-protos.sh [OUTPUT_DIR]   (default: cdiplug/api; the stale-stub test passes a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-cdiplug/api}
mkdir -p "$out"
python -m grpc_tools.protoc -I cdiplug/api \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  cdiplug/api/deviceplugin_v1beta1.proto cdiplug/api/podresources_v1.proto
# grpc_tools writes absolute imports ("import x_pb2"); make them package-relative.
sed -i -E 's/^import (deviceplugin_v1beta1|podresources_v1)_pb2 as/from . import \1_pb2 as/' \
  "$out"/deviceplugin_v1beta1_pb2_grpc.py "$out"/podresources_v1_pb2_grpc.py
