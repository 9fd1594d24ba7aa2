"""The spec owners (cdiplug.host.specs): one SpecKeeper per kind writes only when the spec's
content changes (health is no part of it), answers "on disk" with one lstat when nothing
changed, rewrites a file removed behind its back, and removes stale files of other kinds.

Against the real SpecWriter in a temporary folder.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from cdiplug.cdi.writer import SpecWriter
from cdiplug.host import SpecKeepers
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot, Health

KIND = "example.com/fpga"


class CountingWriter(SpecWriter):
    def __init__(self, cdi_dir: Path) -> None:
        super().__init__(cdi_dir)
        self.writes = 0

    def write(self, kind: str, snapshot: DeviceSnapshot) -> bool:
        self.writes += 1
        return super().write(kind, snapshot)


def snapshot(*ids: str, unhealthy: tuple[str, ...] = ()) -> DeviceSnapshot:
    return DeviceSnapshot(
        KIND,
        [
            Device(i, health=Health.UNHEALTHY if i in unhealthy else Health.HEALTHY, edits=ContainerEdits(env={"ID": i}))
            for i in ids
        ],
    )


async def test_a_keeper_writes_only_what_changes_the_spec(tmp_path: Path) -> None:
    writer = CountingWriter(tmp_path)
    keepers = SpecKeepers(tmp_path, writer)
    keeper = keepers.keeper(KIND)
    assert keepers.keeper(KIND) is keeper  # one owner per kind
    assert await keeper.ensure(snapshot("a", "b")) is True
    assert await keeper.ensure(snapshot("a", "b", unhealthy=("a",))) is False
    assert writer.writes == 1  # a health change did not even reach the writer
    keeper.path.unlink()
    assert await keeper.ensure(snapshot("a", "b")) is True  # gone behind our back: written again
    assert await keeper.ensure(attrs.evolve(snapshot("a"), ids_env="X")) is True  # fewer devices: new content
    assert writer.writes == 3


async def test_stale_specs_of_other_kinds_go_and_nobody_elses(tmp_path: Path) -> None:
    keepers = SpecKeepers(tmp_path)
    await keepers.keeper(KIND).ensure(snapshot("a"))
    await keepers.keeper("example.com/old").ensure(
        DeviceSnapshot("example.com/old", [Device("x", edits=ContainerEdits(env={"A": "1"}))])
    )
    (tmp_path / "vendor.json").write_text("{}")
    await keepers.remove_stale([KIND])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdiplug-example.com-fpga.json", "vendor.json"]
