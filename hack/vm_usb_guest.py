"""The guest half of hack/vm-usb-test.sh: cdiplug's generic backend against real USB devices.

Run by the guest (chrooted into the host's root) with the host's Python; prints PASS/FAIL lines
and FIGURE lines (milliseconds), and asks the host for QEMU monitor commands with "VM-REQUEST:".
Argument: the configfs folder of the gadget (its UDC file unplugs and replugs it).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdiplug.config import parse_config
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, running_daemon

SERIAL, KBD, STICK, AUDIO, GADGET = (f"example.com/usb-{n}" for n in ("serial", "kbd", "stick", "audio", "gadget"))
SELECTORS = {
    SERIAL: {"vendor": "0403", "product": "6001", "serial": "FTSN0001"},
    KBD: {"vendor": "0627", "product": "0001"},
    STICK: {"vendor": "46f4", "product": "0001", "serial": "STICK42"},
    AUDIO: {"vendor": "46f4", "product": "0002"},
    GADGET: {"vendor": "1209", "product": "000f", "serial": "CDIPLUG-SN-1"},
}
CLASSES = {SERIAL: "tty", KBD: "hidraw", STICK: "block", AUDIO: "sound", GADGET: "tty"}
# The guest is emulated (TCG: every instruction, on a shared 2-core host): what takes milliseconds
# on a machine (bench/bench_generic.py) takes seconds here. The bound is for a hang, the figure is printed.
UNPLUG_LIMIT_MS = 5000
CONFIG = {"resources": [{"name": n, "backend": "generic", "options": {"groups": [{"usb": [s]}]}} for n, s in SELECTORS.items()]}
fails = 0


def ok(cond: object, what: str) -> bool:
    global fails
    print(("PASS: " if cond else "FAIL: ") + what, flush=True)
    fails += not cond
    return bool(cond)


def figure(name: str, ms: float) -> None:
    print(f"FIGURE: {name} {ms:.0f} ms", flush=True)


def request(command: str) -> None:
    print(f"VM-REQUEST: {command}", flush=True)


def wait_for(predicate: Callable[[], Any], timeout: float, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def discover() -> dict[str, Any]:
    config = Path("/tmp/cdiplug-usb.yaml")
    config.write_text(json.dumps(CONFIG))  # JSON is YAML
    out = subprocess.run(
        ["cdiplug", "discover", "--config", str(config), "-o", "json"], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        print(out.stderr[-2000:])
        return {}
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def spec_nodes(resource: str, device: str) -> dict[str, tuple[str, int, int]]:
    vendor, _, cls = resource.partition("/")
    spec = json.loads(Path(f"/tmp/cdi/cdiplug-{vendor}-{cls}.json").read_text())
    (entry,) = [d for d in spec["devices"] if d["name"] == device]
    return {n["path"]: (n.get("type"), n.get("major"), n.get("minor")) for n in entry["containerEdits"]["deviceNodes"]}


def raw(nodes: dict[str, Any]) -> str | None:
    return next((p for p in nodes if p.startswith("/dev/bus/usb/")), None)


async def health(kubelet: KubeletStandIn, resource: str, device: str, healthy: bool, timeout: float = 20) -> float | None:
    """Milliseconds until the kubelet stand-in sees ``device`` healthy (or not); None on timeout."""
    started = time.monotonic()
    try:
        await kubelet.wait_until(
            lambda: any(d.id == device and d.healthy == healthy for d in kubelet.devices(resource)), timeout=timeout
        )
    except Exception:
        return None
    return (time.monotonic() - started) * 1000


def plugged() -> set[str]:
    """vendor:product of every USB device sysfs shows now (cheap, unlike a discover under TCG)."""
    found = set()
    for folder in Path("/sys/bus/usb/devices").iterdir():
        if (folder / "idVendor").exists():
            found.add(f"{(folder / 'idVendor').read_text().strip()}:{(folder / 'idProduct').read_text().strip()}")
    return found


async def scenario(gadget: Path) -> None:
    wanted = {f"{s['vendor']}:{s['product']}" for s in SELECTORS.values()}
    started = time.monotonic()
    seen = await asyncio.to_thread(wait_for, lambda: wanted <= plugged(), 60)
    print(f"guest: USB devices enumerated after {time.monotonic() - started:.1f} s: {sorted(plugged())}", flush=True)
    ok(seen, f"every emulated USB device enumerated ({sorted(wanted - plugged())} missing)")
    await asyncio.to_thread(wait_for, lambda: Path("/dev/ttyUSB0").exists() and Path("/dev/ttyACM0").exists(), 30)
    started = time.monotonic()
    data = discover()
    print(f"guest: discover took {time.monotonic() - started:.1f} s", flush=True)
    ids: dict[str, str] = {}
    for name in SELECTORS:
        devices = data.get(name, {}).get("devices", [])
        if ok(len(devices) == 1, f"discover: {name} finds one device ({[d['id'] for d in devices]})"):
            device = devices[0]
            ids[name] = device["id"]
            nodes = device["device_nodes"]
            ok(
                raw(dict.fromkeys(nodes)) and device["attributes"].get("nodeClasses", "").find(CLASSES[name]) >= 0,
                f"discover: {name} {device['id']} has its raw node and {CLASSES[name]} nodes: {nodes}",
            )
    ok(ids.get(SERIAL) == "usb-0403-6001-FTSN0001", f"the serial adapter's ID is vendor-product-serial: {ids.get(SERIAL)}")
    ok(ids.get(GADGET) == "usb-1209-000f-CDIPLUG-SN-1", f"the gadget's ID is vendor-product-serial: {ids.get(GADGET)}")
    config = parse_config(CONFIG, "vm-usb-test")
    world = World(
        kubelet_dir="/tmp/kubelet",
        cdi_dir="/tmp/cdi",
        state_dir="/tmp/state",
        sysfs_root="/sys",
        dev_root="/",
        pod_resources_socket="/tmp/pod-resources.sock",
        node_name="vm",
    )
    async with KubeletStandIn(world.kubelet_dir, call_timeout=120) as kubelet, running_daemon(config, world):
        for name in SELECTORS:
            await kubelet.wait_registered(name, timeout=60)
        serial = ids[SERIAL]
        await health(kubelet, SERIAL, serial, True)
        (answer,) = await kubelet.allocate(SERIAL, [serial])
        given = {n.path for n in answer.device_specs}
        before = spec_nodes(SERIAL, serial)
        ok(
            "/dev/ttyUSB0" in given and raw(dict.fromkeys(given)),
            f"Allocate of the serial adapter gives ttyUSB0 and the raw node: {sorted(given)}",
        )
        ok(
            before.get("/dev/ttyUSB0") == ("c", 188, 0) and raw(before) and before[raw(before)][0] == "c",
            f"the CDI spec gives both with type, major and minor: {before}",
        )
        # Unplug through the QEMU monitor, replug with the same serial on a new port.
        request("device_del ser1")
        took = await health(kubelet, SERIAL, serial, False)
        ok(took is not None, f"device_del: {serial} Unhealthy at the kubelet")
        if took is not None:
            figure("device_del -> kubelet sees Unhealthy (includes the host's monitor round trip)", took)
        request("device_add usb-serial,id=ser2,bus=xhci.0,chardev=c2,serial=FTSN0001,always-plugged=on")
        took = await health(kubelet, SERIAL, serial, True, timeout=60)
        ok(took is not None, f"device_add: {serial} Healthy again under the same ID")
        await asyncio.to_thread(wait_for, lambda: Path("/dev/ttyUSB0").exists(), 30)
        (answer,) = await kubelet.allocate(SERIAL, [serial])
        after = spec_nodes(SERIAL, serial)
        ok(
            raw(after) and before.get(raw(before)) != after.get(raw(after)) and "/dev/ttyUSB0" in after,
            f"replugged: the next Allocate's spec has the raw node's new number: {before.get(raw(before))} -> {after.get(raw(after))} ({raw(after)})",
        )
        # The gadget: unplugged and replugged by the guest itself, so the time is the guest's own.
        udc = (gadget / "UDC").read_text().strip()
        g = ids[GADGET]
        (answer,) = await kubelet.allocate(GADGET, [g])
        first = spec_nodes(GADGET, g)
        ok("/dev/ttyACM0" in first, f"the gadget's spec gives ttyACM0 and its raw node: {first}")
        (gadget / "UDC").write_text("\n")
        took = await health(kubelet, GADGET, g, False)
        ok(
            took is not None and took < UNPLUG_LIMIT_MS,
            f"UDC unbind: {g} Unhealthy at the kubelet within {UNPLUG_LIMIT_MS / 1000:g} s ({took} ms)",
        )
        if took is not None:
            figure("gadget unplug -> kubelet sees Unhealthy", took)
        (gadget / "UDC").write_text(udc + "\n")
        took = await health(kubelet, GADGET, g, True, timeout=30)
        ok(took is not None, f"UDC bind: {g} Healthy again under the same ID")
        if took is not None:
            figure("gadget replug -> kubelet sees Healthy", took)
        await asyncio.to_thread(wait_for, lambda: Path("/dev/ttyACM0").exists(), 30)
        (answer,) = await kubelet.allocate(GADGET, [g])
        second = spec_nodes(GADGET, g)
        ok(
            raw(second) and first.get(raw(first)) != second.get(raw(second)),
            f"the gadget replugged: the next Allocate's spec has the raw node's new number: {first.get(raw(first))} -> {second.get(raw(second))}",
        )


def main() -> int:
    try:
        asyncio.run(scenario(Path(sys.argv[1])))
    except Exception as exc:
        ok(False, f"USB scenario: {type(exc).__name__}: {exc}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
