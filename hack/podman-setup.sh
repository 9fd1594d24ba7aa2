#!/usr/bin/env bash
# A self-contained podman setup for trying cdiplug's CDI specs on this kind of machine, used by
# tests/e2e/test_podman_cdi.py and handy by hand:
#
#   eval "$(hack/podman-setup.sh /tmp/cdiplug-podman)"
#   podman run --rm --network none --device example.com/fpga=fpga-0 localhost/cdiplug-busybox:e2e env
#
# It writes DIR/containers.conf and DIR/storage.conf (images and containers live under DIR, so
# nothing of the machine's own podman is touched), imports a busybox image made from the static
# busybox binary (no registry needed), and prints the exports that point podman at DIR.
# Why these settings (podman 4.3.1 on Debian 12 VMs): crun fails on hybrid cgroups, so runc; the
# default ulimits exceed the hard limits here, so smaller ones; vfs works on any filesystem under
# DIR (overlay does not on overlayfs). podman reads CDI specs only from /etc/cdi and /var/run/cdi,
# and reads cdiVersion up to 0.5.0; its real errors show only with --log-level=debug.
#
#   hack/podman-setup.sh DIR [IMAGE]    (IMAGE default localhost/cdiplug-busybox:e2e)
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 DIR [IMAGE]" >&2
  exit 2
fi
image="${2:-localhost/cdiplug-busybox:e2e}"
busybox="${BUSYBOX:-/bin/busybox}"
for tool in podman runc; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is not installed (apt-get install podman runc)" >&2; exit 1; }
done
[[ -x $busybox ]] || { echo "$0: $busybox is missing (apt-get install busybox-static)" >&2; exit 1; }

mkdir -p "$1"
dir="$(cd "$1" && pwd)"
mkdir -p "$dir/storage" "$dir/run" "$dir/tmp"

cat >"$dir/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$dir/events.log"
tmp_dir = "$dir/tmp"
CONF

cat >"$dir/storage.conf" <<CONF
[storage]
driver = "vfs"
graphroot = "$dir/storage"
runroot = "$dir/run"
CONF

export CONTAINERS_CONF="$dir/containers.conf" CONTAINERS_STORAGE_CONF="$dir/storage.conf"

if ! podman image exists "$image"; then
  rootfs="$dir/rootfs"
  rm -rf "$rootfs"
  mkdir -p "$rootfs/bin" "$rootfs/dev" "$rootfs/proc" "$rootfs/sys" "$rootfs/etc" "$rootfs/tmp" "$rootfs/mnt"
  cp "$busybox" "$rootfs/bin/busybox"
  while read -r applet; do
    [[ $applet == busybox ]] || ln -sf busybox "$rootfs/bin/$applet"
  done < <("$busybox" --list)
  tar -C "$rootfs" -cf "$dir/rootfs.tar" .
  podman import --quiet "$dir/rootfs.tar" "$image" >/dev/null
  rm -rf "$rootfs" "$dir/rootfs.tar"
fi

printf 'export CONTAINERS_CONF=%q CONTAINERS_STORAGE_CONF=%q\n' "$CONTAINERS_CONF" "$CONTAINERS_STORAGE_CONF"
