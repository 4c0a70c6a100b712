"""A row the database refuses fails alone: its group-commit neighbours are still committed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from logstore.helpers import FakeClock, new_row, real_log_store

from pipeline.config import Settings
from pipeline.logstore import LogStore, Selection
from pipeline.logstore.sqlite import SqliteLogStore


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Settings
) -> AsyncIterator[LogStore]:
    """Each real log store; PostgreSQL in a schema of its own, dropped afterwards."""
    if request.param == "postgres":
        request.getfixturevalue("postgres_service")
    async with real_log_store(request.param, tmp_path, settings.postgres.url) as log_store:
        yield log_store


@pytest.mark.parametrize("bad", ["\ud800", "nul\x00byte"])
async def test_a_refused_row_fails_only_its_own_insert(store: LogStore, bad: str) -> None:
    """Three good rows submitted in one batch with an unstorable one are all committed."""
    clock = FakeClock()
    rows = [new_row(n, clock) for n in range(3)]
    rows.insert(1, new_row(9, clock, tenant=bad))
    if isinstance(store, SqliteLogStore) and "\x00" in bad:
        pytest.skip("SQLite stores NUL in TEXT; only PostgreSQL refuses it")
    results = await asyncio.gather(*(store.insert(row) for row in rows), return_exceptions=True)
    assert [r is True for r in results] == [True, False, True, True]
    assert isinstance(results[1], Exception)
    assert sum((await store.count_by_state(Selection())).values()) == 3
