"""Fixtures of the DRA claim preparation tests (their doubles: :mod:`cdiplug.testing.dra_claims`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cdiplug.dra.checkpoint import ClaimStore
from cdiplug.host import BackendHost
from cdiplug.models.world import World
from cdiplug.testing.dra_claims import hosted_backend


@pytest.fixture
async def host(world: World, request: pytest.FixtureRequest) -> AsyncIterator[BackendHost]:
    """The test module's ``RC`` run by a started host with the module's ``PLUGIN``, once it has reported."""
    plugin = request.module.PLUGIN
    async with hosted_backend(world, request.module.RC, {plugin.name: plugin}, timeout=5) as host:
        yield host


@pytest.fixture
async def store(world: World) -> ClaimStore:
    """The claim checkpoint in the world's state folder, loaded (empty at first)."""
    store = ClaimStore(world.state_dir)
    await store.load()
    return store
