#!/bin/bash
# End-to-end VFIO test of cdiplug's PCI backend in a real Linux kernel under QEMU.
#
# Boots Debian's kernel (linux-image-6.1.0-57-amd64) under QEMU TCG on a q35 machine with an
# emulated Intel IOMMU (intel-iommu, interrupt remapping) and two PCI devices: QEMU's "edu" test
# device (no host driver) and an e1000e NIC (driver e1000e). The host's root is shared read-only
# over 9p; a tiny busybox initramfs loads the modules (virtio, 9p, vfio, vfio-pci, e1000e), mounts
# it, gives it writable tmpfs folders and chroots into it, so the host's own Python and this
# checkout run in the guest against a real sysfs and real /dev/vfio. There the guest half of this
# script (--guest) checks, printing PASS/FAIL lines:
#   discover advertises both devices with their IOMMU groups; a bind is refused while the NIC is
#   up with an address; a real Allocate (daemon + kubelet stand-in, or prepare() directly when
#   the stand-in is not installed) binds edu to vfio-pci with /dev/vfio/<group>; a daemon killed
#   (SIGKILL) in the middle of binding the NIC, right after the unbind step, finishes the bind
#   at its next start from the journal; edu served as a DRA driver (api: dra, with the DRA
#   kubelet and API-server stand-ins): a claim's prepare binds it to vfio-pci and its unprepare
#   (release: restore) gives it back, a claim configured vfio: false (PciConfig) keeps it off
#   vfio-pci with no /dev/vfio in its spec, an admin-access claim binds nothing; `cdiplug vfio unbind` returns both to their original
#   drivers (e1000e with its interface back; edu to none).
# Exit status 0 when every check passed. Needs qemu-system-x86_64, busybox (static) and
# apt-get + dpkg-deb (or CDIPLUG_VM_KERNEL_DEB=/path/to/linux-image-...deb); kernel, modules and
# initramfs are cached under .vm/ (gitignored). Takes two to three minutes under TCG on 2 cores.
#
# Usage: hack/vm-vfio-test.sh            (host: prepare, boot, report)
#        hack/vm-vfio-test.sh --guest    (run by the guest's init; not for people)
set -euo pipefail

KVER=${CDIPLUG_VM_KVER:-6.1.0-57-amd64} # Debian 12's kernel; a later 6.1.0-N-amd64 works too
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VM_SET=vfio
# shellcheck source=hack/lib/vm.sh
source "$ROOT/hack/lib/vm.sh"

# ------------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------------

MODULES=(
  "${VM_BASE_MODULES[@]}"
  kernel/drivers/net/ethernet/intel/e1000e/e1000e
  kernel/virt/lib/irqbypass kernel/drivers/vfio/vfio kernel/drivers/vfio/vfio_iommu_type1
  kernel/drivers/vfio/vfio_virqfd kernel/drivers/vfio/pci/vfio-pci-core kernel/drivers/vfio/pci/vfio-pci
)

host_main() {
  command -v qemu-system-x86_64 >/dev/null || { echo "FAIL: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)" >&2; exit 1; }
  local vm=${CDIPLUG_VM_DIR:-$ROOT/.vm}
  vm_prepare "$vm"
  local python
  # The guest runs the host's Python, so it must be one that finds cdiplug and cdiplug_backends.
  python=$(vm_python)
  local log=$vm/console-$$.log
  local started=$SECONDS
  # TCG: KVM on these machines cannot run a stock kernel, and TCG is fast enough for this.
  set +e
  timeout "${CDIPLUG_VM_TIMEOUT:-890}" qemu-system-x86_64 \
    -machine q35,kernel-irqchip=split -accel tcg,thread=multi -cpu max -smp 2 -m 1536 \
    -device intel-iommu,intremap=on \
    -kernel "$vm/vmlinuz-$KVER" -initrd "$vm/initramfs-$VM_SET-$KVER.cpio.gz" \
    -append "console=ttyS0 intel_iommu=on iommu=pt panic=-1 quiet loglevel=3 CDIPLUG_REPO=$ROOT CDIPLUG_VM_SCRIPT=hack/vm-vfio-test.sh CDIPLUG_PYTHON=$python" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$ROOT,mount_tag=cdiplugsrc,security_model=none,readonly=on,multidevs=remap" \
    -device edu -device e1000e,romfile= -nic none \
    -display none -nographic -no-reboot </dev/null 2>&1 | tee "$log"
  local qemu_rc=${PIPESTATUS[0]}
  set -e
  echo "host: QEMU exited with $qemu_rc after $((SECONDS - started)) s"
  mv -f "$log" "$vm/console.log"
  echo "host: console in $vm/console.log"
  vm_report "$vm/console.log" "$qemu_rc" "${CDIPLUG_VM_TIMEOUT:-890}" || exit 1
}

# ------------------------------------------------------------------------------------------------
# guest side: runs chrooted into the host's root, against the guest kernel's sysfs and /dev
# ------------------------------------------------------------------------------------------------

G_FAILS=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; G_FAILS=$((G_FAILS + 1)); }
check() { # check WHAT COMMAND...
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

find_function() { # VENDOR DEVICE -> the first address with those IDs
  local d
  for d in /sys/bus/pci/devices/*; do
    if [[ $(cat "$d/vendor") == "$1" && $(cat "$d/device") == "$2" ]]; then
      basename "$d"
      return 0
    fi
  done
  return 1
}

driver_of() {
  local l=/sys/bus/pci/devices/$1/driver
  if [[ -L $l ]]; then basename "$(readlink "$l")"; else echo none; fi
}

group_of() { basename "$(readlink "/sys/bus/pci/devices/$1/iommu_group")"; }

guest_main() {
  # Never on a host: only the guest's kernel command line carries CDIPLUG_REPO.
  grep -q "CDIPLUG_REPO=" /proc/cmdline || { echo "--guest runs only inside the test VM" >&2; exit 2; }
  PATH=$(dirname "$CDIPLUG_PYTHON"):/usr/sbin:/usr/bin:/sbin:/bin
  export PATH HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$CDIPLUG_REPO
  export CDIPLUG_STATE_DIR=/tmp/state CDIPLUG_KUBELET_DIR=/tmp/kubelet CDIPLUG_CDI_DIR=/tmp/cdi
  export CDIPLUG_POD_RESOURCES_SOCKET=/tmp/pod-resources.sock CDIPLUG_CONFIG=/tmp/cdiplug.yaml
  mkdir -p /tmp/state /tmp/kubelet /tmp/cdi
  cd /tmp
  local t0=$SECONDS
  NIC=$(find_function 0x8086 0x10d3) || { fail "no e1000e function in the guest"; return 1; }
  EDU=$(find_function 0x1234 0x11e8) || { fail "no edu function in the guest"; return 1; }
  SATA=$(find_function 0x8086 0x2922) || SATA=none
  NIC_GROUP=$(group_of "$NIC")
  EDU_GROUP=$(group_of "$EDU")
  echo "guest: e1000e $NIC (group $NIC_GROUP, driver $(driver_of "$NIC")), edu $EDU (group $EDU_GROUP), AHCI $SATA"
  check "vfio-pci is loaded" test -d /sys/bus/pci/drivers/vfio-pci
  check "e1000e starts on its driver" test "$(driver_of "$NIC")" = e1000e
  printf '%s\n' \
    'resources:' \
    '  - name: example.com/nic-vfio' \
    '    backend: pci' \
    '    options: {selectors: [{vendor: "0x8086", device: "0x10d3"}], vfio: true}' \
    '  - name: example.com/edu' \
    '    backend: pci' \
    '    options: {selectors: [{vendor: "0x1234", device: "0x11e8"}], vfio: true,' \
    '              release: restore, release_grace: 3, release_interval: 1}' \
    '  - name: example.com/sata' \
    '    backend: pci' \
    '    options: {selectors: [{class: "0x010601"}], vfio: true}' >/tmp/cdiplug.yaml

  # 1. discover: both devices with their groups; the AHCI function shares group with the LPC bridge
  if cdiplug discover -o json >/tmp/discover.json; then
    python3 -c "$GUEST_CHECK_DISCOVER" "$NIC" "$NIC_GROUP" "$EDU" "$EDU_GROUP" "$SATA" || G_FAILS=$((G_FAILS + 1))
  else
    fail "cdiplug discover failed"
  fi

  echo "guest: discover checked after $((SECONDS - t0)) s"
  # 2. safety: an interface that is up with an address is not taken
  local ifname
  local names=("/sys/bus/pci/devices/$NIC/net"/*)
  ifname=$(basename "${names[0]}")
  ip link set "$ifname" up
  ip addr add 192.0.2.10/24 dev "$ifname"
  if cdiplug vfio bind "$NIC" 2>/tmp/refused.txt; then
    fail "vfio bind of $NIC while $ifname is up with an address was not refused"
  else
    check "vfio bind refused while $ifname is up with an address: $(cat /tmp/refused.txt)" \
      grep -q "is up with addresses 192.0.2.10/24" /tmp/refused.txt
  fi
  check "the refused bind left $NIC on e1000e" test "$(driver_of "$NIC")" = e1000e
  ip addr flush dev "$ifname"
  ip link set "$ifname" down

  # 3. the daemon: real Allocates, a crash in the middle of a bind, recovery at start
  echo "guest: starting the daemon scenario after $((SECONDS - t0)) s"
  python3 -c "$GUEST_DAEMON_SCENARIO" "$NIC" "$NIC_GROUP" "$EDU" "$EDU_GROUP" || G_FAILS=$((G_FAILS + 1))

  # 3b. the same PCI backend as a DRA driver: a claim binds edu, unprepare gives it back
  echo "guest: starting the DRA scenario after $((SECONDS - t0)) s"
  ip link set lo up # the API-server stand-in listens on 127.0.0.1
  python3 -c "$GUEST_DRA_SCENARIO" "$EDU" "$EDU_GROUP" || G_FAILS=$((G_FAILS + 1))

  # 4. back to the original drivers
  echo "guest: unbinding after $((SECONDS - t0)) s"
  check "cdiplug vfio unbind $NIC" cdiplug vfio unbind "$NIC"
  check "$NIC is back on e1000e" test "$(driver_of "$NIC")" = e1000e
  check "$NIC has its network interface again" test -d "/sys/bus/pci/devices/$NIC/net"
  check "$NIC has no driver_override" test "$(cat "/sys/bus/pci/devices/$NIC/driver_override")" = "(null)"
  check "cdiplug vfio unbind $EDU" cdiplug vfio unbind "$EDU"
  check "$EDU is back on no driver" test "$(driver_of "$EDU")" = none
  check "/dev/vfio/$EDU_GROUP is gone" test ! -e "/dev/vfio/$EDU_GROUP"
  check "nothing is left recorded" test -z "$(ls /tmp/state/pci/bound)"

  echo "guest: restored after $((SECONDS - t0)) s"
  # 5. the script for real nodes, on this real kernel
  if CDIPLUG_STATE_DIR=/tmp/state-hack "$CDIPLUG_REPO/hack/vfio-bind-test.sh" "$NIC" | sed 's/^PASS/  pass/; s/^FAIL/  fail/'; then
    pass "hack/vfio-bind-test.sh $NIC"
  else
    fail "hack/vfio-bind-test.sh $NIC"
  fi
  echo "guest: done in $((SECONDS - t0)) s, $G_FAILS failed"
  [[ $G_FAILS == 0 ]]
}

GUEST_CHECK_DISCOVER='
import json, sys
nic, nic_group, edu, edu_group, sata = sys.argv[1:]
data = json.load(open("/tmp/discover.json"))
fails = 0
def ok(cond, what):
    global fails
    print(("PASS: " if cond else "FAIL: ") + what)
    fails += not cond
for res, addr, group in (("example.com/nic-vfio", nic, nic_group), ("example.com/edu", edu, edu_group)):
    devs = {d["id"]: d for d in data[res]["devices"]}
    d = devs.get(addr, {})
    ok(d.get("prepare_group") == group and d.get("device_nodes") == [f"/dev/vfio/{group}"],
       f"discover: {res} advertises {addr} with /dev/vfio/{group}")
    ok(data[res]["common_device_nodes"] == ["/dev/vfio/vfio"], f"discover: {res} gives /dev/vfio/vfio")
skipped = {s["id"]: s["reason"] for s in data["example.com/sata"]["skipped"]}
if sata != "none":
    ok(not data["example.com/sata"]["devices"] and "IOMMU group" in skipped.get(sata, ""),
       f"discover: the AHCI function {sata} is skipped: {skipped.get(sata)}")
sys.exit(1 if fails else 0)
'

GUEST_DAEMON_SCENARIO='
import asyncio, os, signal, subprocess, sys, time
from pathlib import Path
from cdiplug.testing import KubeletStandIn, PodResourcesStandIn

nic, nic_group, edu, edu_group = sys.argv[1:]
fails = 0
def ok(cond, what):
    global fails
    print(("PASS: " if cond else "FAIL: ") + what, flush=True)
    fails += not cond

def driver(addr):
    link = Path(f"/sys/bus/pci/devices/{addr}/driver")
    return link.resolve().name if link.is_symlink() else None

def daemon(env=None):
    return subprocess.Popen(["cdiplug", "serve"], env={**os.environ, **(env or {})}, stderr=subprocess.PIPE, text=True)

async def registered(kubelet, resource, count, timeout=90):
    await kubelet.wait_until(
        lambda: sum(r.resource == resource for r in kubelet.registrations) >= count and kubelet.is_registered(resource),
        timeout, f"{resource} registration {count}")

async def scenario(kubelet, podres, procs):
    # The pod that gets edu, as the PodResources API of the kubelet will list it.
    podres.hold("default", "vm-edu", "compute", "example.com/edu", [edu])
    proc = daemon({"CDIPLUG_PCI_PAUSE_AFTER": "unbind"})
    procs.append(proc)
    await registered(kubelet, "example.com/edu", 1)
    await registered(kubelet, "example.com/nic-vfio", 1)
    pod = await kubelet.admit_pod("vm-edu", {"example.com/edu": 1})
    specs = [n.path for n in pod.device_specs]
    ok(pod.admitted, f"Allocate of edu admitted the pod ({pod.phase.value} {pod.message})")
    ok(f"/dev/vfio/{edu_group}" in specs and "/dev/vfio/vfio" in specs, f"the answer gives DeviceSpecs {specs}")
    env = pod.env.get("PCI_RESOURCE_EXAMPLE_COM_EDU")
    ok(env == edu, f"the answer gives env PCI_RESOURCE_EXAMPLE_COM_EDU={env}")
    ok(pod.cdi_devices == (f"example.com/edu={edu}",), f"the answer gives CDI device {pod.cdi_devices}")
    ok(driver(edu) == "vfio-pci", f"edu {edu} is on vfio-pci ({driver(edu)})")
    ok(Path(f"/dev/vfio/{edu_group}").exists(), f"/dev/vfio/{edu_group} exists")
    ok(Path("/tmp/state/pci/bound", f"{edu}.json").exists(), "the original driver of edu is recorded")
    again = await kubelet.allocate("example.com/edu", [edu])
    ok(driver(edu) == "vfio-pci" and again[0].device_ids == (edu,), "a repeated Allocate for edu answers again")

    # The crash: this daemon pauses right after an unbind step (edu, driverless, had none) and
    # is killed there, in the middle of binding the NIC.
    allocate = asyncio.create_task(kubelet.allocate("example.com/nic-vfio", [nic]))
    loop = asyncio.get_running_loop()
    paused = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = await loop.run_in_executor(None, proc.stderr.readline)
        if not line:
            break
        if "cdiplug-test-hook: paused after unbind" in line:
            paused = True
            break
    ok(paused, "the daemon paused right after unbinding the NIC")
    proc.kill()
    proc.wait()
    try:
        await allocate
        ok(False, "the Allocate to the killed daemon failed")
    except Exception as exc:
        ok(True, f"the Allocate to the killed daemon failed ({type(exc).__name__})")
    journal = Path("/tmp/state/pci/journal", f"{nic_group}.json")
    ok(driver(nic) is None, f"after SIGKILL the NIC has no driver ({driver(nic)})")
    ok(journal.exists(), f"after SIGKILL the journal holds the half-done bind ({journal.name})")

    proc = daemon()
    procs.append(proc)
    await registered(kubelet, "example.com/nic-vfio", 2)
    ok(driver(nic) == "vfio-pci", f"at start the daemon finished the bind: the NIC is on {driver(nic)}")
    ok(not journal.exists(), "the journal entry is gone")
    ok(Path(f"/dev/vfio/{nic_group}").exists(), f"/dev/vfio/{nic_group} exists")
    pod = await kubelet.admit_pod("vm-nic", {"example.com/nic-vfio": 1})
    specs = [n.path for n in pod.device_specs]
    ok(pod.admitted and f"/dev/vfio/{nic_group}" in specs, f"Allocate of the NIC after recovery: {pod.phase.value} {specs}")
    ok(driver(edu) == "vfio-pci", "edu stays on vfio-pci while PodResources lists its pod")
    podres.release_pod("default", "vm-edu")
    kubelet.remove_pod("vm-edu")
    deadline = time.monotonic() + 40
    while driver(edu) is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # the daemon asks PodResources every second; nothing to await here
    ok(driver(edu) is None, f"release: restore gave edu back to no driver once no pod held it ({driver(edu)})")
    ok(not Path(f"/dev/vfio/{edu_group}").exists(), f"/dev/vfio/{edu_group} went away with it")
    proc.send_signal(signal.SIGTERM)
    ok(proc.wait(timeout=60) == 0, "the daemon stops cleanly on SIGTERM")

async def main():
    procs = []
    async with KubeletStandIn("/tmp/kubelet", call_timeout=90) as kubelet, \
            PodResourcesStandIn("/tmp/pod-resources.sock") as podres:
        try:
            await scenario(kubelet, podres, procs)
        except Exception as exc:
            ok(False, f"daemon scenario: {type(exc).__name__}: {exc}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()

asyncio.run(main())
sys.exit(1 if fails else 0)
'

GUEST_DRA_SCENARIO='
import asyncio, collections, json, os, queue, signal, subprocess, sys, threading
from pathlib import Path
from cdiplug.config import parse_config
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_kubelet import ClaimRef
from cdiplug.models.world import World

edu, edu_group = sys.argv[1:]
DRIVER = "edu.example.com"
UID = "0e0e0e0e-0000-4000-8000-000000000001"
fails = 0
def ok(cond, what):
    global fails
    print(("PASS: " if cond else "FAIL: ") + what, flush=True)
    fails += not cond

def driver(addr):
    link = Path(f"/sys/bus/pci/devices/{addr}/driver")
    return link.resolve().name if link.is_symlink() else None

EDU_SELECTOR = {"vendor": "0x1234", "device": "0x11e8"}
CONFIG = {"resources": [{"name": "example.com/edu", "backend": "pci", "api": "dra",
                         "options": {"selectors": [EDU_SELECTOR], "vfio": True, "release": "restore"}}]}

async def main():
    async with ApiServerStandIn() as api, DraKubeletStandIn(Path("/tmp/reg"), timeout=90) as kubelet:
        api.put_node("vm")
        # The daemon in this process (a second interpreter costs many seconds under TCG); the
        # folders of the earlier scenario, its own kubelet folder and the DRA folders.
        world = World(kubelet_dir="/tmp/kubelet-dra", cdi_dir="/tmp/cdi", state_dir="/tmp/state",
                      pod_resources_socket="/tmp/pod-resources-dra.sock", plugins_registry_dir="/tmp/reg",
                      plugins_dir="/tmp/plugins", node_name="vm", kubeconfig=api.kubeconfig(Path("/tmp/kubeconfig")))
        async with running_daemon(parse_config(CONFIG, "vm-dra"), world) as daemon:
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 90)
            ok(True, "DRA: the PCI backend registered as DRA driver edu.example.com")
            await asyncio.wait_for(api.wait_for(lambda: bool(api.slices(spec__driver=DRIVER))), 60)
            (device,) = api.slices(spec__driver=DRIVER)[0]["spec"]["devices"]
            attrs, name = device["attributes"], device["name"]
            root = attrs.get("resource.kubernetes.io/pcieRoot")
            ok(attrs["id"] == {"string": edu} and root is not None, f"DRA: edu published as {name} with id and pcieRoot {root}")
            results = [{"request": "edu", "driver": DRIVER, "pool": "vm", "device": device["name"]}]
            api.put_claim({"metadata": {"name": "vm-edu", "namespace": "default", "uid": UID},
                           "status": {"allocation": {"devices": {"results": results}}}})
            ref = ClaimRef("default", "vm-edu", UID)
            answer = (await conn.prepare([ref]))[UID]
            ok(not answer.error and driver(edu) == "vfio-pci", f"DRA: prepare bound edu to {driver(edu)} {answer.error}")
            spec = json.loads(Path(f"/tmp/cdi/cdiplug-claim-{UID}.json").read_text())
            nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
            ok(f"/dev/vfio/{edu_group}" in nodes, f"DRA: the claim spec gives /dev/vfio/{edu_group} ({nodes})")
            ok(f"PCI_RESOURCE_EXAMPLE_COM_EDU={edu}" in spec["containerEdits"]["env"], "DRA: the claim spec gives PCI_RESOURCE_EXAMPLE_COM_EDU")
            errors = await conn.unprepare([ref])
            ok(errors == {UID: ""} and driver(edu) is None,
               f"DRA: unprepare with release: restore gave edu back to no driver ({driver(edu)}) {errors}")
            ok(not Path(f"/tmp/cdi/cdiplug-claim-{UID}.json").exists(), "DRA: unprepare removed the claim spec")
            # A claim configured vfio: false (PciConfig): edu keeps its host driver (none here, as
            # QEMU has no driver for it), nothing is bound, no /dev/vfio in its spec, nothing released.
            uid2 = "0e0e0e0e-0000-4000-8000-000000000002"
            params = {"apiVersion": "cdiplug.dev/v1alpha1", "kind": "PciConfig", "vfio": False}
            config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]
            api.put_claim({"metadata": {"name": "vm-edu-host", "namespace": "default", "uid": uid2},
                           "status": {"allocation": {"devices": {"results": results, "config": config}}}})
            ref2 = ClaimRef("default", "vm-edu-host", uid2)
            answer = (await conn.prepare([ref2]))[uid2]
            ok(not answer.error and driver(edu) is None and not Path(f"/dev/vfio/{edu_group}").exists(),
               f"DRA vfio: false: prepare kept edu on its host driver, nothing bound ({driver(edu)}) {answer.error}")
            text = Path(f"/tmp/cdi/cdiplug-claim-{uid2}.json").read_text()
            env_name = "PCI_DEVICE_" + edu.upper().replace(":", "_").replace(".", "_")
            ok("/dev/vfio" not in text and f"{env_name}={edu}" in text,
               f"DRA vfio: false: the claim spec gives {env_name} and no /dev/vfio")
            errors = await conn.unprepare([ref2])
            ok(errors == {uid2: ""} and driver(edu) is None and not Path(f"/tmp/cdi/cdiplug-claim-{uid2}.json").exists(),
               f"DRA vfio: false: unprepare released nothing and removed the spec ({driver(edu)}) {errors}")
            # An admin-access claim (monitoring): no bind, no VFIO group node, marked in its env.
            uid3 = "0e0e0e0e-0000-4000-8000-000000000003"
            admin = [dict(results[0], adminAccess=True)]
            api.put_claim({"metadata": {"name": "vm-edu-admin", "namespace": "default", "uid": uid3},
                           "status": {"allocation": {"devices": {"results": admin}}}})
            ref3 = ClaimRef("default", "vm-edu-admin", uid3)
            answer = (await conn.prepare([ref3]))[uid3]
            text = Path(f"/tmp/cdi/cdiplug-claim-{uid3}.json").read_text()
            ok(not answer.error and driver(edu) is None and "/dev/vfio" not in text and "CDIPLUG_ADMIN_ACCESS=true" in text,
               f"DRA admin access: edu not bound, no /dev/vfio, CDIPLUG_ADMIN_ACCESS=true ({driver(edu)}) {answer.error}")
            errors = await conn.unprepare([ref3])
            ok(errors == {uid3: ""} and driver(edu) is None, f"DRA admin access: unprepare released nothing ({driver(edu)}) {errors}")
        ok(daemon.result() == 0, "DRA: the daemon stopped cleanly")
        await kill_before_completed(api)

class DaemonLog:
    """The stderr of a daemon process, read by a thread from its start: a pipe nobody reads fills up
    and stops the daemon at its next log line. The last lines are kept to say where it stood."""

    def __init__(self, proc):
        self.lines, self.last = queue.Queue(), collections.deque(maxlen=20)
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc):
        for line in proc.stderr:
            self.last.append(line.rstrip())
            self.lines.put(line)
        self.lines.put(None)

    async def line_with(self, text, timeout=120):
        """Until a line holds text (False if the daemon ended first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            try:
                line = await asyncio.to_thread(self.lines.get, True, 0.5)
            except queue.Empty:
                continue
            if line is None:
                return False
            if text in line:
                return True
        print(f"no line with {text!r} within {timeout} s; the daemon said last:", *self.last, sep="\n  ", flush=True)
        raise TimeoutError(text)

    def tail(self):
        print("the daemon said last:", *self.last, sep="\n  ", flush=True)

async def kill_before_completed(api):
    # A real daemon process, killed with SIGKILL after the backend bound edu for a claim and
    # before PrepareCompleted; the next daemon rolls the claim back at start (never prepared again).
    Path("/tmp/dra-kill.json").write_text(json.dumps(CONFIG))
    args = ["cdiplug", "serve", "--config", "/tmp/dra-kill.json", "--kubelet-dir", "/tmp/kubelet-dra",
            "--cdi-dir", "/tmp/cdi", "--state-dir", "/tmp/state", "--plugins-registry-dir", "/tmp/reg-kill",
            "--plugins-dir", "/tmp/plugins", "--node-name", "vm", "--kubeconfig", "/tmp/kubeconfig",
            "--pod-resources-socket", "/tmp/pod-resources-dra.sock"]
    uid = "0e0e0e0e-0000-4000-8000-000000000002"
    results = [{"request": "edu", "driver": DRIVER, "pool": "vm", "device": api.slices(spec__driver=DRIVER)[0]["spec"]["devices"][0]["name"]}]
    api.put_claim({"metadata": {"name": "vm-edu-kill", "namespace": "default", "uid": uid},
                   "status": {"allocation": {"devices": {"results": results}}}})
    ref = ClaimRef("default", "vm-edu-kill", uid)
    async with DraKubeletStandIn(Path("/tmp/reg-kill"), timeout=90) as kubelet:
        proc = subprocess.Popen(args, env={**os.environ, "CDIPLUG_DRA_PAUSE_AFTER": "prepared"}, stderr=subprocess.PIPE, text=True)
        log = DaemonLog(proc)
        try:
            try:
                conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 120)
            except TimeoutError:
                log.tail()
                raise
            call = asyncio.create_task(conn.prepare([ref]))
            paused = await log.line_with("cdiplug-test-hook: DRA paused after prepared")
            ok(paused and driver(edu) == "vfio-pci", f"DRA kill: the daemon paused after the backend bound edu ({driver(edu)})")
            state = json.loads(Path("/tmp/state/dra-claims.json").read_text())["claims"][uid]["state"]
            ok(state == "PrepareStarted", f"DRA kill: the checkpoint holds the claim as {state}")
        finally:
            proc.kill()
            proc.wait()
        await asyncio.gather(call, return_exceptions=True)
        await conn.close()
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        log = DaemonLog(proc)
        try:
            rolled = await log.line_with("rolled back claim default/vm-edu-kill")
            ok(rolled and driver(edu) is None,
               f"DRA kill: after SIGKILL before PrepareCompleted the restarted daemon gave edu back to no driver ({driver(edu)})")
            left = json.loads(Path("/tmp/state/dra-claims.json").read_text())["claims"]
            ok(uid not in left and not Path(f"/tmp/cdi/cdiplug-claim-{uid}.json").exists(), "DRA kill: the claim is forgotten, no spec left")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

try:
    asyncio.run(main())
except Exception as exc:
    ok(False, f"DRA scenario: {type(exc).__name__}: {exc}")
sys.exit(1 if fails else 0)
'

if [[ ${1:-} == --guest ]]; then
  guest_main
else
  host_main "$@"
fi
