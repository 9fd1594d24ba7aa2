"""End to end with a REAL kernel and real USB devices: hack/vm-usb-test.sh boots Debian's 6.1
kernel under QEMU (TCG) with an xHCI controller, an FTDI serial adapter with a serial number, a
keyboard, a memory stick and a sound card, plus a configfs gadget on dummy_hcd in the guest, and runs
cdiplug's generic backend there: discover finds each by vendor/product/serial with its class
nodes; through the daemon and the kubelet stand-in, Allocate gives ttyUSB0 and the raw usbfs node
with their numbers in the CDI spec; device_del through the QEMU monitor makes the adapter
Unhealthy, device_add Healthy again under the same ID with the raw node's new minor in the next
Allocate; the gadget's UDC unbind makes it Unhealthy (timed; 5 s bounds a hang under TCG), bind Healthy again. One boot
for all of it. Fails on any FAIL, a missing PASS, or a missing qemu, busybox or kernel.
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
SCRIPT = REPO / "hack" / "vm-usb-test.sh"
LIMIT = 600  # bounds a hang: the guest is done in about two minutes here

EXPECTED = [
    "discover: example.com/usb-serial finds one device",
    "discover: example.com/usb-kbd finds one device",
    "discover: example.com/usb-stick finds one device",
    "discover: example.com/usb-audio finds one device",
    "discover: example.com/usb-gadget finds one device",
    "has its raw node and tty nodes",
    "has its raw node and hidraw nodes",
    "has its raw node and block nodes",
    "has its raw node and sound nodes",
    "the serial adapter's ID is vendor-product-serial",
    "the gadget's ID is vendor-product-serial",
    "Allocate of the serial adapter gives ttyUSB0 and the raw node",
    "the CDI spec gives both with type, major and minor",
    "device_del: usb-0403-6001-FTSN0001 Unhealthy at the kubelet",
    "device_add: usb-0403-6001-FTSN0001 Healthy again under the same ID",
    "replugged: the next Allocate's spec has the raw node's new number",
    "the gadget's spec gives ttyACM0 and its raw node",
    "UDC unbind: usb-1209-000f-CDIPLUG-SN-1 Unhealthy at the kubelet within",
    "UDC bind: usb-1209-000f-CDIPLUG-SN-1 Healthy again under the same ID",
    "the gadget replugged: the next Allocate's spec has the raw node's new number",
]


@pytest.mark.timeout(LIMIT + 60)
def test_usb_devices_in_a_real_kernel() -> None:
    missing = [tool for tool in ("qemu-system-x86_64", "busybox") if shutil.which(tool) is None]
    assert not missing, f"the VM test needs {', '.join(missing)} (apt-get install qemu-system-x86 busybox-static)"
    started = time.monotonic()
    proc = subprocess.run(
        [str(SCRIPT)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        timeout=LIMIT + 30,
        env={**os.environ, "CDIPLUG_VM_TIMEOUT": str(LIMIT - 10), "PYTHON": sys.executable},
    )
    took = time.monotonic() - started
    lines = [line.strip() for line in proc.stdout.splitlines()]
    fails = [line for line in lines if line.startswith("FAIL")]
    passes = [line for line in lines if line.startswith("PASS")]
    tail = "\n".join(proc.stdout.splitlines()[-60:])
    assert not fails, "the VM test failed:\n" + "\n".join(fails) + "\n--- last lines ---\n" + tail
    absent = [e for e in EXPECTED if not any(e in p for p in passes)]
    assert not absent, f"missing PASS lines: {absent}\n--- last lines ---\n{tail}"
    assert proc.returncode == 0, f"hack/vm-usb-test.sh exited {proc.returncode}\n{tail}"
    assert took < LIMIT, f"the VM test took {took:.0f} s (limit {LIMIT} s)"
