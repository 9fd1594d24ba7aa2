"""Backend plugins and abilities (cdiplug.backend): entry-point discovery and abilities_of.

Discovery runs against the installed distribution's real ``cdiplug.backends`` entry points (read from the
dist-info folders as ``importlib.metadata`` reads them), and against hand-made EntryPoint objects for the broken cases. Abilities
are found structurally, so a backend that does not subclass a protocol still gets it; unprepare and
release polling are separate (a DRA-only backend implements only ``unprepare``).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from cdiplug import backend as backend_module
from cdiplug.backend import (
    ENTRY_POINT_GROUP,
    Abilities,
    Backend,
    BackendPlugin,
    PairwiseAffinity,
    PluginRegistry,
    PreferredAllocator,
    Preparer,
    ReleasePoller,
    Unpreparer,
    abilities_of,
    load_plugins,
)
from cdiplug.errors import BackendInitError
from cdiplug_backends.fake import plugin as fake_plugin


def test_installed_plugins_are_found_through_entry_points():
    plugins = load_plugins()
    assert {"fake", "pci", "nvidia"} <= set(plugins)
    assert list(plugins) == sorted(plugins) and len(plugins) == len(list(plugins))
    assert "fake" in plugins and "nope" not in plugins
    assert plugins["fake"] is fake_plugin and plugins["fake"] is plugins["fake"]
    assert isinstance(fake_plugin, BackendPlugin) and fake_plugin.name == "fake"
    with pytest.raises(KeyError):
        plugins["nope"]


def test_plugins_are_imported_only_when_asked_for(monkeypatch):
    never = EntryPoint(name="never", value="cdiplug_no_such_module:plugin", group=ENTRY_POINT_GROUP)
    real = EntryPoint(name="fake", value="cdiplug_backends.fake:plugin", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr(backend_module, "entry_points", lambda group: [never, real] if group == ENTRY_POINT_GROUP else [])
    plugins = load_plugins()
    assert list(plugins) == ["fake", "never"]  # listing imports nothing
    assert plugins["fake"] is fake_plugin
    with pytest.raises(
        BackendInitError,
        match=r"backend 'never' cannot be loaded from entry point cdiplug_no_such_module:plugin: ModuleNotFoundError",
    ):
        plugins["never"]


def test_an_entry_point_that_is_no_plugin_is_refused(monkeypatch):
    wrong = EntryPoint(name="wrong", value="os:path", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr(backend_module, "entry_points", lambda group: [wrong])
    with pytest.raises(BackendInitError, match=r"entry point wrong = os:path is not a cdiplug.sdk.BackendPlugin"):
        load_plugins()["wrong"]


def test_given_plugins_replace_discovery():
    mine = BackendPlugin(name="mine", options_type=object, create=lambda rs, w: None)  # type: ignore[arg-type,return-value]
    plugins = PluginRegistry({"mine": mine})
    assert list(plugins) == ["mine"] and plugins["mine"] is mine and "fake" not in plugins


class Plain:
    async def run(self, sink) -> None: ...


class Everything(Plain):
    async def prepare(self, resource, devices) -> None: ...

    async def unprepare(self, resource, device_ids) -> None: ...

    def release_interval(self, resource) -> float | None:
        return 1.0

    async def releasable(self, resource):
        return []

    def preferred_allocation(self, resource, snapshot, request):
        return None

    def affinity(self, resource, a, b) -> float:
        return 0.0


class JustAffinity(Plain):
    def affinity(self, resource, a, b) -> float:
        return 1.0


class DraOnly(Plain):
    """Undoes what it prepared when DRA says a claim is done; never polls for release."""

    async def prepare(self, resource, devices) -> None: ...

    async def unprepare(self, resource, device_ids) -> None: ...


def test_abilities_are_found_once_per_backend():
    assert abilities_of(Plain()) == Abilities()
    everything = Everything()
    a = abilities_of(everything)
    assert a.preparer is a.unpreparer is a.release_poller is a.preferred is a.affinity is everything
    b = abilities_of(JustAffinity())
    assert b.affinity is not None and b.preparer is b.unpreparer is b.release_poller is b.preferred is None
    assert isinstance(everything, Backend) and isinstance(everything, Preparer) and isinstance(everything, PreferredAllocator)
    assert (
        isinstance(everything, PairwiseAffinity) and isinstance(everything, Unpreparer) and isinstance(everything, ReleasePoller)
    )
    assert not isinstance(object(), Backend)


def test_a_dra_only_backend_unprepares_without_release_polling():
    dra_only = DraOnly()
    a = abilities_of(dra_only)
    assert a.preparer is a.unpreparer is dra_only and a.release_poller is None


def test_the_fake_backend_has_no_optional_abilities_but_claim_configuration(world):
    from cdiplug.config import load_config

    backend = fake_plugin.create(load_config(None).resources, world)
    assert isinstance(backend, Backend) and abilities_of(backend) == Abilities(configurable=backend)


def test_entry_points_are_read_from_dist_info_folders_as_importlib_metadata_reads_them(tmp_path, monkeypatch):
    import importlib.metadata
    import sys

    from cdiplug.backend import entry_points

    first, second = tmp_path / "a", tmp_path / "b"
    for folder, dist, value in (
        (first, "Demo_Pkg-1.0.dist-info", "demo.one:plugin"),
        (second, "demo_pkg-2.0.dist-info", "demo.two:plugin"),
    ):
        (folder / dist).mkdir(parents=True)
        (folder / dist / "entry_points.txt").write_text(
            f"# a comment\n[console_scripts]\ndemo = demo.cli:main\n\n[cdiplug.backends]\ndemo = {value} [extra]\n"
        )
    (first / "other-0.1.dist-info").mkdir()  # no entry_points.txt
    monkeypatch.setattr(sys, "path", [str(first), str(tmp_path / "missing"), str(second)])
    found = [(ep.name, ep.value) for ep in entry_points("cdiplug.backends")]
    assert found == [("demo", "demo.one:plugin")]  # the first distribution of a name wins
    expected = [(ep.name, ep.value.partition("[")[0].strip()) for ep in importlib.metadata.entry_points(group="cdiplug.backends")]
    assert found == expected
    assert entry_points("nothing.here") == []


def test_a_read_entry_point_loads_its_object():
    from cdiplug.backend import _EntryPoint

    assert _EntryPoint("x", "cdiplug.backend:load_plugins").load() is load_plugins
    assert _EntryPoint("x", "cdiplug.backend").load().__name__ == "cdiplug.backend"
