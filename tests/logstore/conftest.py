"""Fixtures for the log store contract suite: each store on its real database, one fake clock."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from logstore.helpers import FakeClock

from pipeline.config import Settings
from pipeline.logstore import LogStore
from pipeline.logstore.postgres import PostgresLogStore
from pipeline.logstore.sqlite import SqliteLogStore


@pytest.fixture
def clock() -> FakeClock:
    """A clock the test moves by hand."""
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Settings, clock: FakeClock
) -> AsyncIterator[LogStore]:
    """Each real log store in turn; PostgreSQL isolates the test in a schema of its own."""
    if request.param == "sqlite":
        sqlite = SqliteLogStore(tmp_path / "log.db", clock=clock)
        await sqlite.open()
        yield sqlite
        await sqlite.close()
        return
    request.getfixturevalue("postgres_service")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    pg = PostgresLogStore(settings.postgres.url, schema=schema, clock=clock)
    await pg.open()
    yield pg
    await pg.close()
    async with await psycopg.AsyncConnection.connect(settings.postgres.url, autocommit=True) as c:
        await c.execute(f'DROP SCHEMA "{schema}" CASCADE')
