"""The replay's bound on both real stores: a selection's last id, and rows up to an id."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from logstore.helpers import FakeClock, new_row, real_log_store

from pipeline.config import Settings
from pipeline.logstore import LogStore, RowState, Selection


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Settings
) -> AsyncIterator[LogStore]:
    """Each real log store; PostgreSQL in a schema of its own, dropped afterwards."""
    if request.param == "postgres":
        request.getfixturevalue("postgres_service")
    async with real_log_store(request.param, tmp_path, settings.postgres.url) as log_store:
        yield log_store


async def test_last_id_is_the_highest_id_of_the_selection(store: LogStore) -> None:
    """``last_id`` is the id the pages of ``select`` end on, None for an empty selection."""
    clock = FakeClock()
    assert await store.last_id(Selection()) is None
    rows = []
    for n in range(6):
        rows.append(new_row(n, clock, source="a" if n % 2 else "b"))
        await store.insert(rows[-1])
        clock.advance(1)
    assert await store.last_id(Selection()) == rows[5].id
    assert await store.last_id(Selection(source="b")) == rows[4].id
    assert await store.last_id(Selection(states=(RowState.PROCESSED,))) is None
    everything = await store.select(Selection(), limit=100)
    assert everything[-1].id == await store.last_id(Selection())


async def test_through_id_bounds_select_count_and_last_id(store: LogStore) -> None:
    """Rows above ``through_id`` are outside the selection, the row at it inside."""
    clock = FakeClock()
    rows = []
    for n in range(5):
        rows.append(new_row(n, clock))
        await store.insert(rows[-1])
        clock.advance(1)
    bounded = Selection(through_id=rows[2].id)
    assert [r.id for r in await store.select(bounded, limit=100)] == [r.id for r in rows[:3]]
    assert [r.id for r in await store.select(bounded, after_id=rows[1].id, limit=100)] == [
        rows[2].id
    ]
    assert await store.count_by_state(bounded) == {RowState.RECEIVED: 3}
    assert await store.last_id(bounded) == rows[2].id
    late = new_row(9, clock)
    await store.insert(late)
    assert late.id not in {r.id for r in await store.select(bounded, limit=100)}
    assert await store.last_id(Selection(through_id=late.id, source="other")) is None
