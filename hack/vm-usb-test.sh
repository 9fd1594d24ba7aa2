#!/bin/bash
# End-to-end test of cdiplug's generic backend with real USB devices in a real Linux kernel.
#
# Boots Debian's kernel (linux-image-6.1.0-57-amd64) under QEMU TCG with an xHCI controller and
# emulated USB devices: an FTDI serial adapter with a serial number (usb-serial), a keyboard
# (usb-kbd), a memory stick (usb-storage) and a sound card (usb-audio); in the guest a configfs
# gadget on dummy_hcd (an ACM serial function, 1209:000f, serial CDIPLUG-SN-1) gives a USB device of
# any identity that the guest itself unplugs and replugs. The host's root is shared read-only over
# 9p (hack/lib/vm.sh), so the host's Python and this checkout run in the guest. The guest half
# (hack/vm_usb_guest.py) prints PASS/FAIL lines:
#   discover finds each device by vendor/product/serial with its class nodes; through the daemon and
#   the kubelet stand-in, Allocate of the serial adapter gives ttyUSB0 and the raw usbfs node, with
#   type/major/minor in the CDI spec; device_del through the QEMU monitor makes it Unhealthy,
#   device_add Healthy again under the same ID with the raw node's new minor in the next Allocate;
#   the gadget's UDC unbind/bind likewise (timed in the guest: event -> the kubelet sees the change).
# The guest asks for monitor commands by printing "VM-REQUEST: <command>" on the console; this
# script sends each to QEMU's monitor socket and answers nothing (the guest watches its own devices).
# Exit status 0 when every check passed. Needs qemu-system-x86_64, busybox (static), apt-get and
# dpkg-deb (or CDIPLUG_VM_KERNEL_DEB); the kernel, modules and initramfs are cached under .vm/.
#
# Usage: hack/vm-usb-test.sh            (host: prepare, boot, report)
#        hack/vm-usb-test.sh --guest    (run by the guest's init; not for people)
set -euo pipefail

KVER=${CDIPLUG_VM_KVER:-6.1.0-57-amd64}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VM_SET=usb
# shellcheck source=hack/lib/vm.sh
source "$ROOT/hack/lib/vm.sh"

MODULES=(
  "${VM_BASE_MODULES[@]}"
  kernel/drivers/usb/common/usb-common kernel/drivers/usb/core/usbcore
  kernel/drivers/usb/host/xhci-hcd kernel/drivers/usb/host/xhci-pci
  kernel/drivers/hid/hid kernel/drivers/hid/usbhid/usbhid kernel/drivers/hid/hid-generic kernel/drivers/input/evdev
  kernel/drivers/usb/serial/usbserial kernel/drivers/usb/serial/ftdi_sio kernel/drivers/usb/class/cdc-acm
  kernel/drivers/scsi/scsi_common kernel/drivers/scsi/scsi_mod
  kernel/crypto/crct10dif_common kernel/crypto/crct10dif_generic kernel/lib/crc-t10dif
  kernel/lib/crc64 kernel/crypto/crc64_rocksoft_generic kernel/lib/crc64-rocksoft kernel/block/t10-pi
  kernel/drivers/scsi/sd_mod kernel/drivers/usb/storage/usb-storage
  kernel/sound/soundcore kernel/sound/core/snd kernel/sound/core/snd-timer kernel/sound/core/snd-pcm
  kernel/sound/core/snd-hwdep kernel/sound/core/snd-seq-device kernel/sound/core/snd-rawmidi
  kernel/drivers/media/mc/mc kernel/sound/usb/snd-usbmidi-lib kernel/sound/usb/snd-usb-audio
  kernel/fs/configfs/configfs kernel/drivers/usb/gadget/udc/udc-core kernel/drivers/usb/gadget/libcomposite
  kernel/drivers/usb/gadget/udc/dummy_hcd kernel/drivers/usb/gadget/function/u_serial
  kernel/drivers/usb/gadget/function/usb_f_acm
)

monitor_send() { # SOCKET COMMAND: one human-monitor command to QEMU
  python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(2)
s.sendall(sys.argv[2].encode() + b"\n")
time.sleep(0.3)
try:
    s.recv(65536)
except OSError:
    pass
' "$1" "$2"
}

host_main() {
  command -v qemu-system-x86_64 >/dev/null || { echo "FAIL: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)" >&2; exit 1; }
  local vm=${CDIPLUG_VM_DIR:-$ROOT/.vm}
  vm_prepare "$vm"
  local python run
  python=$(vm_python)
  run=$(mktemp -d "$vm/usb-run.XXXXXX")
  local log=$run/console.log mon=$run/monitor.sock
  truncate -s 64M "$run/stick.img"
  local started=$SECONDS limit=${CDIPLUG_VM_TIMEOUT:-590}
  timeout "$limit" qemu-system-x86_64 \
    -machine q35 -accel tcg,thread=multi -cpu max -smp 2 -m 1536 \
    -kernel "$vm/vmlinuz-$KVER" -initrd "$vm/initramfs-$VM_SET-$KVER.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet loglevel=3 CDIPLUG_REPO=$ROOT CDIPLUG_VM_SCRIPT=hack/vm-usb-test.sh CDIPLUG_PYTHON=$python" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$ROOT,mount_tag=cdiplugsrc,security_model=none,readonly=on,multidevs=remap" \
    -monitor "unix:$mon,server=on,wait=off" \
    -audiodev none,id=snd0 -chardev null,id=c1 -chardev null,id=c2 \
    -drive "if=none,id=stick,format=raw,file=$run/stick.img" \
    -device qemu-xhci,id=xhci \
    -device usb-serial,id=ser1,bus=xhci.0,chardev=c1,serial=FTSN0001,always-plugged=on \
    -device usb-kbd,id=kbd1,bus=xhci.0 \
    -device usb-storage,id=stick1,bus=xhci.0,drive=stick,serial=STICK42 \
    -device usb-audio,id=audio1,bus=xhci.0,audiodev=snd0 \
    -nic none -display none -nographic -no-reboot </dev/null >"$log" 2>&1 &
  local qemu=$!
  # Follow the console: print it, and send what the guest asks for to the monitor.
  local line
  while IFS= read -r line; do
    line=${line%$'\r'}
    echo "$line"
    if [[ $line == "VM-REQUEST: "* ]]; then
      monitor_send "$mon" "${line#VM-REQUEST: }" || echo "host: monitor command failed: ${line#VM-REQUEST: }"
    fi
  done < <(tail -F -n +1 --pid="$qemu" "$log" 2>/dev/null)
  local qemu_rc=0
  wait "$qemu" || qemu_rc=$?
  echo "host: QEMU exited with $qemu_rc after $((SECONDS - started)) s"
  mv -f "$log" "$vm/console-usb.log"
  rm -rf "$run"
  echo "host: console in $vm/console-usb.log"
  vm_report "$vm/console-usb.log" "$qemu_rc" "$limit" || exit 1
}

guest_main() {
  grep -q "CDIPLUG_REPO=" /proc/cmdline || { echo "--guest runs only inside the test VM" >&2; exit 2; }
  PATH=$(dirname "$CDIPLUG_PYTHON"):/usr/sbin:/usr/bin:/sbin:/bin
  export PATH HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$CDIPLUG_REPO
  mkdir -p /tmp/state /tmp/kubelet /tmp/cdi
  cd /tmp
  mount -t configfs none /sys/kernel/config
  ip link set lo up
  # The gadget: an ACM serial function of a USB device 1209:000f on dummy_hcd's UDC.
  local g=/sys/kernel/config/usb_gadget/g1
  mkdir "$g"
  echo 0x1209 >"$g/idVendor"
  echo 0x000f >"$g/idProduct"
  mkdir "$g/strings/0x409"
  echo CDIPLUG-SN-1 >"$g/strings/0x409/serialnumber"
  echo cdiplug >"$g/strings/0x409/manufacturer"
  echo "gadget serial" >"$g/strings/0x409/product"
  mkdir "$g/configs/c.1" "$g/functions/acm.usb0"
  ln -s "$g/functions/acm.usb0" "$g/configs/c.1/"
  ls /sys/class/udc >"$g/UDC"
  "$CDIPLUG_PYTHON" "$CDIPLUG_REPO/hack/vm_usb_guest.py" "$g"
}

if [[ ${1:-} == --guest ]]; then
  guest_main
else
  host_main "$@"
fi
