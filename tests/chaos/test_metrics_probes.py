"""The kubelet's probes under a slow-client attack on the metrics address.

A real daemon process (``python -m cdiplug serve --metrics-address 127.0.0.1:0``, registered with
the kubelet stand-in, so /readyz is 200) gets 200 clients on loopback for 60 s: 100 silent, 100
sending a request line and then a header line every 5 s, each reconnecting as soon as it is
dropped; they run on a loop of their own in another thread. Meanwhile /healthz and /readyz are
asked every 5 s, each timed from connect to the last byte of the answer: every one answers 200
within 1 s. The attack is checked to be one: at every probe at least half of the clients are
connected (all of them but for the moments they reconnect), and the slow ones are dropped and come
back all the time. Afterwards the daemon's open files are back where they were (within 10 s) and
its log is clean. Bound: 60 s of attack, ~65 s in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections import Counter
from pathlib import Path

from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn
from cdiplug.testing.process import daemon_process

from .conftest import figure, proc_figures, write_config

FPGA = "example.com/fpga"
ATTACK = 60.0
EVERY = 5.0
SILENT, TRICKLING = 100, 100
BUDGET = 1.0  # what the kubelet's probe allows (timeoutSeconds: 1)


class Attack:
    """The 200 slow clients, on their own event loop in a thread of their own."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connected = 0
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="attack", daemon=True)

    def __enter__(self) -> Attack:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()

    async def _run(self) -> None:
        clients = [asyncio.create_task(self._client(trickle=i >= SILENT)) for i in range(SILENT + TRICKLING)]
        while not self._stop.is_set():
            await asyncio.sleep(0.1)  # the thread's stop is no awaitable
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)

    async def _client(self, *, trickle: bool) -> None:
        while True:  # reconnect as soon as dropped
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                self.counts["connect failed"] += 1
                await asyncio.sleep(0.01)
                continue
            self.counts["connections"] += 1
            self.connected += 1
            try:
                if trickle:
                    writer.write(b"GET /metrics HTTP/1.1\r\n")
                    line = 0
                    while not reader.at_eof():
                        try:
                            await asyncio.wait_for(reader.read(), EVERY)  # b"" once dropped
                        except TimeoutError:
                            line += 1
                            writer.write(b"X-Slow-%d: a header line every 5 s\r\n" % line)
                            await writer.drain()
                else:
                    await reader.read()  # silent until dropped
                self.counts["dropped"] += 1
            except ConnectionError:
                self.counts["dropped"] += 1
            finally:
                self.connected -= 1
                writer.close()


async def probe(port: int, path: str) -> tuple[int, float]:
    """One probe as the kubelet makes it: its status and how long it took, connect to last byte."""
    started = time.monotonic()
    answer = b""
    with contextlib.suppress(ConnectionError):  # closed or reset without an answer: status 0
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube-probe/1.33\r\n\r\n".encode())
            answer = await reader.read()
        finally:
            writer.close()
    took = time.monotonic() - started
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", answer)
    return (int(match.group(1)) if match else 0), took


async def test_probes_answer_within_a_second_under_200_slow_clients(chaos_world: World, short_tmp: Path) -> None:
    world = chaos_world
    config = write_config(short_tmp / "config.yaml", {FPGA: 2})
    async with (
        KubeletStandIn(world.kubelet_dir) as kubelet,
        daemon_process(world, config, "--metrics-address", "127.0.0.1:0") as daemon,
    ):
        await kubelet.wait_registered(FPGA, timeout=30)
        await daemon.wait_for("serving /metrics")
        url = next(re.search(r"http://\S+", e["message"]).group(0) for e in daemon.entries if "serving /metrics" in e["message"])  # type: ignore[union-attr]
        port = int(url.rpartition(":")[2])
        assert (await probe(port, "/readyz"))[0] == 200  # ready before the attack
        before = proc_figures(daemon.pid)
        answers: list[tuple[str, int, float, int]] = []
        with Attack(port) as attack:
            started = time.monotonic()
            async with asyncio.timeout(ATTACK + 30):
                while attack.connected < 150:  # the attack in place before the first probe
                    await asyncio.sleep(0.05)
                while (elapsed := time.monotonic() - started) < ATTACK:
                    for path in ("/healthz", "/readyz"):
                        held = attack.connected
                        status, took = await asyncio.wait_for(probe(port, path), 10)
                        answers.append((path, status, took, held))
                    await asyncio.sleep(EVERY - (time.monotonic() - started - elapsed))
            counts = dict(attack.counts)
        async with asyncio.timeout(10):  # the server sees each client's end at once; nothing to await
            while proc_figures(daemon.pid)["open_fds"] > before["open_fds"] + 2:
                await asyncio.sleep(0.05)
        assert daemon.proc.returncode is None
        assert await daemon.stop() == 0
    daemon.check_log(str(config))
    worst = max(took for _, _, took, _ in answers)
    figure("probes under 200 slow clients for 60 s: answered, max latency (ms)", f"{len(answers)}, {worst * 1e3:.1f}")
    figure(
        "slow clients: connections made, dropped, fewest connected at a probe",
        f"{counts.get('connections')}, {counts.get('dropped')}, {min(h for *_, h in answers)}",
    )
    assert len(answers) >= 2 * int(ATTACK / EVERY)
    assert [(p, s) for p, s, _, _ in answers if s != 200] == []
    assert [(p, round(t, 3)) for p, _, t, _ in answers if t >= BUDGET] == []
    assert min(h for *_, h in answers) >= (SILENT + TRICKLING) // 2  # every probe ran during the attack
    assert counts["dropped"] >= 2 * (SILENT + TRICKLING)  # the slow clients were dropped and came back
