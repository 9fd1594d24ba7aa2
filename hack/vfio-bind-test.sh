#!/bin/bash
# Bind one PCI function to vfio-pci with cdiplug on a real node, check it, and give it back.
#
# Usage: sudo hack/vfio-bind-test.sh ADDR [--force]
#   ADDR     a PCI address as in /sys/bus/pci/devices (0000:3b:02.0); pick one you can spare:
#            every endpoint function of its IOMMU group goes to vfio-pci for a moment
#   --force  bind even when cdiplug finds the function in use (an interface up with addresses,
#            a mounted disk); think twice
#
# Steps, each printed as PASS/FAIL: `cdiplug vfio status`, `cdiplug vfio bind` (journaled in a
# temporary state folder unless CDIPLUG_STATE_DIR is set), the driver link is vfio-pci and
# /dev/vfio/<group> exists for every function of the group, `cdiplug vfio unbind`, every function
# is back on the driver it had before (and driver_override is clear). Exit status 0 when all passed.
# Needs root, vfio-pci (loaded, or loadable with modprobe) and cdiplug installed (pip install -e .).
set -euo pipefail

ADDR=${1:-}
FORCE=()
[[ ${2:-} == --force ]] && FORCE=(--force)
if [[ -z $ADDR || $ADDR == -h || $ADDR == --help ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
# Checked before it becomes a path under /sys, as cdiplug checks it.
[[ $ADDR =~ ^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]] || { echo "not a PCI address (DDDD:BB:DD.F, lower-case hex): $ADDR" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "run as root (binding drivers writes to sysfs)" >&2; exit 2; }
FN=/sys/bus/pci/devices/$ADDR
[[ -d $FN ]] || { echo "no PCI function $ADDR in /sys/bus/pci/devices" >&2; exit 2; }
command -v cdiplug >/dev/null || { echo "cdiplug is not installed (pip install -e .)" >&2; exit 2; }
if [[ ! -d /sys/bus/pci/drivers/vfio-pci ]]; then
  modprobe vfio-pci || { echo "vfio-pci is not loaded and modprobe vfio-pci failed" >&2; exit 2; }
fi
[[ -L $FN/iommu_group ]] || { echo "$ADDR has no IOMMU group: turn the IOMMU on (intel_iommu=on / amd_iommu=on)" >&2; exit 2; }
if [[ -L $FN/driver && $(basename "$(readlink "$FN/driver")") == vfio-pci ]]; then
  echo "$ADDR is on vfio-pci already: pick a function on its usual driver" >&2
  exit 2
fi

if [[ -z ${CDIPLUG_STATE_DIR:-} ]]; then
  CDIPLUG_STATE_DIR=$(mktemp -d /tmp/cdiplug-vfio-test.XXXXXX)
  trap 'rm -rf "$CDIPLUG_STATE_DIR"' EXIT
fi
export CDIPLUG_STATE_DIR

FAILS=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
driver_of() {
  if [[ -L /sys/bus/pci/devices/$1/driver ]]; then basename "$(readlink "/sys/bus/pci/devices/$1/driver")"; else echo none; fi
}

GROUP=$(basename "$(readlink "$FN/iommu_group")")
declare -A BEFORE
MEMBERS=()
for m in /sys/kernel/iommu_groups/"$GROUP"/devices/*; do
  a=$(basename "$m")
  class=$(cat "/sys/bus/pci/devices/$a/class")
  case ${class:0:6} in 0x0600 | 0x0604 | 0x0607 | 0x0609) continue ;; esac # bridges stay
  MEMBERS+=("$a")
  BEFORE[$a]=$(driver_of "$a")
done
echo "IOMMU group $GROUP: ${MEMBERS[*]}"
for a in "${MEMBERS[@]}"; do echo "  $a: ${BEFORE[$a]}"; done

if cdiplug vfio status "$ADDR"; then pass "cdiplug vfio status $ADDR"; else fail "cdiplug vfio status $ADDR"; fi
if cdiplug vfio bind "$ADDR" "${FORCE[@]}"; then
  pass "cdiplug vfio bind $ADDR"
  for a in "${MEMBERS[@]}"; do
    if [[ $(driver_of "$a") == vfio-pci ]]; then pass "$a is on vfio-pci"; else fail "$a is on $(driver_of "$a")"; fi
  done
  if [[ -e /dev/vfio/$GROUP ]]; then pass "/dev/vfio/$GROUP exists"; else fail "/dev/vfio/$GROUP is missing"; fi
  if cdiplug vfio unbind "$ADDR"; then pass "cdiplug vfio unbind $ADDR"; else fail "cdiplug vfio unbind $ADDR"; fi
  for a in "${MEMBERS[@]}"; do
    now=$(driver_of "$a")
    if [[ $now == "${BEFORE[$a]}" ]]; then
      pass "$a is back on ${BEFORE[$a]}"
    else
      fail "$a is on $now, was ${BEFORE[$a]}"
    fi
    override=$(cat "/sys/bus/pci/devices/$a/driver_override")
    if [[ $override == "(null)" || ${BEFORE[$a]} == vfio-pci ]]; then pass "$a driver_override is clear"; else fail "$a driver_override is $override"; fi
  done
else
  fail "cdiplug vfio bind $ADDR (nothing was changed if it was refused)"
fi
echo "$FAILS failed"
[[ $FAILS == 0 ]]
