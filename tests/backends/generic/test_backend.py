"""The generic backend over a fake /dev and a fake USB sysfs tree: groups of paths as one device,
USB devices by identity with their class nodes, hotplug through a fake udev monitor (unplugged:
listed Unhealthy with the cause unplugged; replugged: Healthy under the same ID with the new minor
at the next prepare), count as slots or as DRA capacity, and what discover explains."""

from __future__ import annotations

import asyncio

import pytest

from cdiplug.errors import PreparationError
from cdiplug.models.world import World
from cdiplug_backends.generic.testing import ClassNode, FakeDev, FakeUdevMonitor, UsbTree

from .conftest import make_backend, plug_serial, running

SERIAL = ("example.com/serial", {"groups": [{"usb": [{"vendor": "0403", "product": "6001"}]}]})


def nodes(device) -> dict[str, tuple]:
    return {n.path: (n.host_path, n.type, n.major, n.minor) for n in device.edits.device_nodes}


async def test_a_group_of_paths_is_one_device_with_every_node_it_matches(world: World, dev: FakeDev) -> None:
    for i, name in enumerate(["controlC0", "pcmC0D0p", "pcmC0D0c"]):
        dev.node(f"/dev/snd/{name}", 116, i)
    dev.node("/dev/fuse", 10, 229)
    backend = make_backend(
        world, [("example.com/sound", {"groups": [{"paths": [{"path": "/dev/snd/*"}]}, {"paths": [{"path": "/dev/fuse"}]}]})]
    )
    async with running(backend) as sink:
        snap = sink.latest["example.com/sound"]
        assert snap.ids == ("fuse", "snd")
        assert nodes(snap.get("snd"))["/dev/snd/pcmC0D0c"][1:] == ("c", 116, 2)
        assert len(snap.get("snd").edits.device_nodes) == 3
        assert any(
            "groups[0].paths[0] /dev/snd/*" == w and "matched /dev/snd/controlC0 (c 116:0)" in f for w, f in snap.explained
        )


async def test_a_symlink_path_gives_its_real_node_with_type_major_and_minor(world: World, dev: FakeDev) -> None:
    dev.node("/dev/ttyUSB0", 188, 0)
    dev.link("/dev/serial/by-id/usb-FTDI-if00", "/dev/ttyUSB0")
    backend = make_backend(
        world, [("example.com/modem", {"groups": [{"paths": [{"path": "/dev/serial/by-id/*", "mount_path": "/dev/modem"}]}]})]
    )
    async with running(backend) as sink:
        (device,) = sink.latest["example.com/modem"].devices
        assert nodes(device) == {"/dev/modem": ("/dev/ttyUSB0", "c", 188, 0)}  # the node path, as the runtime sees it


async def test_a_missing_path_skips_its_group_unless_optional_and_discover_says_why(world: World, dev: FakeDev) -> None:
    dev.node("/dev/fuse", 10, 229)
    specs = {
        "groups": [
            {"paths": [{"path": "/dev/video*"}]},
            {"paths": [{"path": "/dev/fuse"}, {"path": "/dev/net/tun", "optional": True}]},
        ]
    }
    backend = make_backend(world, [("example.com/xx", specs)])
    async with running(backend) as sink:
        snap = sink.latest["example.com/xx"]
        assert snap.ids == ("fuse",)
        assert dict(snap.skipped) == {"video": "groups[0]: /dev/video* matched nothing"}
        assert ("groups[1].paths[1] /dev/net/tun", "matched nothing (optional)") in snap.explained


async def test_a_node_two_groups_match_goes_to_the_first(world: World, dev: FakeDev) -> None:
    dev.node("/dev/ttyS0", 4, 64)
    backend = make_backend(
        world, [("example.com/xx", {"groups": [{"paths": [{"path": "/dev/ttyS*"}]}, {"paths": [{"path": "/dev/tty[S]0"}]}]})]
    )
    async with running(backend) as sink:
        snap = sink.latest["example.com/xx"]
        assert snap.ids == ("ttyS",)
        assert "claimed by groups[0]" in dict(snap.skipped)["tty"]


async def test_a_usb_device_comes_with_its_raw_node_and_class_nodes_and_typed_attributes(world: World, usb: UsbTree) -> None:
    plug_serial(usb)
    usb.plug(
        "1-2",
        "0627",
        "0001",
        devnum=3,
        nodes=[ClassNode("hidraw", "hidraw0", 245, 0), ClassNode("input", "input/event3", 13, 67)],
    )
    backend = make_backend(world, [SERIAL, ("example.com/hid", {"groups": [{"usb": [{"vendor": "0627"}]}]})])
    async with running(backend) as sink:
        (serial,) = sink.latest["example.com/serial"].devices
        assert serial.id == "usb-0403-6001-FTSN0001"
        assert nodes(serial) == {
            "/dev/bus/usb/001/002": ("/dev/bus/usb/001/002", "c", 189, 1),
            "/dev/ttyUSB0": ("/dev/ttyUSB0", "c", 188, 0),
        }
        assert (
            dict(serial.attributes).items()
            >= {"vendor": "0403", "product": "6001", "serial": "FTSN0001", "port": "1-1", "nodeClasses": "tty"}.items()
        )
        (hid,) = sink.latest["example.com/hid"].devices
        assert hid.id == "usb-0627-0001-port-1-2"  # no serial: the port path
        assert set(nodes(hid)) == {"/dev/bus/usb/001/003", "/dev/hidraw0", "/dev/input/event3"}


async def test_unplugged_stays_listed_unhealthy_and_replugged_is_healthy_with_the_new_minor(
    world: World, usb: UsbTree, monitor: FakeUdevMonitor
) -> None:
    plug_serial(usb, devnum=2)
    backend = make_backend(world, [SERIAL], udev_monitor=monitor)
    device_id = "usb-0403-6001-FTSN0001"
    async with running(backend) as sink:
        usb.unplug("1-1")
        monitor.emit("remove", "1-1", "usb")
        snap = await sink.until("example.com/serial", lambda s: not s.get(device_id).healthy)
        assert snap.get(device_id).cause.name == "unplugged"
        with pytest.raises(PreparationError, match="unplugged"):
            await backend.prepare("example.com/serial", [snap.get(device_id)])
        plug_serial(usb, port="1-4.3", devnum=8)  # a new port and device number, as a replug gives
        monitor.emit("add", "1-4.3", "usb")
        snap = await sink.until("example.com/serial", lambda s: s.get(device_id).healthy)
        (prepared,) = await backend.prepare("example.com/serial", [snap.get(device_id)])
        assert nodes(prepared)["/dev/bus/usb/001/008"][2:] == (189, 7)
        assert prepared.attribute("port") == "1-4.3"


async def test_a_device_replugged_while_held_is_reported(world: World, usb: UsbTree, monitor: FakeUdevMonitor, caplog) -> None:
    plug_serial(usb, devnum=2)
    backend = make_backend(world, [SERIAL], udev_monitor=monitor)
    device_id = "usb-0403-6001-FTSN0001"
    async with running(backend) as sink:
        await backend.prepare("example.com/serial", [sink.latest["example.com/serial"].get(device_id)])
        usb.unplug("1-1")
        plug_serial(usb, devnum=5)
        monitor.emit("add", "1-1", "usb")
        snap = await sink.until("example.com/serial", lambda s: s.get(device_id).cause is not None)
        assert snap.get(device_id).healthy and snap.get(device_id).cause.name == "nodes-changed"
        assert "nodes-changed" in caplog.text
        await backend.unprepare("example.com/serial", [device_id])
        await sink.until("example.com/serial", lambda s: s.get(device_id).cause is None)


async def test_the_rescan_finds_a_change_without_any_udev_event(world: World, dev: FakeDev) -> None:
    backend = make_backend(
        world, [("example.com/tun", {"groups": [{"paths": [{"path": "/dev/net/tun"}]}], "rescan_interval": 0.05})]
    )
    async with running(backend) as sink:
        assert sink.latest["example.com/tun"].devices == ()
        dev.node("/dev/net/tun", 10, 200)
        await sink.until("example.com/tun", lambda s: s.ids == ("net-tun",))
        dev.remove("/dev/net/tun")
        snap = await sink.until("example.com/tun", lambda s: not s.get("net-tun").healthy)
        assert snap.get("net-tun").cause.name == "unplugged"


async def test_count_is_slots_for_the_device_plugin_and_capacity_for_dra(world: World, dev: FakeDev) -> None:
    dev.node("/dev/fuse", 10, 229)
    fuse = (
        "example.com/fuse",
        {"groups": [{"paths": [{"path": "/dev/fuse"}], "count": 3}], "evict_unplugged": True, "rescan_interval": 0.05},
    )
    async with running(make_backend(world, [fuse])) as sink:
        assert sink.latest["example.com/fuse"].ids == ("fuse-slot0", "fuse-slot1", "fuse-slot2")
    async with running(make_backend(world, [fuse], api="dra")) as sink:
        (device,) = sink.latest["example.com/fuse"].devices
        assert device.sharing.shared and dict(device.capacity) == {"slots": "3"}
        dev.remove("/dev/fuse")
        snap = await sink.until("example.com/fuse", lambda s: not s.devices[0].healthy)
        assert snap.devices[0].cause.evict  # the configuration asks for NoExecute


async def test_a_claim_configuration_places_the_nodes_and_sets_their_mode(world: World, usb: UsbTree) -> None:
    from cdiplug.errors import InvalidRequest
    from cdiplug_backends.generic.claim_config import GenericClaimConfig

    plug_serial(usb)
    backend = make_backend(world, [SERIAL], api="dra")
    async with running(backend) as sink:
        (device,) = sink.latest["example.com/serial"].devices
        config = GenericClaimConfig(
            container_paths={"/dev/ttyUSB0": "/dev/modem"}, permissions="rw", file_mode=0o660, uid=1000, gid=20
        )
        shaped = backend.configure("example.com/serial", device, config).device
        modem = {n.path: n for n in shaped.edits.device_nodes}["/dev/modem"]
        assert (modem.host_path, modem.permissions, modem.file_mode, modem.uid, modem.gid) == (
            "/dev/ttyUSB0",
            "rw",
            0o660,
            1000,
            20,
        )
        with pytest.raises(InvalidRequest, match="has no node /dev/ttyACM0"):
            backend.configure("example.com/serial", device, GenericClaimConfig(container_paths={"/dev/ttyACM0": "/dev/x"}))


async def test_node_labels_name_the_model_never_a_serial_or_a_port(world: World, usb: UsbTree) -> None:
    plug_serial(usb)
    plug_serial(usb, port="1-2", serial="FTSN0002", devnum=3, tty=1)
    backend = make_backend(world, [SERIAL])
    async with running(backend) as sink:
        assert backend.model_labels("example.com/serial", sink.latest["example.com/serial"]) == {
            "vendor": "0403",
            "product": "6001",
        }


async def test_a_removal_is_taken_at_its_word_before_sysfs_catches_up(
    world: World, usb: UsbTree, monitor: FakeUdevMonitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel sends a device's remove event before its sysfs folder is gone: the device is
    # Unhealthy at once, and the rescan a moment later (the folder gone by then) keeps it so.
    from cdiplug_backends.generic import backend as backend_module

    monkeypatch.setattr(backend_module, "SETTLE", 1.0)  # time enough to unplug before the confirming rescan
    plug_serial(usb)
    backend = make_backend(world, [SERIAL], udev_monitor=monitor)
    device_id = "usb-0403-6001-FTSN0001"
    async with running(backend) as sink:
        monitor.emit("remove", "/dev/ttyUSB0", "tty", device_node="/dev/ttyUSB0")
        await sink.until("example.com/serial", lambda s: not s.get(device_id).healthy)
        usb.unplug("1-1")
        before = backend.rescans
        async with asyncio.timeout(5):  # polled with a bound: a rescan that changes nothing publishes nothing
            while backend.rescans == before:
                await asyncio.sleep(0.02)
        assert not sink.latest["example.com/serial"].get(device_id).healthy
