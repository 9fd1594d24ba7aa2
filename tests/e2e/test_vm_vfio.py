"""End to end with a REAL kernel: hack/vm-vfio-test.sh boots Debian's 6.1 kernel under QEMU (TCG, q35,
emulated Intel IOMMU, an edu and an e1000e device) and runs cdiplug in the guest against real
sysfs and /dev/vfio: discover, a refused bind of an interface in use, Allocates through the daemon
and the kubelet stand-in, SIGKILL in the middle of a bind and recovery at the next start, and
``release: restore`` through a PodResources stand-in, edu as a DRA driver (a claim's prepare binds
it, its unprepare gives it back; a claim configured ``vfio: false`` keeps it off vfio-pci with no
/dev/vfio in its spec, an admin-access claim binds nothing and gets no /dev/vfio; a daemon process killed with SIGKILL after the bind and before
PrepareCompleted, and the next daemon giving edu back at start), ``cdiplug vfio unbind`` back to the original
drivers, and hack/vfio-bind-test.sh. The script prints PASS/FAIL lines; this test
fails on any FAIL, on a missing PASS line, or when qemu, busybox or the kernel is missing (the
kernel package is fetched with ``apt-get download`` into .vm/ when not cached there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "vm-vfio-test.sh"
# The whole run, boot included, bounds a hang, not a slow machine: the guest is done in about 215 s
# on 2 cores here, and a CI machine ran it 2.5 to 3.7 times slower (TCG emulates every instruction:
# discover took 78 s there against 21 s here), which ran past an earlier bound of 360 s.
LIMIT = 900

EXPECTED = [
    "vfio-pci is loaded",
    "discover: example.com/nic-vfio advertises",
    "discover: example.com/edu advertises",
    "discover: the AHCI function",
    "vfio bind refused while eth0 is up with an address",
    "Allocate of edu admitted the pod",
    "the answer gives DeviceSpecs",
    "the answer gives env PCI_RESOURCE_EXAMPLE_COM_EDU=",
    "is on vfio-pci (vfio-pci)",
    "the daemon paused right after unbinding the NIC",
    "after SIGKILL the NIC has no driver",
    "after SIGKILL the journal holds the half-done bind",
    "at start the daemon finished the bind",
    "Allocate of the NIC after recovery: Running",
    "release: restore gave edu back to no driver once no pod held it",
    "DRA: the PCI backend registered as DRA driver",
    "DRA: edu published as",
    "DRA: prepare bound edu to vfio-pci",
    "DRA: the claim spec gives /dev/vfio/",
    "DRA: unprepare with release: restore gave edu back to no driver",
    "DRA vfio: false: prepare kept edu on its host driver, nothing bound",
    "DRA vfio: false: the claim spec gives PCI_DEVICE_",
    "DRA vfio: false: unprepare released nothing and removed the spec",
    "DRA admin access: edu not bound, no /dev/vfio, CDIPLUG_ADMIN_ACCESS=true",
    "DRA admin access: unprepare released nothing",
    "DRA kill: the daemon paused after the backend bound edu",
    "DRA kill: the checkpoint holds the claim as PrepareStarted",
    "DRA kill: after SIGKILL before PrepareCompleted the restarted daemon gave edu back to no driver",
    "DRA kill: the claim is forgotten, no spec left",
    "is back on e1000e",
    "has its network interface again",
    "is back on no driver",
    "nothing is left recorded",
]


@pytest.mark.timeout(LIMIT + 60)
def test_vfio_binding_in_a_real_kernel() -> None:
    missing = [tool for tool in ("qemu-system-x86_64", "busybox") if shutil.which(tool) is None]
    assert not missing, f"the VM test needs {', '.join(missing)} (apt-get install qemu-system-x86 busybox-static)"
    cached = (REPO / ".vm" / "vmlinuz-6.1.0-57-amd64").exists() or os.environ.get("CDIPLUG_VM_KERNEL_DEB")
    assert cached or (shutil.which("apt-get") and shutil.which("dpkg-deb")), (
        "no cached kernel in .vm/ and no apt-get/dpkg-deb to fetch linux-image-6.1.0-57-amd64"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [str(SCRIPT)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        timeout=LIMIT + 30,
        # The guest runs this very interpreter, the one with cdiplug installed.
        env={**os.environ, "CDIPLUG_VM_TIMEOUT": str(LIMIT - 10), "PYTHON": sys.executable},
    )
    took = time.monotonic() - started
    output = proc.stdout
    lines = [line.strip() for line in output.splitlines()]
    fails = [line for line in lines if line.startswith("FAIL")]
    passes = [line for line in lines if line.startswith("PASS")]
    tail = "\n".join(output.splitlines()[-60:])
    assert not fails, "the VM test failed:\n" + "\n".join(fails) + "\n--- last lines ---\n" + tail
    absent = [e for e in EXPECTED if not any(e in p for p in passes)]
    assert not absent, f"missing PASS lines: {absent}\n--- last lines ---\n{tail}"
    assert proc.returncode == 0, f"hack/vm-vfio-test.sh exited {proc.returncode}\n{tail}"
    assert took < LIMIT, f"the VM test took {took:.0f} s (limit {LIMIT} s)"
