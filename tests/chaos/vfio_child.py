"""The child of the VFIO kill test: binds and restores one IOMMU group of a fake sysfs tree in a
loop, saying ``wrote N`` on stdout after each write the fake kernel took, then pausing, so that the
parent's SIGKILL lands after a write and before the next step (a real kernel's write is atomic;
the fake kernel's is several file operations, which a kill must not split).

Usage: ``python vfio_child.py SYSFS DEV STATE``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cdiplug_backends.pci.journal import Journal
from cdiplug_backends.pci.sysfs import PciSysfs
from cdiplug_backends.pci.testing import FakeSysfsKernel, SysfsTree
from cdiplug_backends.pci.vfio import VfioBinder

GROUP, VF = "40", "0000:3b:02.0"


def main() -> None:
    sysfs, dev, state = (Path(a) for a in sys.argv[1:4])
    kernel = FakeSysfsKernel(SysfsTree(sysfs, dev))
    writes = 0

    def after_write(_path: str, _value: str) -> None:
        nonlocal writes
        writes += 1
        print(f"wrote {writes}", flush=True)
        time.sleep(0.05)

    kernel.on_write = after_write
    binder = VfioBinder(PciSysfs(sysfs), Journal(state), dev, kernel, verify_timeout=0.2)
    binder.recover()
    while True:
        binder.bind_group(GROUP, [VF], resource="example.com/vf")
        binder.restore_group(GROUP, [VF])


if __name__ == "__main__":
    main()
