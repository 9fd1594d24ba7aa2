#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, for cdiplug's cluster tests and by hand:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (CDI on) and a kubelet
# registered with the API server. The control plane listens on 127.0.0.1 only; the kubelet serves
# on the node's address (x509 clients only). Root, no systemd: every process is started here,
# detached, with its PID, log and configuration under one state folder.
#
#   hack/local-cluster.sh up              start what is not running, wait for the node to be Ready
#   hack/local-cluster.sh up --runtime cri-o   the one node on CRI-O instead of containerd (in its
#                                         own mount namespace, as a node of the multi-node cluster)
#   hack/local-cluster.sh up --nodes N|FILE    a multi-node cluster: N >= 3 nodes of the built-in
#                                         hack/nodes/default.yaml (node-c on CRI-O), or the nodes
#                                         FILE lists (name, runtime, labels, cdiplug config); each
#                                         node a kubelet and its runtime in its own mount
#                                         namespace, with its own address 127.0.0.N and bridge
#                                         (hack/lib/multinode.sh, hack/README.md)
#   hack/local-cluster.sh down [--purge]  stop every process it started (by PID), unmount what the
#                                         node mounted; --purge also deletes the state folder
#   hack/local-cluster.sh status          each component's PID, the node
#   hack/local-cluster.sh logs [NAME] [-n N]   the last N (default 40) lines of each log
#   hack/local-cluster.sh env             KUBECONFIG=... and the other paths, for eval/export
#   hack/local-cluster.sh images          build the cdiplug image from this tree (deploy/Containerfile
#                                         on a Debian base made with debootstrap) and import it
#   hack/local-cluster.sh start|stop NAME one component (etcd kube-apiserver kube-controller-manager
#                                         kube-scheduler containerd kubelet; on a multi-node
#                                         cluster NODE.kubelet, NODE.containerd, NODE.crio)
#
# Settings (environment):
#   CDIPLUG_CLUSTER_DIR  state folder (default /var/tmp/cdiplug-cluster)
#   CDIPLUG_K8S_BIN      folder with kubelet, kube-apiserver, kube-controller-manager,
#                        kube-scheduler, containerd, containerd-shim-runc-v2, ctr; default: the kit
#                        ../shared/k8s/kubernetes-*.tar.xz beside the repository, checked against its
#                        SHA256SUMS and unpacked once into the cache
#   CDIPLUG_K8S_KIT      where the kit lies (default ../shared/k8s beside the repository)
#   CDIPLUG_K8S_CACHE    cache folder: unpacked kit, Debian rootfs, podman storage
#                        (default /var/tmp/cdiplug-cache)
#   CDIPLUG_NODE_IP      the node's address (default: the source address of the default route)
#   CDIPLUG_POD_CIDR     the bridge network's subnet (default 10.244.0.0/24)
#   CDIPLUG_KUBELET_V    kubelet log level (default 2; 4 shows each Allocate)
#   CDIPLUG_DEBIAN_MIRROR, CDIPLUG_DEBIAN_SUITE   for debootstrap (deb.debian.org, bookworm)
#   CDIPLUG_UP_TIMEOUT   seconds `up` waits for the node to be Ready (default 120)
#
# The kubelet runs with --root-dir /var/lib/kubelet (the usual device-plugin, PodResources and
# DRA paths). Pods get a network from Debian's containernetworking-plugins (a bridge, no NAT):
# the node is Ready and pods need no hostNetwork. No kube-proxy runs; the one Service pods need,
# the API server's (kubernetes.default, 10.96.0.1:443), is one DNAT rule to 127.0.0.1:6443 for
# the bridge's subnet (see service_route_up), so in-cluster clients work as on a real node. The
# API server itself reaches a Service (an admission webhook's) at its endpoints' addresses
# (--enable-aggregator-routing), which the host routes to on the bridge or its own network.
# No registry is needed: the pause image, a busybox
# image (Debian's busybox-static, tagged busybox:1.36 as deploy/examples uses it) and the cdiplug
# image are made locally with podman and imported into containerd's k8s.io namespace.
# Details and the facts behind each setting: hack/README.md.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${CDIPLUG_CLUSTER_DIR:-/var/tmp/cdiplug-cluster}
CACHE=${CDIPLUG_K8S_CACHE:-/var/tmp/cdiplug-cache}
KIT_DIR=${CDIPLUG_K8S_KIT:-$REPO/../shared/k8s}
KUBELET_ROOT=/var/lib/kubelet
POD_CIDR=${CDIPLUG_POD_CIDR:-10.244.0.0/24}
SERVICE_CIDR=10.96.0.0/24
SERVICE_IP=10.96.0.1
BRIDGE=cdiplug0
UP_TIMEOUT=${CDIPLUG_UP_TIMEOUT:-120}
DEBIAN_MIRROR=${CDIPLUG_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SUITE=${CDIPLUG_DEBIAN_SUITE:-bookworm}

PKI=$STATE/pki
RUN=$STATE/run
LOGS=$STATE/logs
CTR_DIR=$STATE/containerd
CTR_SOCK=$CTR_DIR/containerd.sock
KUBECONFIG_FILE=$STATE/kubeconfig
APISERVER=https://127.0.0.1:6443

PAUSE_IMAGE=localhost/cdiplug/pause:local
BUSYBOX_IMAGE=docker.io/library/busybox:1.36
BASE_IMAGE=localhost/cdiplug/debian-python3:$DEBIAN_SUITE
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet)
# shellcheck source=hack/lib/multinode.sh
source "$REPO/hack/lib/multinode.sh"

say() { printf 'local-cluster: %s\n' "$*" >&2; }
die() { printf 'local-cluster: ERROR: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

need_root() { [[ $(id -u) -eq 0 ]] || die "run as root (the kubelet and containerd need it)"; }

need_tool() {
  command -v "$1" >/dev/null || die "$1 is missing (apt-get install $2)"
}

# wait_until SECONDS WHAT CMD...: run CMD every 0.2 s until it succeeds. Used where nothing can be
# awaited as an event (a port that starts answering, a socket that appears).
wait_until() {
  local timeout=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $what (logs: $0 logs)"
    sleep 0.2
  done
}

# --- binaries -------------------------------------------------------------------------------

BIN=""
resolve_bin() {
  if [[ -n ${CDIPLUG_K8S_BIN:-} ]]; then
    BIN=$(cd "$CDIPLUG_K8S_BIN" && pwd)
  else
    local sums=$KIT_DIR/SHA256SUMS archive sum
    [[ -f $sums ]] || die "no kit at $KIT_DIR (set CDIPLUG_K8S_BIN to a folder with the binaries)"
    read -r sum archive <"$sums"
    [[ -f $KIT_DIR/$archive ]] || die "$KIT_DIR/$archive is missing"
    BIN=$CACHE/k8s-${sum:0:16}
    if [[ ! -f $BIN/.unpacked ]]; then
      say "checking and unpacking $archive into $BIN (once)"
      (cd "$KIT_DIR" && sha256sum --check --quiet SHA256SUMS) || die "$archive does not match $sums"
      rm -rf "$BIN.tmp" && mkdir -p "$BIN.tmp"
      tar -xJf "$KIT_DIR/$archive" -C "$BIN.tmp"
      touch "$BIN.tmp/.unpacked"
      rm -rf "$BIN" && mv "$BIN.tmp" "$BIN"
    fi
  fi
  local b
  for b in kubelet kube-apiserver kube-controller-manager kube-scheduler containerd containerd-shim-runc-v2 ctr; do
    [[ -x $BIN/$b ]] || die "$BIN/$b is missing"
  done
}

exe_of() {
  case $1 in
    etcd) command -v etcd ;;
    *) echo "$BIN/$1" ;;
  esac
}

# --- processes ------------------------------------------------------------------------------

# pid NAME: the PID of the running component, or nothing. The PID file holds the PID and the
# executable; a PID reused by another program does not count.
pid_of() {
  local file=$RUN/$1.pid pid exe
  [[ -f $file ]] || return 0
  { read -r pid; read -r exe; } <"$file" || return 0
  if [[ -n $pid && $(readlink -f "/proc/$pid/exe" 2>/dev/null) == "$exe" ]]; then
    echo "$pid"
  fi
}

# launch NAME ARGS...: start the component detached (own session, survives the caller).
launch() {
  local name=$1 exe
  shift
  exe=$(readlink -f "$(exe_of "$name")")
  mkdir -p "$RUN" "$LOGS"
  printf '\n==== %s started %s\n' "$name" "$(date -u +%FT%TZ)" >>"$LOGS/$name.log"
  PATH="$BIN:$PATH" setsid "$exe" "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  printf '%s\n%s\n' "$!" "$exe" >"$RUN/$name.pid"
}

# stop_components SECONDS NAME...: SIGTERM to each, then SIGKILL to those still running after
# SECONDS.
stop_components() {
  local grace=$1 name pid pids=()
  shift
  for name in "$@"; do
    pid=$(pid_of "$name")
    if [[ -n $pid ]]; then
      say "stopping $name (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$RUN/$name.pid"
  done
  for pid in "${pids[@]}"; do
    if ! timeout "$grace" tail --pid="$pid" -s 0.1 -f /dev/null; then
      say "pid $pid did not stop in ${grace}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      timeout 10 tail --pid="$pid" -s 0.1 -f /dev/null || true
    fi
  done
}

alive_or_die() {
  [[ -n $(pid_of "$1") ]] || { tail -n 30 "$LOGS/$1.log" >&2 || true; die "$1 exited (log: $LOGS/$1.log)"; }
}

port_free() {
  ! ss -Htln "sport = :$1" | grep -q .
}

check_port() {
  port_free "$1" || die "port $1 is in use by another program (ss -tlnp 'sport = :$1'); $2 needs it"
}

# --- configuration, made once ----------------------------------------------------------------

NODE_IP=""
NODE_NAME=""
node_facts() {
  NODE_NAME=$(hostname | tr '[:upper:]' '[:lower:]')
  NODE_IP=${CDIPLUG_NODE_IP:-}
  if [[ -z $NODE_IP ]]; then
    NODE_IP=$(ip -4 route get 1.0.0.0 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n 1)
  fi
  [[ -n $NODE_IP ]] || die "no default route to take the node's address from: set CDIPLUG_NODE_IP to an address of this machine (not 127.0.0.1: the kubelet refuses a loopback node address)"
}

# cert NAME CN [O] [SAN]: a key and a certificate signed by the cluster CA.
cert() {
  local name=$1 cn=$2 org=${3:-} san=${4:-} subj ext
  subj="/CN=$cn"
  [[ -n $org ]] && subj="/O=$org$subj"
  ext=$PKI/$name.ext
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ -n $san ]]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$ext"
}

make_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  if [[ ! -f $PKI/ca.crt ]]; then
    say "making the CA, service-account keys and the admin token in $PKI"
    openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=cdiplug-local-cluster-ca" -days 3650 -sha256 -out "$PKI/ca.crt"
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    printf '%s,admin,admin,"system:masters"\n' "$(openssl rand -hex 24)" >"$PKI/tokens.csv"
    rm -f "$PKI/node"
  fi
  # Certificates naming the node are made again when its name or address changes.
  if [[ $(cat "$PKI/node" 2>/dev/null) != "$NODE_NAME $NODE_IP" ]]; then
    cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:$SERVICE_IP,IP:$NODE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert kubelet "system:node:$NODE_NAME" system:nodes "IP:$NODE_IP,IP:127.0.0.1,DNS:$NODE_NAME,DNS:localhost"
    echo "$NODE_NAME $NODE_IP" >"$PKI/node"
  fi
  local token
  token=$(cut -d, -f1 "$PKI/tokens.csv")
  cat >"$KUBECONFIG_FILE.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: local
    cluster:
      server: $APISERVER
      certificate-authority: $PKI/ca.crt
users:
  - name: admin
    user:
      token: $token
contexts:
  - name: local
    context: {cluster: local, user: admin}
current-context: local
EOF
  chmod 600 "$KUBECONFIG_FILE.tmp"
  mv "$KUBECONFIG_FILE.tmp" "$KUBECONFIG_FILE"
}

write_configs() {
  mkdir -p "$CTR_DIR" "$STATE/cni/net.d" "$STATE/cni/ipam" "$STATE/kubelet"
  cat >"$CTR_DIR/config.toml" <<EOF
# Written by hack/local-cluster.sh.
version = 3
root = '$CTR_DIR/root'
state = '$CTR_DIR/state'

[grpc]
  address = '$CTR_SOCK'

[ttrpc]
  address = '$CTR_SOCK.ttrpc'

[plugins.'io.containerd.internal.v1.opt']
  path = '$CTR_DIR/opt'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '$PAUSE_IMAGE'

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
  # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails in runc with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '$(command -v runc)'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$CNI_BIN_DIR']
    conf_dir = '$STATE/cni/net.d'

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
EOF

  cat >"$STATE/cni/net.d/10-cdiplug.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cdiplug-local",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni/ipam"
      }
    }
  ]
}
EOF

  cat >"$STATE/kubelet/config.yaml" <<EOF
# Written by hack/local-cluster.sh.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$CTR_SOCK
# Hybrid cgroups (v1) without systemd: refused by default since 1.35.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
# Report a changed node status (device health, capacity) within 2 s, not 10.
nodeStatusUpdateFrequency: 2s
# Nothing can be pulled again here: never collect images, never evict for a fuller disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
EOF
}

CNI_BIN_DIR=""
check_tools() {
  need_root
  need_tool openssl openssl
  need_tool etcd etcd-server
  need_tool runc runc
  need_tool ss iproute2
  need_tool kubectl "kubectl (a release binary: dl.k8s.io)"
  local d
  for d in /usr/lib/cni /opt/cni/bin; do
    if [[ -x $d/bridge && -x $d/host-local && -x $d/loopback ]]; then CNI_BIN_DIR=$d; break; fi
  done
  [[ -n $CNI_BIN_DIR ]] || die "no CNI plugins in /usr/lib/cni or /opt/cni/bin (apt-get install containernetworking-plugins)"
}

kc() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# ctr on our containerd; its cgroup v1 deprecation warning on every call is left out.
ctr_() {
  local rc=0
  "$BIN/ctr" --address "$CTR_SOCK" "$@" 2>"$CTR_DIR/ctr.err" || rc=$?
  grep -v 'DEPRECATION: The support for cgroup v1' "$CTR_DIR/ctr.err" >&2 || true
  return $rc
}

apiserver_ready() {
  curl -sf --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(cut -d, -f1 "$PKI/tokens.csv")" "$APISERVER/readyz" >/dev/null
}

# --- the components --------------------------------------------------------------------------

start_etcd() {
  [[ -z $(pid_of etcd) ]] || return 0
  check_port 2379 etcd
  check_port 2380 etcd
  say "starting etcd"
  mkdir -p "$STATE/etcd"
  launch etcd --name local --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster local=http://127.0.0.1:2380 --logger zap --log-outputs stderr
  wait_until 30 "etcd to answer" curl -sf http://127.0.0.1:2379/health
}

start_kube_apiserver() {
  [[ -z $(pid_of kube-apiserver) ]] || return 0
  check_port 6443 kube-apiserver
  say "starting kube-apiserver"
  launch kube-apiserver \
    --etcd-servers http://127.0.0.1:2379 \
    --bind-address 127.0.0.1 --secure-port 6443 --advertise-address "$NODE_IP" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
    --authorization-mode AlwaysAllow --allow-privileged=true \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --endpoint-reconciler-type none \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --enable-aggregator-routing=true \
    --profiling=false
  wait_until 60 "kube-apiserver to be ready" apiserver_ready
}

start_kube_controller_manager() {
  [[ -z $(pid_of kube-controller-manager) ]] || return 0
  check_port 10257 kube-controller-manager
  say "starting kube-controller-manager"
  # One node: no node-lifecycle-controller: it would taint the node and evict every pod whenever
  # the kubelet is down for a while (a restart test, `down` then `up`). Several nodes: on, with a
  # 20 s grace period (a stopped kubelet's node turns NotReady, new pods go elsewhere; pods are
  # evicted only after 300 s NotReady).
  local controllers='*,-node-lifecycle-controller,-cloud-node-lifecycle-controller,-node-ipam-controller,-node-route-controller,-service-lb-controller'
  local extra=()
  if multi; then
    controllers='*,-cloud-node-lifecycle-controller,-node-ipam-controller,-node-route-controller,-service-lb-controller'
    extra=(--node-monitor-grace-period 20s)
  fi
  launch kube-controller-manager \
    --kubeconfig "$KUBECONFIG_FILE" --bind-address 127.0.0.1 --secure-port 10257 \
    --leader-elect=false --use-service-account-credentials=false \
    --controllers "$controllers" "${extra[@]}" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --profiling=false
}

start_kube_scheduler() {
  [[ -z $(pid_of kube-scheduler) ]] || return 0
  check_port 10259 kube-scheduler
  say "starting kube-scheduler"
  if multi; then
    # deploy/scheduler's profiles (default-scheduler and cdiplug-device-first), with this
    # cluster's kubeconfig.
    sed -e "s|^  kubeconfig: .*|  kubeconfig: $KUBECONFIG_FILE|" "$MN_SCHED_CONFIG" >"$STATE/kube-scheduler-config.yaml"
    printf 'leaderElection:\n  leaderElect: false\n' >>"$STATE/kube-scheduler-config.yaml"
    launch kube-scheduler --config "$STATE/kube-scheduler-config.yaml" --bind-address 127.0.0.1 --secure-port 10259 \
      --profiling=false
  else
    launch kube-scheduler --kubeconfig "$KUBECONFIG_FILE" --bind-address 127.0.0.1 --secure-port 10259 \
      --leader-elect=false --profiling=false
  fi
}

# containerd keeps each pod's network namespace as a bind mount in /run/netns, which must be a
# shared mount point. Left to containerd, the bind of /run/netns onto itself can come after some
# namespaces are mounted, hiding them: they can then never be unmounted, and those pods never
# terminate ("remove netns: unlinkat ...: device or resource busy"). So it is made here, first,
# as `ip netns add` does.
prepare_netns_dir() {
  mkdir -p /run/netns
  if ! mountpoint -q /run/netns; then
    mount --rbind /run/netns /run/netns
  fi
  mount --make-rshared /run/netns
}

start_containerd() {
  [[ -z $(pid_of containerd) ]] || return 0
  prepare_netns_dir
  say "starting containerd"
  launch containerd --config "$CTR_DIR/config.toml"
  wait_until 30 "containerd to answer" ctr_ version
}

start_kubelet() {
  [[ -z $(pid_of kubelet) ]] || return 0
  check_port 10250 kubelet
  say "starting kubelet"
  mkdir -p "$KUBELET_ROOT"
  launch kubelet --config "$STATE/kubelet/config.yaml" --kubeconfig "$KUBECONFIG_FILE" \
    --root-dir "$KUBELET_ROOT" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
    --v "${CDIPLUG_KUBELET_V:-2}"
}

start_one() {
  case $1 in
    etcd) start_etcd ;;
    kube-apiserver) start_kube_apiserver ;;
    kube-controller-manager) start_kube_controller_manager ;;
    kube-scheduler) start_kube_scheduler ;;
    containerd) start_containerd ;;
    kubelet) start_kubelet ;;
    *) die "unknown component $1 (one of: ${COMPONENTS[*]})" ;;
  esac
}

# --- images ----------------------------------------------------------------------------------

# Podman with its own configuration and storage in the cache: runc (crun fails on hybrid cgroups
# here), cgroupfs, ulimits within the hard limits, overlay storage (vfs where the cache lies on
# overlayfs).
podman_env() {
  need_tool podman podman
  local dir=$CACHE/podman driver=overlay
  [[ $(findmnt -no FSTYPE -T "$CACHE" 2>/dev/null) == overlay ]] && driver=vfs
  mkdir -p "$dir/storage" "$dir/run" "$dir/tmp"
  cat >"$dir/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$dir/events.log"
tmp_dir = "$dir/tmp"
EOF
  cat >"$dir/storage.conf" <<EOF
[storage]
driver = "$driver"
graphroot = "$dir/storage"
runroot = "$dir/run"
EOF
  export CONTAINERS_CONF=$dir/containers.conf CONTAINERS_STORAGE_CONF=$dir/storage.conf
}

# busybox_rootfs DIR: Debian's static busybox with every applet linked.
busybox_rootfs() {
  local root=$1 busybox=/bin/busybox applet
  if ! [[ -x $busybox ]] || ! "$busybox" --list >/dev/null 2>&1; then
    die "$busybox is missing (apt-get install busybox-static)"
  fi
  mkdir -p "$root/bin" "$root/dev" "$root/proc" "$root/sys" "$root/etc" "$root/tmp" "$root/mnt"
  cp "$busybox" "$root/bin/busybox"
  while read -r applet; do
    [[ $applet == busybox ]] || ln -sf busybox "$root/bin/$applet"
  done < <("$busybox" --list)
}

# test_images: pause and busybox in podman (made once).
test_images() {
  podman_env
  local tmp
  if ! podman image exists "$BUSYBOX_IMAGE"; then
    say "making $BUSYBOX_IMAGE from /bin/busybox"
    tmp=$(mktemp -d)
    busybox_rootfs "$tmp/root"
    tar -C "$tmp/root" -cf "$tmp/rootfs.tar" .
    podman import --quiet --change 'CMD ["sh"]' "$tmp/rootfs.tar" "$BUSYBOX_IMAGE" >/dev/null
    rm -rf "$tmp"
  fi
  # The sandbox's process, /pause: sleeps until it is told to stop. CRI-O runs it by that path
  # (pause_command), containerd as the entrypoint. Images made before it had /pause are made again.
  if [[ $(podman image inspect --format '{{index .Config.Labels "cdiplug.pause"}}' "$PAUSE_IMAGE" 2>/dev/null) != 2 ]]; then
    say "making $PAUSE_IMAGE"
    podman rmi --force "$PAUSE_IMAGE" >/dev/null 2>&1 || true
    tmp=$(mktemp -d)
    mkdir -p "$tmp/root/bin"
    cp /bin/busybox "$tmp/root/bin/busybox"
    ln -s busybox "$tmp/root/bin/sh"
    ln -s busybox "$tmp/root/bin/sleep"
    printf '#!/bin/sh\ntrap "exit 0" TERM INT\nwhile :; do sleep 86400 & wait; done\n' >"$tmp/root/pause"
    chmod 755 "$tmp/root/pause"
    tar -C "$tmp/root" -cf "$tmp/rootfs.tar" .
    podman import --quiet --change 'ENTRYPOINT ["/pause"]' --change 'LABEL cdiplug.pause=2' \
      "$tmp/rootfs.tar" "$PAUSE_IMAGE" >/dev/null
    rm -rf "$tmp"
  fi
}

# import_image NAME: into containerd's k8s.io namespace unless the same podman image is there.
import_image() {
  local name=$1 id stamp
  id=$(podman image inspect --format '{{.Id}}' "$name")
  stamp=$CTR_DIR/imported/$(printf '%s' "$name" | tr '/:' '__')
  if [[ $(cat "$stamp" 2>/dev/null) == "$id" ]] &&
    ctr_ -n k8s.io images ls -q "name==$name" | grep -qx "$name"; then
    return 0
  fi
  say "importing $name into containerd"
  mkdir -p "$CTR_DIR/imported"
  podman save --quiet --format docker-archive "$name" |
    ctr_ -n k8s.io images import --local - >/dev/null
  ctr_ -n k8s.io images ls -q "name==$name" | grep -qx "$name" ||
    die "$name is not in containerd after the import"
  echo "$id" >"$stamp"
}

# base_image: Debian (debootstrap minbase) with python3, venv and libudev1, imported into podman.
# The host's CA bundle goes in too, so pip in the build trusts what the host trusts (a proxy).
base_image() {
  podman_env
  local tar=$CACHE/images/debian-$DEBIAN_SUITE-minbase-python3.tar tmp
  if [[ ! -f $tar ]]; then
    need_tool debootstrap debootstrap
    say "debootstrap --variant=minbase $DEBIAN_SUITE with python3 (once, about a minute)"
    mkdir -p "$CACHE/images"
    tmp=$(mktemp -d "$CACHE/images/rootfs.XXXXXX")
    debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,libudev1,ca-certificates \
      "$DEBIAN_SUITE" "$tmp/root" "$DEBIAN_MIRROR" >"$tmp/debootstrap.log" 2>&1 ||
      { tail -n 20 "$tmp/debootstrap.log" >&2; rm -rf "$tmp"; die "debootstrap failed"; }
    rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"* "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man"
    tar -C "$tmp/root" -cf "$tar.tmp" .
    rm -rf "$tmp"
    mv "$tar.tmp" "$tar"
    podman rmi --force "$BASE_IMAGE" >/dev/null 2>&1 || true
  fi
  if ! podman image exists "$BASE_IMAGE"; then
    say "importing the Debian base as $BASE_IMAGE"
    tmp=$(mktemp -d)
    mkdir -p "$tmp/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$tmp/etc/ssl/certs/ca-certificates.crt"
    cp "$tar" "$tmp/rootfs.tar"
    tar --delete -f "$tmp/rootfs.tar" ./etc/ssl/certs/ca-certificates.crt
    tar -C "$tmp" -rf "$tmp/rootfs.tar" ./etc/ssl/certs/ca-certificates.crt
    podman import --quiet --change 'CMD ["python3"]' \
      --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' "$tmp/rootfs.tar" "$BASE_IMAGE" >/dev/null
    rm -rf "$tmp"
  fi
}

# The name deploy/base/daemonset.yaml gives the image (cdiplug:0.1.0), as containerd spells it.
cdiplug_image() {
  local image
  image=$(sed -n 's/^ *image: *\(cdiplug:[^ ]*\) *$/\1/p' "$REPO/deploy/base/daemonset.yaml")
  [[ -n $image ]] || die "no cdiplug image in deploy/base/daemonset.yaml"
  echo "docker.io/library/$image"
}

# build_cdiplug_image IMAGE: deploy/Containerfile on the Debian base, in podman (layers cached).
build_cdiplug_image() {
  local image=$1
  base_image
  say "building $image from $REPO (deploy/Containerfile)"
  mkdir -p "$CACHE/images"
  podman build --network host --layers -f "$REPO/deploy/Containerfile" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$image" "$REPO" >"$CACHE/images/build.log" 2>&1 ||
    { tail -n 40 "$CACHE/images/build.log" >&2; die "podman build failed (log: $CACHE/images/build.log)"; }
  # Intermediate layers are the build cache: only old ones go.
  podman image prune --force --filter until=72h >/dev/null 2>&1 || true
}

# images [TAG]: the image built and imported into every node; TAG (another tag of the same
# build, for a rolling update) instead of deploy/base's.
cmd_images() {
  need_root
  resolve_bin
  local image
  image=$(cdiplug_image)
  if [[ -n ${1:-} ]]; then image=${image%:*}:$1; fi
  if multi; then
    if grep -q ' cri-o ' "$MN_FILE"; then resolve_crio; fi
    cmd_images_multi "$image"
    return
  fi
  [[ -n $(pid_of containerd) ]] || die "containerd is not running: $0 up"
  build_cdiplug_image "$image"
  test_images
  import_image "$PAUSE_IMAGE"
  import_image "$BUSYBOX_IMAGE"
  import_image "$image"
}

# --- commands --------------------------------------------------------------------------------

# The kubernetes Service for pods, as kube-proxy would route it: packets from the pod subnet to
# $SERVICE_IP:443 go to the API server on 127.0.0.1:6443 (it listens on loopback only). DNAT to
# loopback needs route_localnet on the interface they arrive on; it is set on our bridge alone
# (made here, before the CNI plugin would make it) so no other interface can reach 127.0.0.0/8.
SERVICE_RULE=(-s "$POD_CIDR" -d "$SERVICE_IP" -p tcp --dport 443 -m comment --comment cdiplug-local-cluster
  -j DNAT --to-destination 127.0.0.1:6443)
service_route_up() {
  need_tool iptables iptables
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
  iptables -t nat -C PREROUTING "${SERVICE_RULE[@]}" 2>/dev/null || iptables -t nat -A PREROUTING "${SERVICE_RULE[@]}"
}

service_route_down() {
  while iptables -t nat -D PREROUTING "${SERVICE_RULE[@]}" 2>/dev/null; do :; done
}

cmd_up() {
  check_tools
  resolve_bin
  node_facts
  mkdir -p "$STATE" "$RUN" "$LOGS"
  # After a multi-node cluster: a new cluster, without the old one's nodes and pods.
  if [[ -f $STATE/cluster && $(cat "$STATE/cluster") != one-node ]]; then
    [[ -z $(pid_of kube-apiserver) ]] || die "a multi-node cluster is up: $0 down first"
    rm -rf "$STATE/etcd"
  fi
  echo one-node >"$STATE/cluster"
  make_pki
  write_configs
  start_etcd
  start_kube_apiserver
  start_kube_controller_manager
  start_kube_scheduler
  service_route_up
  start_containerd
  # The sandbox image must be there before the kubelet starts pods.
  test_images
  import_image "$PAUSE_IMAGE"
  import_image "$BUSYBOX_IMAGE"
  start_kubelet
  kc wait --for=create "node/$NODE_NAME" --timeout "${UP_TIMEOUT}s" >/dev/null ||
    { alive_or_die kubelet; die "node $NODE_NAME did not register"; }
  # The kubelet registers the node with the not-ready taint, which only the node-lifecycle
  # controller (left out, see above) would take away.
  if kc get node "$NODE_NAME" -o jsonpath='{.spec.taints[*].key}' | grep -qw node.kubernetes.io/not-ready; then
    kc taint node "$NODE_NAME" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  fi
  kc wait --for=condition=Ready "node/$NODE_NAME" --timeout "${UP_TIMEOUT}s" >/dev/null ||
    { alive_or_die kubelet; die "node $NODE_NAME is not Ready after ${UP_TIMEOUT}s (logs: $0 logs)"; }
  kc wait --for=create serviceaccount/default --timeout 60s >/dev/null ||
    die "no default ServiceAccount (kube-controller-manager: $LOGS/kube-controller-manager.log)"
  local c
  for c in "${COMPONENTS[@]}"; do alive_or_die "$c"; done
  say "node $NODE_NAME is Ready; export KUBECONFIG=$KUBECONFIG_FILE"
}

# Kill every container's task (so shims exit and unmount their root filesystems).
kill_containers() {
  [[ -n $(pid_of containerd) ]] || return 0
  local id
  for id in $(ctr_ -n k8s.io tasks ls -q 2>/dev/null); do
    ctr_ -n k8s.io tasks kill --signal SIGKILL --all "$id" >/dev/null 2>&1 || true
  done
  for id in $(ctr_ -n k8s.io tasks ls -q 2>/dev/null); do
    ctr_ -n k8s.io tasks delete --force "$id" >/dev/null 2>&1 || true
  done
}

# The shims our containerd started that are still running: the kit's shim binary, given our
# containerd's socket (another containerd on this machine may run the same binary).
shim_pids() {
  local p exe shim
  shim=$(readlink -f "$BIN/containerd-shim-runc-v2")
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    [[ $exe == "$shim" ]] || continue
    tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qxF "$CTR_SOCK" && echo "${p#/proc/}"
  done
  return 0
}

# Mount points under the kubelet root and the state folder, and the pods' network namespaces
# (containerd's cni-*), deepest first.
our_mounts() {
  awk '{print $5}' /proc/self/mountinfo | sed 's/\\040/ /g' |
    grep -E "^(($KUBELET_ROOT|$STATE)(/|$)|/run/netns/cni-[^/]+$)" |
    awk '{print length, $0}' | sort -rn | cut -d' ' -f2- || true
}

unmount_ours() {
  local m n=0
  while read -r m; do
    [[ -n $m ]] || continue
    if umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; then n=$((n + 1)); fi
  done < <(our_mounts)
  ((n == 0)) || say "unmounted $n mount points"
}

cmd_down() {
  need_root
  local purge=0
  [[ ${1:-} == --purge ]] && purge=1
  if multi; then
    cmd_down_multi "$purge"
    return
  fi
  if [[ -d $STATE ]]; then
    resolve_bin
    stop_components 15 kubelet kube-scheduler kube-controller-manager
    kill_containers
    stop_components 15 containerd
    local pid
    for pid in $(shim_pids); do
      say "stopping $(readlink "/proc/$pid/exe" 2>/dev/null) (pid $pid)"
      kill -KILL "$pid" 2>/dev/null || true
    done
    stop_components 15 kube-apiserver
    stop_components 15 etcd
  fi
  unmount_ours
  # A namespace mount hidden under a later bind of /run/netns (see prepare_netns_dir) is reached
  # once that bind is gone.
  if [[ -n $(our_mounts) ]] && mountpoint -q /run/netns; then
    umount -l /run/netns
    unmount_ours
  fi
  local left
  left=$(our_mounts)
  [[ -z $left ]] || say "still mounted: $(echo "$left" | tr '\n' ' ')"
  rm -f /run/netns/cni-* 2>/dev/null || true
  # The shared bind of /run/netns onto itself goes too, unless something else (ip netns, another
  # runtime) keeps a namespace there.
  if [[ -d /run/netns && -z $(ls -A /run/netns) ]] && mountpoint -q /run/netns; then
    umount /run/netns 2>/dev/null || true
  fi
  service_route_down
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$STATE/cni/ipam"
  if ((purge)); then
    say "deleting $STATE"
    rm -rf "$STATE"
  fi
  say "down"
}

cmd_status() {
  local c pid rc=0
  if multi; then
    cmd_status_multi
    return
  fi
  for c in "${COMPONENTS[@]}"; do
    pid=$(pid_of "$c")
    if [[ -n $pid ]]; then printf '%-24s running (pid %s)\n' "$c" "$pid"; else printf '%-24s stopped\n' "$c"; rc=1; fi
  done
  if [[ -n $(pid_of kube-apiserver) ]]; then
    kc get nodes -o wide || rc=1
  fi
  return $rc
}

cmd_logs() {
  local lines=40 names=() c
  while (($#)); do
    case $1 in
      -n)
        [[ $# -ge 2 ]] || die "logs: -n needs a number"
        lines=$2
        shift
        ;;
      *) names+=("$1") ;;
    esac
    shift
  done
  if ((${#names[@]} == 0)); then
    if multi; then mapfile -t names < <(mn_log_names); else names=("${COMPONENTS[@]}"); fi
  fi
  for c in "${names[@]}"; do
    printf '===== %s (%s) =====\n' "$c" "$LOGS/$c.log"
    tail -n "$lines" "$LOGS/$c.log" 2>/dev/null || echo "(no log)"
  done
}

cmd_env() {
  printf 'export CDIPLUG_CLUSTER_DIR=%q\n' "$STATE"
  printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_FILE"
  if multi; then printf 'export CDIPLUG_NODES_FILE=%q\n' "$MN_NODES/nodes.yaml"; fi
}

# up [--nodes N|FILE | --runtime containerd|cri-o]
cmd_up_args() {
  local nodes="" runtime=containerd
  while (($#)); do
    case $1 in
      --nodes) [[ $# -ge 2 ]] || die "up: --nodes needs a number or a file"; nodes=$2; shift ;;
      --runtime) [[ $# -ge 2 ]] || die "up: --runtime needs containerd or cri-o"; runtime=$2; shift ;;
      *) die "up: unknown argument $1 (--nodes N|FILE, --runtime containerd|cri-o)" ;;
    esac
    shift
  done
  if [[ -n $nodes ]]; then
    [[ $nodes =~ ^[0-9]+$ || -f $nodes ]] || die "up --nodes $nodes: neither a number nor a file"
    [[ $nodes =~ ^[0-9]+$ ]] || nodes=$(readlink -f "$nodes")
    cmd_up_multi "$nodes"
    return
  fi
  case $runtime in
    containerd)
      multi && die "a multi-node cluster is up: $0 down first"
      cmd_up
      ;;
    cri-o)
      # The one node on CRI-O: a node list of one, run as a multi-node cluster is.
      mkdir -p "$STATE"
      local file=$STATE/one-cri-o.yaml
      printf -- '- name: %s\n  runtime: cri-o\n  labels: {cdiplug.test/runtime: cri-o}\n  cdiplug: {resources: [{name: example.com/fpga, backend: fake, options: {count: 2}}]}\n' \
        "$(hostname | tr '[:upper:]' '[:lower:]')" >"$file"
      cmd_up_multi "$file"
      ;;
    *) die "up --runtime: containerd or cri-o, not $runtime" ;;
  esac
}

main() {
  local cmd=${1:-}
  [[ -n $cmd ]] || { usage >&2; exit 2; }
  shift
  case $cmd in
    up) cmd_up_args "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status ;;
    logs) cmd_logs "$@" ;;
    env) cmd_env ;;
    images) cmd_images "$@" ;;
    start)
      [[ $# -eq 1 ]] || die "usage: $0 start NAME"
      if multi; then mn_start_one "$1"; else check_tools; resolve_bin; node_facts; write_configs; start_one "$1"; fi
      ;;
    stop)
      [[ $# -eq 1 ]] || die "usage: $0 stop NAME"
      need_root; resolve_bin
      [[ $1 != *.holder ]] || die "stop $1: a node's namespace goes with $0 down"
      stop_components 15 "$1"
      ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
