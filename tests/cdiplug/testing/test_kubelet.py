"""The kubelet stand-in itself, against a tiny device plugin written here.

Real gRPC over unix sockets in a short temporary folder: the plugin below is a grpc.aio
DevicePlugin server that records what it is asked and answers from a script, so every kubelet
behaviour of the stand-in (Register checks, ListAndWatch, capacity and allocatable, picking with
GetPreferredAllocation, one Allocate per container, Pending, restart with the folder wiped) is
checked without cdiplug's own daemon.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.models.devices import Health
from cdiplug.testing import KubeletStandIn
from cdiplug.testing.kubelet import CHECKPOINT_FILE, PodPhase, StandInError, is_extended_resource_name

RESOURCE = "example.com/widget"


class TinyPlugin(pb_grpc.DevicePluginServicer):
    """A device plugin with scripted answers: prefers the highest IDs, answers an env var per
    device, refuses unknown IDs with INVALID_ARGUMENT."""

    def __init__(self, folder: Path, ids: Sequence[str], *, preferred: bool = True, pre_start: bool = False) -> None:
        self.folder = folder
        self.endpoint = "tiny.sock"
        self.health = {i: "Healthy" for i in ids}
        self.options = pb.DevicePluginOptions(get_preferred_allocation_available=preferred, pre_start_required=pre_start)
        self.allocate_requests: list[list[list[str]]] = []
        self.preferred_requests: list[tuple[list[str], list[str], int]] = []
        self.pre_starts: list[list[str]] = []
        self.streams_ended = 0
        self.fail_allocate: grpc.StatusCode | None = None
        self._queues: list[asyncio.Queue[pb.ListAndWatchResponse | None]] = []
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix:{self.folder / self.endpoint}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)

    async def register(self, resource: str = RESOURCE, version: str = "v1beta1", endpoint: str | None = None) -> None:
        async with grpc.aio.insecure_channel(f"unix:{self.folder / 'kubelet.sock'}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version=version, endpoint=endpoint or self.endpoint, resource_name=resource, options=self.options
                ),
                timeout=5,
            )

    def _list(self) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(
            devices=[
                pb.Device(ID=i, health=h, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n % 2)]))
                for n, (i, h) in enumerate(sorted(self.health.items()))
            ]
        )

    def set_health(self, device_id: str, health: str) -> None:
        self.health[device_id] = health
        for queue in self._queues:
            queue.put_nowait(self._list())

    def end_streams(self) -> None:
        for queue in self._queues:
            queue.put_nowait(None)

    async def GetDevicePluginOptions(self, request, context):
        return self.options

    async def ListAndWatch(self, request, context) -> AsyncIterator[pb.ListAndWatchResponse]:
        queue: asyncio.Queue[pb.ListAndWatchResponse | None] = asyncio.Queue()
        self._queues.append(queue)
        queue.put_nowait(self._list())
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            self._queues.remove(queue)
            self.streams_ended += 1

    async def GetPreferredAllocation(self, request, context):
        answers = []
        for r in request.container_requests:
            self.preferred_requests.append((list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size))
            answers.append(
                pb.ContainerPreferredAllocationResponse(deviceIDs=sorted(r.available_deviceIDs)[::-1][: r.allocation_size])
            )
        return pb.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(self, request, context):
        self.allocate_requests.append([list(r.devices_ids) for r in request.container_requests])
        if self.fail_allocate is not None:
            await context.abort(self.fail_allocate, "scripted failure")
        responses = []
        for r in request.container_requests:
            unknown = [i for i in r.devices_ids if i not in self.health]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {', '.join(unknown)}")
            responses.append(
                pb.ContainerAllocateResponse(
                    envs={"TINY_DEVICES": ",".join(r.devices_ids)},
                    devices=[
                        pb.DeviceSpec(container_path=f"/dev/{i}", host_path=f"/dev/{i}", permissions="rw") for i in r.devices_ids
                    ],
                    cdi_devices=[pb.CDIDevice(name=f"example.com/widget={i}") for i in r.devices_ids],
                    annotations={"tiny": "yes"},
                )
            )
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request, context):
        self.pre_starts.append(list(request.devices_ids))
        return pb.PreStartContainerResponse()


@pytest.fixture
async def kubelet(short_tmp: Path) -> AsyncIterator[KubeletStandIn]:
    async with KubeletStandIn(short_tmp, dial_timeout=1.0) as kubelet:
        yield kubelet


@pytest.fixture
async def plugin(short_tmp: Path) -> AsyncIterator[TinyPlugin]:
    plugin = TinyPlugin(short_tmp, ["w-0", "w-1", "w-2"])
    await plugin.start()
    yield plugin
    await plugin.stop()


async def test_register_lists_devices_and_counts_capacity(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    registration = await kubelet.wait_registered(RESOURCE, timeout=5)
    assert registration.endpoint == "tiny.sock" and registration.version == "v1beta1"
    assert registration.options.get_preferred_allocation_available
    assert registration.received_at <= registration.connected_at <= (registration.listed_at or 0)
    assert kubelet.capacity(RESOURCE) == kubelet.allocatable(RESOURCE) == 3
    assert [(d.id, d.numa_nodes) for d in kubelet.devices(RESOURCE)] == [("w-0", (0,)), ("w-1", (1,)), ("w-2", (0,))]
    assert kubelet.resources == (RESOURCE,)


async def test_health_change_drops_allocatable_not_capacity(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    await kubelet.wait_registered(RESOURCE)
    plugin.set_health("w-1", "Unhealthy")
    await kubelet.wait_until(lambda: kubelet.allocatable(RESOURCE) == 2, timeout=5)
    assert kubelet.capacity(RESOURCE) == 3
    plugin.set_health("w-1", "Bogus")  # the kubelet counts anything but "Healthy" as unhealthy
    plugin.set_health("w-1", "Healthy")
    await kubelet.wait_until(lambda: kubelet.allocatable(RESOURCE) == 3, timeout=5)
    assert kubelet.updates(RESOURCE) == 4


@pytest.mark.parametrize(
    ("version", "resource", "message"),
    [
        ("v1alpha", RESOURCE, "requested API version 'v1alpha' is not supported by kubelet"),
        ("v1beta1", "widget", "the ResourceName 'widget' is invalid"),
        ("v1beta1", "foo.kubernetes.io/widget", "is invalid"),
    ],
)
async def test_register_refuses_what_the_kubelet_refuses(
    kubelet: KubeletStandIn, plugin: TinyPlugin, version: str, resource: str, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.register(resource=resource, version=version)
    assert caught.value.code() is grpc.StatusCode.UNKNOWN
    assert message in (caught.value.details() or "")
    assert [e.kind for e in kubelet.events][-1] == "rejected" and kubelet.registrations == ()


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("example.com/fpga", True),
        ("nvidia.com/gpu", True),
        ("example.com/Fpga_1.x", True),
        ("fpga", False),
        ("kubernetes.io/fpga", False),
        ("notkubernetes.io/fpga", False),  # the kubelet looks for "kubernetes.io/" anywhere
        ("requests.example.com/fpga", False),
        ("Example.com/fpga", False),
        ("example.com/a/b", False),
        ("example.com/" + "a" * 63, True),
        ("example.com/" + "a" * 64, False),
        ("example.com/-fpga", False),
        ("example.com/", False),
        ("example.com/fpga\n", False),  # Go's "$" does not match before a final newline
        ("example.com\n/fpga", False),
    ],
)
def test_extended_resource_name_rules(name: str, ok: bool) -> None:
    assert is_extended_resource_name(name) is ok


async def test_register_fails_when_the_plugin_does_not_answer(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.register(endpoint="nobody.sock")
    assert "failed to dial device plugin" in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.register(endpoint="../escape.sock")
    assert "must be a socket file name" in (caught.value.details() or "")


async def test_admit_pod_picks_preferred_allocates_and_goes_pending(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    await kubelet.wait_registered(RESOURCE)
    first = await kubelet.admit_pod("a", {RESOURCE: 1})
    assert first.phase is PodPhase.RUNNING
    assert first.device_ids(RESOURCE) == ("w-2",)  # the plugin prefers the highest ID
    assert first.env == {"TINY_DEVICES": "w-2"}
    assert [d.path for d in first.device_specs] == ["/dev/w-2"]
    assert first.cdi_devices == ("example.com/widget=w-2",) and first.annotations == {"tiny": "yes"}
    assert plugin.preferred_requests == [(["w-0", "w-1", "w-2"], [], 1)]

    second = await kubelet.admit_pod("b", [{RESOURCE: 1}, {RESOURCE: 1}])  # two containers
    assert second.device_ids(RESOURCE) == ("w-1", "w-0")
    assert plugin.preferred_requests[1:] == [(["w-0", "w-1"], [], 1), (["w-0"], [], 1)]
    assert plugin.allocate_requests == [[["w-2"]], [["w-1"]], [["w-0"]]]  # one container request per call
    assert kubelet.allocated(RESOURCE) == {"w-0", "w-1", "w-2"}

    third = await kubelet.admit_pod("c", {RESOURCE: 1})
    assert third.phase is PodPhase.PENDING and third.reason == f"Insufficient {RESOURCE}"
    assert "c" not in kubelet.pods

    assert kubelet.remove_pod("b") and not kubelet.remove_pod("b")
    again = await kubelet.admit_pod("c", {RESOURCE: 2})
    assert again.admitted and sorted(again.device_ids()) == ["w-0", "w-1"]


async def test_pending_counts_unhealthy_devices_out(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    await kubelet.wait_registered(RESOURCE)
    plugin.set_health("w-0", "Unhealthy")
    await kubelet.wait_until(lambda: kubelet.allocatable(RESOURCE) == 2)
    assert (await kubelet.admit_pod("big", {RESOURCE: 3})).reason == f"Insufficient {RESOURCE}"
    assert (await kubelet.admit_pod("other", {"example.com/none": 1})).reason == "Insufficient example.com/none"
    fits = await kubelet.admit_pod("fits", {RESOURCE: 2})
    assert sorted(fits.device_ids()) == ["w-1", "w-2"]


async def test_without_preferred_allocation_picks_in_id_order_and_pre_starts(short_tmp: Path, kubelet: KubeletStandIn) -> None:
    plugin = TinyPlugin(short_tmp, ["w-1", "w-0"], preferred=False, pre_start=True)
    await plugin.start()
    try:
        await plugin.register()
        await kubelet.wait_registered(RESOURCE)
        pod = await kubelet.admit_pod("a", {RESOURCE: 1})
        assert pod.device_ids() == ("w-0",)
        assert plugin.preferred_requests == [] and plugin.pre_starts == [["w-0"]]
    finally:
        await plugin.stop()


async def test_allocate_failure_fails_the_pod_and_frees_nothing_held(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    await kubelet.wait_registered(RESOURCE)
    plugin.fail_allocate = grpc.StatusCode.FAILED_PRECONDITION
    pod = await kubelet.admit_pod("a", {RESOURCE: 1})
    assert pod.phase is PodPhase.FAILED and pod.reason == "UnexpectedAdmissionError"
    assert pod.code == "FAILED_PRECONDITION" and "scripted failure" in pod.message
    assert kubelet.allocated(RESOURCE) == frozenset()


async def test_raw_allocate_shows_the_status(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    await kubelet.wait_registered(RESOURCE)
    answers = await kubelet.allocate(RESOURCE, ["w-0"], ["w-1", "w-2"])
    assert [a.device_ids for a in answers] == [("w-0",), ("w-1", "w-2")]
    assert dict(answers[1].env) == {"TINY_DEVICES": "w-1,w-2"}
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await kubelet.allocate(RESOURCE, ["nope"])
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "nope" in (caught.value.details() or "")
    assert await kubelet.preferred_allocation(RESOURCE, ["w-0", "w-1"], size=1) == ("w-1",)
    with pytest.raises(StandInError, match="example.com/absent is not registered"):
        await kubelet.allocate("example.com/absent", ["x"])


async def test_reregistration_replaces_the_connection(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    first = await kubelet.wait_registered(RESOURCE)
    await plugin.register()
    await kubelet.wait_until(lambda: kubelet.registration(RESOURCE) is not first and kubelet.is_registered(RESOURCE))
    await kubelet.wait_until(lambda: plugin.streams_ended == 1)  # the old stream was closed by the kubelet
    assert len(kubelet.registrations) == 2 and kubelet.allocatable(RESOURCE) == 3


async def test_plugin_going_away_marks_every_device_unhealthy(kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    await kubelet.wait_registered(RESOURCE)
    plugin.end_streams()
    await kubelet.wait_until(lambda: kubelet.allocatable(RESOURCE) == 0, what="devices to turn unhealthy")
    assert kubelet.capacity(RESOURCE) == 3
    assert all(d.health is Health.UNHEALTHY for d in kubelet.devices(RESOURCE))
    assert any(e.kind == "disconnected" for e in kubelet.events)


async def test_restart_wipes_the_folder_and_keeps_pods(short_tmp: Path, kubelet: KubeletStandIn, plugin: TinyPlugin) -> None:
    await plugin.register()
    await kubelet.wait_registered(RESOURCE)
    pod = await kubelet.admit_pod("a", {RESOURCE: 1})
    (short_tmp / "stray.txt").write_text("x")
    (short_tmp / CHECKPOINT_FILE).write_text("{}")
    (short_tmp / "sub").mkdir()
    before = kubelet.started_at
    await kubelet.restart(wipe=True)
    assert sorted(p.name for p in short_tmp.iterdir()) == sorted([CHECKPOINT_FILE, "kubelet.sock", "sub"])
    assert kubelet.started_at is not None and before is not None and kubelet.started_at > before
    assert kubelet.capacity(RESOURCE) == 0 and not kubelet.is_registered(RESOURCE)
    assert kubelet.pods["a"] == pod
    await kubelet.wait_until(lambda: plugin.streams_ended == 1)  # the kubelet went away
    # The tiny plugin does not watch the folder; serving again and registering is its recovery.
    await plugin.stop()
    await plugin.start()
    await plugin.register()
    await kubelet.wait_registered(RESOURCE)
    assert kubelet.allocated(RESOURCE) == set(pod.device_ids())


async def test_restart_without_wipe_recreates_only_the_kubelet_socket(
    short_tmp: Path, kubelet: KubeletStandIn, plugin: TinyPlugin
) -> None:
    await kubelet.restart(wipe=False)
    assert (short_tmp / "tiny.sock").exists() and (short_tmp / "kubelet.sock").exists()


async def test_wait_until_times_out_with_the_state(kubelet: KubeletStandIn) -> None:
    with pytest.raises(TimeoutError, match="example.com/x to register; nothing registered"):
        await kubelet.wait_registered("example.com/x", timeout=0.05)


async def test_admit_pod_refuses_bad_input(kubelet: KubeletStandIn) -> None:
    with pytest.raises(StandInError, match="must be a count"):
        await kubelet.admit_pod("a", {RESOURCE: -1})
    assert (await kubelet.admit_pod("empty", {})).admitted
    with pytest.raises(StandInError, match="already admitted"):
        await kubelet.admit_pod("empty", {})


async def test_stop_removes_the_socket_and_start_twice_is_refused(short_tmp: Path) -> None:
    kubelet = KubeletStandIn(short_tmp)
    await kubelet.start()
    with pytest.raises(StandInError, match="already running"):
        await kubelet.start()
    await kubelet.stop()
    assert not (short_tmp / "kubelet.sock").exists()
