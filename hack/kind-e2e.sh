#!/usr/bin/env bash
# End-to-end check of cdiplug on a throwaway kind cluster, for a machine with Docker, kind and
# kubectl. It
#   1. creates a one-node cluster whose containerd reads CDI specs,
#   2. builds the image from deploy/Containerfile and loads it into the node,
#   3. deploys deploy/overlays/fake (two fake FPGAs) and waits for it to be ready,
#   4. checks the node advertises example.com/fpga: 2,
#   5. runs deploy/examples: two pods Running with distinct devices, the third (asking for 3)
#      Pending with "Insufficient example.com/fpga",
#   6. restarts the kubelet and checks cdiplug registers again: the capacity comes back and a
#      new pod gets a device,
#   7. deletes the cluster (also on failure; --keep leaves it for a look).
#
# Usage: hack/kind-e2e.sh [--dry-run] [--keep] [--name CLUSTER]
#   --dry-run  print every command instead of running it (needs none of the tools)
#   --keep     do not delete the cluster at the end
#   --name     cluster name (default cdiplug-e2e)
set -euo pipefail

cd "$(dirname "$0")/.."

DRY_RUN=0
KEEP=0
CLUSTER=cdiplug-e2e
NAMESPACE=cdiplug-system
RESOURCE=example.com/fpga
TIMEOUT=180

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

while (($#)); do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --keep) KEEP=1 ;;
    --name)
      [[ $# -ge 2 ]] || { echo "kind-e2e: --name needs a value" >&2; exit 2; }
      CLUSTER=$2
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    *) echo "kind-e2e: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

NODE="${CLUSTER}-control-plane"
CONTEXT="kind-${CLUSTER}"
# The image the manifests name; building it under that name lets the manifests stay as they are.
IMAGE=$(sed -n 's/^ *image: *\(cdiplug:[^ ]*\) *$/\1/p' deploy/base/daemonset.yaml)
[[ -n "$IMAGE" ]] || { echo "kind-e2e: no cdiplug image in deploy/base/daemonset.yaml" >&2; exit 1; }

# Dry-run lines go to the real stdout even from inside $( ).
exec 3>&1

say() { printf '==> %s\n' "$*" >&3; }
fail() { printf 'kind-e2e: FAILED: %s\n' "$*" >&2; exit 1; }

# run CMD...: run it, or print it in dry-run mode.
run() {
  if ((DRY_RUN)); then
    printf '+ %s\n' "$(printf '%q ' "$@" | sed 's/ $//')" >&3
  else
    "$@"
  fi
}

# capture PLACEHOLDER CMD...: the command's output, or PLACEHOLDER in dry-run mode.
capture() {
  local placeholder=$1
  shift
  if ((DRY_RUN)); then
    run "$@"
    printf '%s\n' "$placeholder"
  else
    "$@"
  fi
}

k() { run kubectl --context "$CONTEXT" "$@"; }
kc() {
  local placeholder=$1
  shift
  capture "$placeholder" kubectl --context "$CONTEXT" "$@"
}

# wait_until DESCRIPTION FUNCTION: call FUNCTION until it succeeds, for at most $TIMEOUT seconds.
wait_until() {
  local what=$1 check=$2 deadline=$((SECONDS + TIMEOUT))
  say "waiting until $what"
  until "$check"; do
    ((DRY_RUN)) && return 0
    ((SECONDS < deadline)) || fail "$what: not after ${TIMEOUT}s"
    sleep 2
  done
}

allocatable() {
  kc 2 get node "$NODE" -o "jsonpath={.status.allocatable.${RESOURCE//./\\.}}"
}
has_two_fpgas() { [[ "$(allocatable)" == 2 ]]; }

pod_phase() { kc "$2" get pod "$1" -o 'jsonpath={.status.phase}'; }
pods_running() { [[ "$(pod_phase fpga-pod-1 Running)" == Running && "$(pod_phase fpga-pod-2 Running)" == Running ]]; }
pod1_running() { [[ "$(pod_phase fpga-pod-1 Running)" == Running ]]; }

# The daemon's own count, through the API server's pod proxy to its metrics port.
reregistered() {
  local metrics
  metrics=$(kc "cdiplug_reregistrations_total{resource=\"${RESOURCE}\"} 1.0" \
    get --raw "/api/v1/namespaces/${NAMESPACE}/pods/${pod}:9765/proxy/metrics")
  grep -qE "^cdiplug_reregistrations_total\\{resource=\"${RESOURCE}\"\\} [1-9]" <<<"$metrics"
}

greedy_unschedulable() {
  local message
  message=$(kc "0/1 nodes are available: 1 Insufficient ${RESOURCE}." get pod fpga-pod-greedy \
    -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}')
  [[ "$message" == *"Insufficient ${RESOURCE}"* ]]
}

cleanup() {
  local status=$?
  if ((status != 0)) && ((!DRY_RUN)); then
    echo "kind-e2e: state at failure:" >&2
    kubectl --context "$CONTEXT" get pods -A -o wide >&2 || true
    kubectl --context "$CONTEXT" -n "$NAMESPACE" logs ds/cdiplug --tail=50 >&2 || true
  fi
  if ((KEEP)); then
    say "keeping cluster $CLUSTER (kind delete cluster --name $CLUSTER)"
  else
    say "deleting cluster $CLUSTER"
    run kind delete cluster --name "$CLUSTER" || true
  fi
  exit "$status"
}

if ((!DRY_RUN)); then
  for tool in docker kind kubectl; do
    command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is needed (or use --dry-run)" >&2; exit 2; }
  done
fi

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"; cleanup' EXIT
# containerd 2.x reads CDI specs by default; 1.7 (older kind node images) needs enable_cdi.
cat >"$workdir/kind.yaml" <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
containerdConfigPatches:
  - |-
    [plugins."io.containerd.grpc.v1.cri"]
      enable_cdi = true
nodes:
  - role: control-plane
EOF

say "1. creating cluster $CLUSTER"
run kind create cluster --name "$CLUSTER" --config "$workdir/kind.yaml" --wait 120s
# A single-node cluster has to run the example pods on its control plane.
k taint nodes "$NODE" node-role.kubernetes.io/control-plane:NoSchedule- || true

say "2. building $IMAGE and loading it into the node"
run docker build -f deploy/Containerfile -t "$IMAGE" .
run kind load docker-image "$IMAGE" --name "$CLUSTER"

say "3. deploying deploy/overlays/fake"
k apply -k deploy/overlays/fake
k -n "$NAMESPACE" rollout status ds/cdiplug --timeout="${TIMEOUT}s"

say "4. the node advertises $RESOURCE: 2"
wait_until "node $NODE has $RESOURCE: 2" has_two_fpgas
run docker exec "$NODE" cat /var/run/cdi/cdiplug-example.com-fpga.json

say "5. the classic experiment: deploy/examples"
k apply -k deploy/examples
wait_until "fpga-pod-1 and fpga-pod-2 run" pods_running
first=$(kc fpga-0 exec fpga-pod-1 -- printenv FAKE_FPGA_DEVICES)
second=$(kc fpga-1 exec fpga-pod-2 -- printenv FAKE_FPGA_DEVICES)
[[ -n "$first" && -n "$second" && "$first" != "$second" ]] || fail "pods share a device: '$first' and '$second'"
say "fpga-pod-1 got $first, fpga-pod-2 got $second"
wait_until "fpga-pod-greedy is Pending with Insufficient $RESOURCE" greedy_unschedulable
[[ "$(pod_phase fpga-pod-greedy Pending)" == Pending ]] || fail "fpga-pod-greedy is not Pending"

say "6. restarting the kubelet: cdiplug must register again"
pod=$(kc cdiplug-abcde -n "$NAMESPACE" get pods -l app.kubernetes.io/name=cdiplug -o 'jsonpath={.items[0].metadata.name}')
run docker exec "$NODE" systemctl restart kubelet
wait_until "cdiplug registered $RESOURCE again" reregistered
wait_until "node $NODE has $RESOURCE: 2 again" has_two_fpgas
k -n "$NAMESPACE" rollout status ds/cdiplug --timeout="${TIMEOUT}s"
# A new allocation after the restart goes through the re-registered plugin.
k delete pod fpga-pod-1 --wait=true
k apply -f deploy/examples/fpga-pod-1.yaml
wait_until "a new fpga-pod-1 runs" pod1_running
again=$(kc fpga-0 exec fpga-pod-1 -- printenv FAKE_FPGA_DEVICES)
[[ -n "$again" && "$again" != "$second" ]] || fail "the new pod got '$again', fpga-pod-2 holds '$second'"

say "7. all checks passed"
