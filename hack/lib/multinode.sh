# shellcheck shell=bash
# The multi-node cluster of hack/local-cluster.sh (`up --nodes N|FILE`, `up --runtime cri-o`),
# sourced by it. One control plane on the host (127.0.0.1) and per node, each in its own mount
# namespace, a kubelet and its runtime (containerd or CRI-O):
#
# - a holder per node, `unshare --mount --propagation private sleep infinity`; everything "on the
#   node" starts with `nsenter -t HOLDER -m`. The node's fixed paths (/var/lib/kubelet, /etc/cdi,
#   /run/cdi, /etc/cdiplug, /var/lib/cdiplug, /var/lib/cni, /run/netns, /var/log/pods,
#   /var/log/containers) are bind mounts of its folder under $STATE/nodes/NAME inside that
#   namespace only: nothing of a node is mounted on the host, and when its processes are gone the
#   namespace and its mounts are too;
# - node i (from 1) has the address 127.0.0.(i+1) (kubelet 10250, healthz 10248, the runtime's
#   stream server), its own kubelet serving certificate, and the CNI bridge cdiplugnI with the pod
#   subnet 10.244.i.0/24 and its gateway 10.244.i.1 on the host. An `unreachable` route over
#   10.244.0.0/16 catches every other pod address: `up` checks with `ip route get` that each
#   subnet goes to its bridge (and the rest nowhere) before anything runs, so no packet for a pod
#   leaves the machine;
# - the kubelet refuses a loopback node IP (it then registers no address): `up` writes the node's
#   addresses into its status once (they stay across kubelet restarts).
#
# Facts behind each setting: ../shared/k8s/MULTINODE.md and CRI-O.md; the user's guide:
# hack/README.md.

MN_FILE=$STATE/nodes.list          # INDEX NAME RUNTIME LABELS, one line per node
MN_NODES=$STATE/nodes              # a folder per node, and nodes.yaml
MN_POD_RANGE=10.244.0.0/16
MN_CONTROL=(etcd kube-apiserver kube-controller-manager kube-scheduler)
# shellcheck disable=SC2034  # used by local-cluster.sh
MN_SCHED_CONFIG=$REPO/deploy/scheduler/kube-scheduler-config.yaml
CRIO_BIN=""

mode() { cat "$STATE/mode" 2>/dev/null || echo one-node; }
multi() { [[ $(mode) == multi ]]; }

# The node lines: `while read -r i name runtime labels; do ...; done < <(mn_nodes)`.
mn_nodes() { cat "$MN_FILE" 2>/dev/null || true; }
mn_ip() { echo "127.0.0.$(($1 + 1))"; }
mn_bridge() { echo "cdiplugn$1"; }
mn_subnet() { echo "10.244.$1.0/24"; }

mn_python() {
  if [[ -x $REPO/.venv/bin/python3 ]]; then echo "$REPO/.venv/bin/python3"; else command -v python3; fi
}

resolve_crio() {
  local sums=$KIT_DIR/SHA256SUMS sum archive
  sum=$(awk '/cri-o-.*\.tar\.xz$/ {print $1}' "$sums")
  archive=$(awk '/cri-o-.*\.tar\.xz$/ {print $2}' "$sums")
  [[ -n $sum && -f $KIT_DIR/$archive ]] || die "no CRI-O archive in $KIT_DIR (SHA256SUMS names none, or it is missing)"
  CRIO_BIN=$CACHE/crio-${sum:0:16}
  if [[ ! -f $CRIO_BIN/.unpacked ]]; then
    say "checking and unpacking $archive into $CRIO_BIN (once)"
    echo "$sum  $KIT_DIR/$archive" | sha256sum --check --quiet || die "$archive does not match $sums"
    rm -rf "$CRIO_BIN.tmp" && mkdir -p "$CRIO_BIN.tmp"
    tar -xJf "$KIT_DIR/$archive" -C "$CRIO_BIN.tmp"
    touch "$CRIO_BIN.tmp/.unpacked"
    rm -rf "$CRIO_BIN" && mv "$CRIO_BIN.tmp" "$CRIO_BIN"
  fi
  local b
  for b in crio pinns crictl; do [[ -x $CRIO_BIN/$b ]] || die "$CRIO_BIN/$b is missing"; done
  need_tool conmon conmon
  need_tool jq jq
}

# --- processes of a node ---------------------------------------------------------------------

holder_pid() { pid_of "$1.holder"; }
node_mntns() { cat "$MN_NODES/$1/mntns" 2>/dev/null || true; }

# The PIDs whose mount namespace is the node's (its holder, runtime, kubelet, shims, conmon,
# containers): found by /proc/PID/ns/mnt, not by command line (every node's shims look alike).
node_pids() {
  local ns p
  ns=$(node_mntns "$1")
  [[ -n $ns ]] || return 0
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/ns/mnt" 2>/dev/null) == "$ns" ]] && echo "${p#/proc/}"
  done
  return 0
}

# launch_on NODE COMPONENT EXE ARGS...: start EXE in the node's mount namespace, detached.
launch_on() {
  local node=$1 comp=$2 exe holder
  exe=$(readlink -f "$3")
  shift 3
  holder=$(holder_pid "$node")
  [[ -n $holder ]] || die "node $node has no namespace holder ($0 up --nodes ...)"
  mkdir -p "$RUN" "$LOGS"
  printf '\n==== %s started %s\n' "$node.$comp" "$(date -u +%FT%TZ)" >>"$LOGS/$node.$comp.log"
  # nsenter (no --fork for a mount namespace) execs EXE: $! becomes its PID.
  PATH="$BIN:$PATH" setsid nsenter -t "$holder" -m -- "$exe" "$@" >>"$LOGS/$node.$comp.log" 2>&1 </dev/null &
  printf '%s\n%s\n' "$!" "$exe" >"$RUN/$node.$comp.pid"
}

on_node() {
  local node=$1
  shift
  nsenter -t "$(holder_pid "$node")" -m -- "$@"
}

# --- the node's namespace ---------------------------------------------------------------------

# The fixed paths of a node and the folder each is bound from.
NODE_BINDS=(
  /var/lib/kubelet:kubelet
  /etc/cdi:etc-cdi
  /run/cdi:run-cdi
  /etc/cdiplug:etc-cdiplug
  /var/lib/cdiplug:cdiplug
  /var/lib/cni:cni-lib
  /run/netns:netns
  /var/log/pods:log-pods
  /var/log/containers:log-containers
)

# own_mntns PID: PID runs in a mount namespace other than ours (unshare has made it).
own_mntns() {
  local ns
  ns=$(readlink "/proc/$1/ns/mnt") && [[ $ns != "$(readlink /proc/self/ns/mnt)" ]]
}

start_holder() {
  local node=$1 dir=$MN_NODES/$1 sleep_exe pid b target
  pid=$(holder_pid "$node")
  if [[ -n $pid ]]; then
    # Ready only once its binds are made (mntns is written last): a holder left half-made by an
    # interrupted `up` goes, with whatever runs in it.
    [[ $(cat "$dir/mntns" 2>/dev/null) == "$(readlink "/proc/$pid/ns/mnt")" ]] && return 0
    say "the namespace of $node was left half-made: making it again"
    readlink "/proc/$pid/ns/mnt" >"$dir/mntns"
    stop_node "$node"
  fi
  rm -f "$dir/mntns"
  sleep_exe=$(readlink -f "$(command -v sleep)")
  mkdir -p "$RUN"
  for b in "${NODE_BINDS[@]}"; do
    mkdir -p "$dir/${b#*:}" "${b%%:*}"
  done
  cp "$dir/config.yaml" "$dir/etc-cdiplug/config.yaml"
  setsid unshare --mount --propagation private -- "$sleep_exe" infinity </dev/null >/dev/null 2>&1 &
  pid=$!
  printf '%s\n%s\n' "$pid" "$sleep_exe" >"$RUN/$node.holder.pid"
  wait_until 10 "the namespace of $node" own_mntns "$pid"
  # The new namespace copied the host's mount table: other runtimes' pod namespaces and overlay
  # mounts (and a one-node cluster's) go from it, deepest first, before the node's own binds.
  local m
  # shellcheck disable=SC2016  # awk's $5
  while read -r m; do
    nsenter -t "$pid" -m -- umount -l "$m" 2>/dev/null || true
  done < <(nsenter -t "$pid" -m -- awk '{print $5}' /proc/self/mountinfo |
    grep -E '^(/run/netns/|/var/lib/kubelet/|/var/lib/containers/storage/|/run/containers/storage/|/run/containerd/|/var/lib/containerd/|'"$CACHE"'/podman/)' |
    awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)
  for b in "${NODE_BINDS[@]}"; do
    target=${b%%:*}
    nsenter -t "$pid" -m -- mount --bind "$dir/${b#*:}" "$target"
  done
  # /var/run is a link to /run here; the pods' network namespaces are bind mounts in /run/netns,
  # which must be a shared mount point before the runtime makes the first one.
  nsenter -t "$pid" -m -- mount --make-rshared /run/netns
  readlink "/proc/$pid/ns/mnt" >"$dir/mntns"
}

# --- networking ------------------------------------------------------------------------------

mn_network_up() {
  local i name runtime labels bridge
  while read -r i name runtime labels; do
    bridge=$(mn_bridge "$i")
    if ! ip link show "$bridge" >/dev/null 2>&1; then
      ip link add "$bridge" type bridge
    fi
    ip addr replace "10.244.$i.1/24" dev "$bridge"
    ip link set "$bridge" up
  done < <(mn_nodes)
  ip route replace unreachable "$MN_POD_RANGE"
  mn_check_routes
}

# Every pod subnet goes to its own bridge, anything else in the pod range nowhere: checked
# before a pod runs (MULTINODE.md: a bridge without its address left pod traffic to the default
# route).
mn_check_routes() {
  local i name runtime labels got
  while read -r i name runtime labels; do
    got=$(ip -4 route get "10.244.$i.2" 2>&1 || true)
    [[ $got == *" dev $(mn_bridge "$i") "* ]] ||
      die "the host does not route node $name's pod subnet $(mn_subnet "$i") to its bridge $(mn_bridge "$i"): ip route get 10.244.$i.2 says: $got"
  done < <(mn_nodes)
  got=$(ip -4 route get 10.244.255.2 2>&1 || true)
  [[ $got == *"No route to host"* || $got == unreachable* ]] ||
    die "addresses of $MN_POD_RANGE outside the nodes' subnets are not unreachable: ip route get 10.244.255.2 says: $got"
}

mn_network_down() {
  local link
  for link in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^cdiplugn[0-9]+$'); do
    ip link del "$link" 2>/dev/null || true
  done
  ip route del unreachable "$MN_POD_RANGE" 2>/dev/null || true
}

# --- configuration per node ------------------------------------------------------------------

write_cni() {
  local i=$1 dir=$2
  mkdir -p "$dir/net.d" "$dir/ipam"
  cat >"$dir/net.d/10-cdiplug.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cdiplug-local",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(mn_bridge "$i")",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(mn_subnet "$i")", "gateway": "10.244.$i.1"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$dir/ipam"
      }
    }
  ]
}
EOF
}

write_containerd_config() {
  local i=$1 dir=$2/containerd
  mkdir -p "$dir"
  cat >"$dir/config.toml" <<EOF
# Written by hack/local-cluster.sh (node $i).
version = 3
root = '$dir/root'
state = '$dir/state'

[grpc]
  address = '$dir/containerd.sock'

[ttrpc]
  address = '$dir/containerd.sock.ttrpc'

[plugins.'io.containerd.internal.v1.opt']
  path = '$dir/opt'

# The NRI socket is a fixed path (/var/run/nri/nri.sock) that another runtime may own.
[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '$PAUSE_IMAGE'

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
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
    conf_dir = '$2/cni/net.d'

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '$(mn_ip "$i")'
EOF
}

# CRI-O with every path under the node's folder (CRI-O.md: its defaults write all over the
# machine), CDI from /etc/cdi and /var/run/cdi (the node's binds), NRI off, and runc behind a
# wrapper that raises oom_score_adj to the caller's own: root here cannot lower it, and the
# kubelet asks for -997 for system-node-critical pods (cdiplug's) and CRI-O for infra containers.
# containers/storage wants a runroot of at most 50 characters: /run/cdiplug/nI (gone with down).
crio_runroot() { echo "/run/cdiplug/n$1"; }

write_crio_config() {
  local i=$1 base=$2/crio
  mkdir -p "$(crio_runroot "$i")"
  mkdir -p "$base"/{storage,log/pods,run,lib,hooks.d,keys,policies,auth,tmp,run/runc,run/ns}
  cat >"$base/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$base/storage"
runroot = "$(crio_runroot "$i")"
EOF
  # Short names (busybox:1.36) resolve to docker.io, whose images are all local here; pulling
  # from it (or anywhere) is blocked, so nothing leaves the machine for a missing image.
  cat >"$base/registries.conf" <<EOF
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
[[registry]]
prefix = "docker.io"
location = "docker.io"
blocked = true
[[registry]]
prefix = "localhost"
location = "localhost"
blocked = true
EOF
  mkdir -p "$base/registries.conf.d" "$base/crio.conf.d"
  echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$base/policy.json"
  printf 'runtime-endpoint: unix://%s/crio.sock\nimage-endpoint: unix://%s/crio.sock\n' "$base" "$base" >"$base/crictl.yaml"
  cat >"$base/runc-oomclamp" <<'EOF'
#!/bin/sh
# runc, with the bundle's oom_score_adj raised to this process's own where it is lower (root here
# cannot lower it), and without hugetlb limits where no hugetlb cgroup is mounted (runc 1.1 then
# fails "cannot set hugetlb limit"; containerd leaves them out there itself).
b=; prev=
for a in "$@"; do case $prev in --bundle|-b) b=$a ;; esac; prev=$a; done
if [ -n "$b" ] && [ -f "$b/config.json" ]; then
  cur=$(cat /proc/self/oom_score_adj)
  huge=true; [ -d /sys/fs/cgroup/hugetlb ] || huge=false
  jq -c --argjson c "$cur" --argjson huge "$huge" '
    (if (.process.oomScoreAdj // $c) < $c then .process.oomScoreAdj = $c else . end)
    | (if $huge then . else del(.linux.resources.hugepageLimits) end)' \
    "$b/config.json" > "$b/config.json.oomclamp" && mv "$b/config.json.oomclamp" "$b/config.json"
fi
exec /usr/sbin/runc "$@"
EOF
  chmod 755 "$base/runc-oomclamp"
  cat >"$base/crio.conf" <<EOF
# Written by hack/local-cluster.sh (node $i).
[crio]
root = "$base/storage"
runroot = "$(crio_runroot "$i")"
storage_driver = "overlay"
log_dir = "$base/log/pods"
version_file = "$base/run/version"
version_file_persist = "$base/lib/version"
clean_shutdown_file = "$base/lib/clean.shutdown"

[crio.api]
listen = "$base/crio.sock"
stream_address = "$(mn_ip "$i")"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
selinux = false
cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
hooks_dir = ["$base/hooks.d"]
container_exits_dir = "$base/run/exits"
container_attach_socket_dir = "$base/run"
namespaces_dir = "$base/run/ns"
pinns_path = "$CRIO_BIN/pinns"
decryption_keys_path = "$base/keys/"
irqbalance_config_file = "$base/irqbalance"
irqbalance_config_restore_file = "disable"
enable_criu_support = false
drop_infra_ctr = true
disable_hostport_mapping = true
log_level = "info"

[crio.runtime.runtimes.runc]
runtime_path = "$base/runc-oomclamp"
runtime_type = "oci"
runtime_root = "$base/run/runc"
monitor_path = "$(command -v conmon)"
monitor_cgroup = "pod"

[crio.image]
pause_image = "$PAUSE_IMAGE"
pause_command = "/pause"
pinned_images = ["$PAUSE_IMAGE"]
signature_policy = "$base/policy.json"
signature_policy_dir = "$base/policies"
namespaced_auth_dir = "$base/auth"
big_files_temporary_dir = "$base/tmp"

[crio.network]
network_dir = "$2/cni/net.d"
plugin_dirs = ["$CNI_BIN_DIR"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
nri_listen = "$base/run/nri.sock"
EOF
}

runtime_endpoint() {
  local dir=$MN_NODES/$2
  case $1 in
    containerd) echo "unix://$dir/containerd/containerd.sock" ;;
    cri-o) echo "unix://$dir/crio/crio.sock" ;;
  esac
}

write_kubelet_config() {
  local i=$1 name=$2 runtime=$3 dir=$MN_NODES/$2 ip
  ip=$(mn_ip "$i")
  mkdir -p "$dir/kubelet-config"
  cat >"$dir/kubelet-config/config.yaml" <<EOF
# Written by hack/local-cluster.sh (node $name).
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: $(runtime_endpoint "$runtime" "$name")
failCgroupV1: false
cgroupDriver: cgroupfs
# One cgroup root for every node: with pod cgroups each kubelet would kill the others' pods
# ("Orphaned pod found, removing pod cgroups").
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: $ip
healthzPort: 10248
tlsCertFile: $PKI/kubelet-$name.crt
tlsPrivateKeyFile: $PKI/kubelet-$name.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
nodeStatusUpdateFrequency: 2s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
EOF
}

# --- components per node ---------------------------------------------------------------------

start_node_runtime() {
  local name=$1 runtime=$2 dir=$MN_NODES/$1
  case $runtime in
    containerd)
      [[ -z $(pid_of "$name.containerd") ]] || return 0
      say "starting containerd on $name"
      launch_on "$name" containerd "$BIN/containerd" --config "$dir/containerd/config.toml"
      wait_until 30 "containerd on $name to answer" node_ctr "$name" version
      ;;
    cri-o)
      [[ -z $(pid_of "$name.crio") ]] || return 0
      say "starting CRI-O on $name"
      local base=$dir/crio
      CONTAINERS_STORAGE_CONF=$base/storage.conf CONTAINERS_REGISTRIES_CONF=$base/registries.conf \
        launch_on "$name" crio "$CRIO_BIN/crio" --config "$base/crio.conf" --config-dir "$base/crio.conf.d" \
        --registries-conf "$base/registries.conf" --registries-conf-dir "$base/registries.conf.d"
      wait_until 60 "CRI-O on $name to answer" node_crictl "$name" version
      ;;
  esac
}

start_node_kubelet() {
  local i=$1 name=$2 runtime=$3 labels=$4 extra=()
  [[ -z $(pid_of "$name.kubelet") ]] || return 0
  [[ $labels == - ]] || extra+=(--node-labels "$labels")
  say "starting kubelet on $name ($(mn_ip "$i"), $runtime)"
  launch_on "$name" kubelet "$BIN/kubelet" --config "$MN_NODES/$name/kubelet-config/config.yaml" \
    --kubeconfig "$KUBECONFIG_FILE" --root-dir /var/lib/kubelet --hostname-override "$name" \
    --node-ip "$(mn_ip "$i")" --v "${CDIPLUG_KUBELET_V:-2}" "${extra[@]}"
}

node_ctr() {
  local name=$1 rc=0
  shift
  "$BIN/ctr" --address "$MN_NODES/$name/containerd/containerd.sock" "$@" 2>"$MN_NODES/$name/ctr.err" || rc=$?
  grep -v 'DEPRECATION: The support for cgroup v1' "$MN_NODES/$name/ctr.err" >&2 || true
  return $rc
}

node_crictl() {
  local name=$1
  shift
  "$CRIO_BIN/crictl" --config "$MN_NODES/$name/crio/crictl.yaml" --runtime-endpoint "unix://$MN_NODES/$name/crio/crio.sock" \
    --image-endpoint "unix://$MN_NODES/$name/crio/crio.sock" --timeout 20s "$@"
}

node_runtime() { awk -v n="$1" '$2 == n {print $3}' "$MN_FILE"; }
node_index() { awk -v n="$1" '$2 == n {print $1}' "$MN_FILE"; }

# node_import NODE IMAGE: the podman image into the node's runtime, unless the same is there.
node_import() {
  local name=$1 image=$2 runtime id stamp
  runtime=$(node_runtime "$name")
  id=$(podman image inspect --format '{{.Id}}' "$image")
  stamp=$MN_NODES/$name/imported/$(printf '%s' "$image" | tr '/:' '__')
  [[ $(cat "$stamp" 2>/dev/null) == "$id" ]] && return 0
  say "importing $image into $runtime on $name"
  mkdir -p "$MN_NODES/$name/imported"
  case $runtime in
    containerd)
      podman save --quiet --format docker-archive "$image" | node_ctr "$name" -n k8s.io images import --local - >/dev/null
      node_ctr "$name" -n k8s.io images ls -q "name==$image" | grep -qx "$image" ||
        die "$image is not in containerd on $name after the import"
      ;;
    cri-o)
      # CRI-O and podman share containers/storage: load into CRI-O's store, which it reads live.
      local base=$MN_NODES/$name/crio tmp
      mkdir -p "$CACHE/images" # a fresh machine whose first cluster is this one
      tmp=$(mktemp "$CACHE/images/save.XXXXXX")
      podman save --quiet --format docker-archive -o "$tmp" "$image"
      (
        unset CONTAINERS_CONF
        CONTAINERS_STORAGE_CONF=$base/storage.conf podman --root "$base/storage" --runroot "$(crio_runroot "$(node_index "$name")")" \
          --storage-driver overlay load --quiet -i "$tmp" >/dev/null
      ) || { rm -f "$tmp"; die "podman load of $image into CRI-O's store on $name failed"; }
      rm -f "$tmp"
      node_crictl "$name" inspecti "$image" >/dev/null ||
        die "$image is not in CRI-O's images on $name after the load"
      ;;
  esac
  echo "$id" >"$stamp"
}

# --- commands --------------------------------------------------------------------------------

# mn_plan SOURCE: the node list (hack/lib/nodes.py) into $MN_FILE.
mn_plan() {
  local out
  out=$("$(mn_python)" "$REPO/hack/lib/nodes.py" plan "$1" "$MN_NODES") || die "bad node list (--nodes $1)"
  printf '%s\n' "$out" >"$MN_FILE"
}

cmd_up_multi() {
  local source=$1
  check_tools
  resolve_bin
  node_facts
  need_tool unshare util-linux
  need_tool nsenter util-linux
  if [[ $(mode) == one-node && -n $(pid_of kubelet) ]]; then
    die "the one-node cluster is up: $0 down first"
  fi
  mkdir -p "$STATE" "$RUN" "$LOGS"
  # Other nodes than last time make a new cluster: the old one's objects (nodes, pods) go.
  if [[ $(cat "$STATE/cluster" 2>/dev/null) != "multi $source" ]]; then
    [[ -z $(pid_of kube-apiserver) ]] || die "a cluster of other nodes is up: $0 down first"
    rm -rf "$STATE/etcd" "$MN_NODES"
  fi
  echo multi >"$STATE/mode"
  echo "multi $source" >"$STATE/cluster"
  echo "$source" >"$STATE/nodes.source"
  mn_plan "$source"
  local i name runtime labels
  if grep -q ' cri-o ' "$MN_FILE"; then resolve_crio; fi
  make_pki
  while read -r i name runtime labels; do
    if [[ $(cat "$PKI/kubelet-$name.node" 2>/dev/null) != "$(mn_ip "$i")" ]]; then
      cert "kubelet-$name" "system:node:$name" system:nodes "IP:$(mn_ip "$i"),DNS:$name"
      mn_ip "$i" >"$PKI/kubelet-$name.node"
    fi
    mkdir -p "$MN_NODES/$name/cni"
    write_cni "$i" "$MN_NODES/$name/cni"
    case $runtime in
      containerd) write_containerd_config "$i" "$MN_NODES/$name" ;;
      cri-o) write_crio_config "$i" "$MN_NODES/$name" ;;
    esac
    write_kubelet_config "$i" "$name" "$runtime"
  done < <(mn_nodes)
  mn_network_up
  start_etcd
  start_kube_apiserver
  start_kube_controller_manager
  start_kube_scheduler
  test_images
  while read -r i name runtime labels; do
    start_holder "$name"
    start_node_runtime "$name" "$runtime"
    node_import "$name" "$PAUSE_IMAGE"
    node_import "$name" "$BUSYBOX_IMAGE"
    start_node_kubelet "$i" "$name" "$runtime" "$labels"
  done < <(mn_nodes)
  while read -r i name runtime labels; do
    kc wait --for=create "node/$name" --timeout "${UP_TIMEOUT}s" >/dev/null ||
      { alive_or_die "$name.kubelet"; die "node $name did not register"; }
    kc patch node "$name" --subresource=status --type=merge \
      -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"$(mn_ip "$i")\"},{\"type\":\"Hostname\",\"address\":\"$name\"}]}}" >/dev/null
  done < <(mn_nodes)
  while read -r i name runtime labels; do
    kc wait --for=condition=Ready "node/$name" --timeout "${UP_TIMEOUT}s" >/dev/null ||
      { alive_or_die "$name.kubelet"; die "node $name is not Ready after ${UP_TIMEOUT}s (logs: $0 logs)"; }
  done < <(mn_nodes)
  kc wait --for=create serviceaccount/default --timeout 60s >/dev/null ||
    die "no default ServiceAccount (kube-controller-manager: $LOGS/kube-controller-manager.log)"
  mn_check_routes
  say "$(wc -l <"$MN_FILE") nodes Ready; export KUBECONFIG=$KUBECONFIG_FILE"
}

cmd_images_multi() {
  local i name runtime labels image=$1
  build_cdiplug_image "$image"
  test_images
  while read -r i name runtime labels; do
    [[ -n $(holder_pid "$name") ]] || die "node $name is not up: $0 up --nodes $(cat "$STATE/nodes.source")"
    node_import "$name" "$PAUSE_IMAGE"
    node_import "$name" "$BUSYBOX_IMAGE"
    node_import "$name" "$image"
  done < <(mn_nodes)
}

# Stop a node: its kubelet, its pods' containers, its runtime, then every process left in its
# namespace (shims, conmon, containers, the holder), by PID.
stop_node() {
  local name=$1 runtime pid left
  runtime=$(node_runtime "$name")
  stop_components 15 "$name.kubelet"
  case $runtime in
    containerd)
      if [[ -n $(pid_of "$name.containerd") ]]; then
        local id
        for id in $(node_ctr "$name" -n k8s.io tasks ls -q 2>/dev/null); do
          node_ctr "$name" -n k8s.io tasks kill --signal SIGKILL --all "$id" >/dev/null 2>&1 || true
        done
      fi
      stop_components 15 "$name.containerd"
      ;;
    cri-o)
      if [[ -n $(pid_of "$name.crio") ]]; then
        node_crictl "$name" stopp -a >/dev/null 2>&1 || true
        node_crictl "$name" rmp -a -f >/dev/null 2>&1 || true
      fi
      stop_components 15 "$name.crio"
      ;;
  esac
  rm -f "$RUN/$name.holder.pid"
  left=$(node_pids "$name")
  if [[ -n $left ]]; then
    say "stopping what is left in $name's namespace: pids $(echo "$left" | tr '\n' ' ')"
    for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in $left; do timeout 10 tail --pid="$pid" -s 0.1 -f /dev/null || true; done
  fi
  left=$(node_pids "$name")
  [[ -z $left ]] || say "still running in $name's namespace: $left"
}

cmd_down_multi() {
  local purge=$1 i name runtime labels
  resolve_bin
  if grep -q ' cri-o ' "$MN_FILE" 2>/dev/null; then resolve_crio; fi
  while read -r i name runtime labels; do stop_node "$name"; done < <(mn_nodes)
  stop_components 15 kube-scheduler kube-controller-manager kube-apiserver
  stop_components 15 etcd
  mn_network_down
  # CRI-O leaves the empty cgroups of its pods behind (CRI-O.md).
  rm -rf /run/cdiplug
  find /sys/fs/cgroup -depth -mindepth 1 -maxdepth 3 -type d -name 'crio-*' -empty -delete 2>/dev/null || true
  while read -r i name runtime labels; do
    rm -rf "$MN_NODES/$name/cni/ipam" "$MN_NODES/$name/mntns"
  done < <(mn_nodes)
  if ((purge)); then
    say "deleting $STATE"
    rm -rf "$STATE"
  else
    rm -f "$STATE/mode"
  fi
  say "down"
}

cmd_status_multi() {
  local c pid rc=0 i name runtime labels comp
  for c in "${MN_CONTROL[@]}"; do
    pid=$(pid_of "$c")
    if [[ -n $pid ]]; then printf '%-28s running (pid %s)\n' "$c" "$pid"; else printf '%-28s stopped\n' "$c"; rc=1; fi
  done
  while read -r i name runtime labels; do
    for comp in holder "$( [[ $runtime == cri-o ]] && echo crio || echo containerd)" kubelet; do
      pid=$(pid_of "$name.$comp")
      if [[ -n $pid ]]; then
        printf '%-28s running (pid %s)\n' "$name.$comp" "$pid"
      else
        printf '%-28s stopped\n' "$name.$comp"
        rc=1
      fi
    done
    printf '%-28s %s, %s, bridge %s, pods %s\n' "$name" "$(mn_ip "$i")" "$runtime" "$(mn_bridge "$i")" "$(mn_subnet "$i")"
  done < <(mn_nodes)
  if [[ -n $(pid_of kube-apiserver) ]]; then
    kc get nodes -o wide -L cdiplug.test/runtime || rc=1
  fi
  return $rc
}

mn_log_names() {
  local i name runtime labels
  printf '%s\n' "${MN_CONTROL[@]}"
  while read -r i name runtime labels; do
    echo "$name.$([[ $runtime == cri-o ]] && echo crio || echo containerd)"
    echo "$name.kubelet"
  done < <(mn_nodes)
}

# start|stop NODE.COMPONENT (node-b.kubelet, node-c.crio) or a control-plane component.
mn_start_one() {
  local what=$1 name comp i runtime labels
  case $what in
    *.*) name=${what%%.*} comp=${what#*.} ;;
    *)
      check_tools; resolve_bin; node_facts; start_one "$what"; return
      ;;
  esac
  check_tools
  resolve_bin
  i=$(node_index "$name")
  [[ -n $i ]] || die "no node $name in $MN_FILE"
  runtime=$(node_runtime "$name")
  labels=$(awk -v n="$name" '$2 == n {print $4}' "$MN_FILE")
  [[ $runtime == cri-o ]] && resolve_crio
  case $comp in
    kubelet) start_node_kubelet "$i" "$name" "$runtime" "$labels" ;;
    containerd | crio) start_node_runtime "$name" "$runtime" ;;
    *) die "unknown component $comp of $name (kubelet, containerd or crio)" ;;
  esac
}
