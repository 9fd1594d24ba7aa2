"""Properties of the generic backend's matching on fake trees: whatever USB devices are plugged,
each selected device has one stable ID (from its identity, never its bus or device number), carries
its raw node and its class nodes, and no node is given to two devices."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cdiplug_backends.generic.discovery import scan
from cdiplug_backends.generic.nodes import DevRoot
from cdiplug_backends.generic.options import GenericOptions, Group, UsbSelector
from cdiplug_backends.generic.testing import ClassNode, FakeDev, UsbTree

serials = st.one_of(st.none(), st.text(alphabet="ABCDEF0123456789", min_size=1, max_size=8))
devices = st.lists(
    st.tuples(st.sampled_from(["0403", "0627", "1209"]), serials, st.integers(2, 120)), max_size=6, unique_by=lambda t: t[2]
)


@settings(max_examples=40, deadline=None)
@given(devices)
def test_each_usb_device_is_one_device_with_its_nodes_and_an_identity_id(plugged: list[tuple[str, str | None, int]]) -> None:
    root = Path(tempfile.mkdtemp())
    try:
        usb = UsbTree(root / "sys", FakeDev(root / "dev"))
        expected = {}
        for i, (vendor, serial, devnum) in enumerate(plugged):
            port = f"1-{i + 1}"
            usb.plug(port, vendor, "0001", serial=serial, devnum=devnum, nodes=[ClassNode("tty", f"ttyUSB{i}", 188, i)])
            expected[port] = (vendor, serial)
        options = GenericOptions(groups=(Group(usb=(UsbSelector(vendor="*"),)),))
        result = scan(options, DevRoot(root / "dev"), root / "sys")
        nodes = [n.path for f in result.found for n in f.edits.device_nodes]
        assert len(nodes) == len(set(nodes))
        for found in result.found:
            attributes = dict(found.attributes)
            port = attributes["port"]
            vendor, serial = expected[port]
            assert found.id == (f"usb-{vendor}-0001-{serial}" if serial else f"usb-{vendor}-0001-port-{port}")
            assert any(n.path.startswith("/dev/bus/usb/") for n in found.edits.device_nodes)
            assert any(n.path.startswith("/dev/ttyUSB") for n in found.edits.device_nodes)
        duplicates = len(expected) - len(result.found)
        assert duplicates == len([s for s in result.skipped if "the same device" in s[1]])
    finally:
        shutil.rmtree(root, ignore_errors=True)
