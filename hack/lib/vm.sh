# shellcheck shell=bash
# Shared by the QEMU VM tests (hack/vm-vfio-test.sh, hack/vm-usb-test.sh): Debian's kernel fetched
# with apt-get download, the modules a test names, a busybox initramfs whose /init mounts the
# host's root over 9p and runs the test's guest half, and the PASS/FAIL summary of a run.
#
# The caller sets KVER (the kernel ABI), MODULES (paths under lib/modules/KVER without .ko, in
# load order, starting with VM_BASE_MODULES), VM_SET (a name for its module set and initramfs: tests may differ in modules) and
# VM_SCRIPT (its own path: the guest half runs it with --guest).

# virtio and 9p: what every test's /init needs to mount the host's root (first in MODULES).
# shellcheck disable=SC2034 # used by the scripts that source this file
VM_BASE_MODULES=(
  kernel/drivers/virtio/virtio_ring kernel/drivers/virtio/virtio
  kernel/drivers/virtio/virtio_pci_modern_dev kernel/drivers/virtio/virtio_pci_legacy_dev
  kernel/drivers/virtio/virtio_pci
  kernel/net/9p/9pnet kernel/net/9p/9pnet_virtio kernel/fs/netfs/netfs kernel/fs/fscache/fscache
  kernel/fs/9p/9p
)

download_kernel() { # VM KVER: apt-get download linux-image-KVER into VM; prints the .deb
  local vm=$1 kver=$2
  (cd "$vm" && apt-get download "linux-image-$kver" >&2) || return 1
  local fetched=("$vm"/linux-image-"$kver"_*.deb)
  [[ -f ${fetched[0]} ]] && echo "${fetched[0]}"
}

fetch_kernel() { # VM: kernel and MODULES under VM; sets KVER when the pinned kernel is gone from the archive
  local vm=$1
  local deb=${CDIPLUG_VM_KERNEL_DEB:-}
  if [[ -n $deb ]]; then
    KVER=$(dpkg-deb -f "$deb" Package | sed 's/^linux-image-//')
  fi
  local mods=$vm/modules-$VM_SET-$KVER
  [[ -f $vm/vmlinuz-$KVER && -f $mods/.complete ]] && return 0
  if [[ -z $deb ]]; then
    local found=("$vm"/linux-image-"$KVER"_*.deb)
    [[ -f ${found[0]} ]] && deb=${found[0]}
  fi
  if [[ -z $deb ]]; then
    command -v apt-get >/dev/null || { echo "FAIL: no kernel: set CDIPLUG_VM_KERNEL_DEB or install apt-get" >&2; return 1; }
    echo "fetching linux-image-$KVER with apt-get download" >&2
    deb=$(download_kernel "$vm" "$KVER") || {
      apt-get update -qq >&2 || true # a fresh machine may have no package lists yet
      deb=$(download_kernel "$vm" "$KVER")
    } || {
      # Debian drops superseded ABI versions from the archive: take the current 6.1 kernel.
      local current
      current=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -1)
      [[ -n $current ]] && echo "linux-image-$KVER is gone; using linux-image-$current" >&2 && KVER=$current &&
        deb=$(download_kernel "$vm" "$KVER")
    } || { echo "FAIL: apt-get download linux-image-$KVER failed" >&2; return 1; }
    mods=$vm/modules-$VM_SET-$KVER
  fi
  local tmp
  tmp=$(mktemp -d "$vm/unpack.XXXXXX")
  dpkg-deb -x "$deb" "$tmp"
  rm -rf "$mods"
  mkdir -p "$mods"
  local m
  for m in "${MODULES[@]}"; do
    local f=$tmp/lib/modules/$KVER/$m.ko
    [[ -f $f ]] || { echo "FAIL: $m.ko is not in $deb" >&2; rm -rf "$tmp"; return 1; }
    cp "$f" "$mods/"
  done
  cp "$tmp/boot/vmlinuz-$KVER" "$vm/vmlinuz-$KVER"
  rm -rf "$tmp"
  touch "$mods/.complete"
}

build_initramfs() { # VM: the initramfs of MODULES and the /init below, rebuilt when either changes
  local vm=$1
  local out=$vm/initramfs-$VM_SET-$KVER.cpio.gz
  local busybox
  busybox=$(command -v busybox) || { echo "FAIL: busybox (static) is not installed" >&2; return 1; }
  local stamp
  stamp=$( (cat "${BASH_SOURCE[0]}" "$busybox" && printf '%s\n' "${MODULES[@]}") | sha256sum | cut -c1-16)
  [[ -f $out && -f $out.stamp && $(cat "$out.stamp") == "$stamp" ]] && return 0
  local dir
  dir=$(mktemp -d "$vm/initramfs.XXXXXX")
  mkdir -p "$dir"/{bin,proc,sys,dev,host,lib/modules}
  cp "$busybox" "$dir/bin/busybox"
  local m
  for m in "${MODULES[@]}"; do
    cp "$vm/modules-$VM_SET-$KVER/$(basename "$m").ko" "$dir/lib/modules/"
    basename "$m" >>"$dir/modules.order"
  done
  sed -n '/^#-- guest init begin/,/^#-- guest init end/p' "${BASH_SOURCE[0]}" | sed '1d;$d' | sed 's/^# //' >"$dir/init"
  chmod 755 "$dir/init"
  (cd "$dir" && find . | "$busybox" cpio -o -H newc 2>/dev/null | gzip -1) >"$out.tmp"
  mv "$out.tmp" "$out"
  echo "$stamp" >"$out.stamp"
  rm -rf "$dir"
}

# The guest's /init, extracted into the initramfs by build_initramfs (the kernel command line
# gives CDIPLUG_REPO and CDIPLUG_VM_SCRIPT, the test script relative to the checkout):
#-- guest init begin
# #!/bin/busybox sh
# /bin/busybox --install -s /bin
# export PATH=/bin
# mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
# for m in $(cat /modules.order); do insmod /lib/modules/$m.ko || echo "insmod $m failed"; done
# mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /host || echo "FAIL: 9p mount"
# for d in tmp run; do mount -t tmpfs -o mode=1777 $d /host/$d; done
# # A checkout under /tmp or /run is hidden by those tmpfs: mount its own share at the same path.
# if [ ! -e "/host$CDIPLUG_REPO/$CDIPLUG_VM_SCRIPT" ]; then
#   mkdir -p "/host$CDIPLUG_REPO" && mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 cdiplugsrc "/host$CDIPLUG_REPO" || echo "FAIL: 9p mount of the checkout"
# fi
# mount -t proc proc /host/proc; mount -t sysfs sys /host/sys; mount -t devtmpfs dev /host/dev
# echo "guest: kernel $(uname -r), booted in $(cut -d' ' -f1 /proc/uptime) s"
# chroot /host /bin/bash "$CDIPLUG_REPO/$CDIPLUG_VM_SCRIPT" --guest
# echo "VM-TEST-EXIT: $?"
# sync
# echo o >/proc/sysrq-trigger
# sleep 10
#-- guest init end

vm_prepare() { # VM: kernel, modules and initramfs ready (one of several parallel runs prepares, the others wait)
  local vm=$1
  mkdir -p "$vm"
  exec 9>"$vm/.lock"
  flock 9
  fetch_kernel "$vm"
  build_initramfs "$vm"
  flock -u 9
}

vm_python() { # the interpreter cdiplug is installed in (PYTHON, as the tests pass it; else python3)
  "${PYTHON:-python3}" -c 'import sys; print(sys.executable)'
}

vm_report() { # LOG QEMU_RC LIMIT: the PASS/FAIL summary; exit status 0 when the guest passed everything
  local log=$1 qemu_rc=$2 limit=$3
  local fails passes exit_line
  passes=$(grep -c '^PASS' "$log" || true)
  fails=$(grep -c '^FAIL' "$log" || true)
  exit_line=$(grep -a '^VM-TEST-EXIT:' "$log" | tail -1 | tr -d '\r' || true)
  echo "host: $passes PASS, $fails FAIL, ${exit_line:-no exit line}"
  if [[ $qemu_rc == 124 ]]; then
    echo "FAIL: the VM did not finish within $limit s" >&2
    return 1
  fi
  [[ $exit_line == "VM-TEST-EXIT: 0" && $fails == 0 && $passes -gt 0 ]]
}
