"""``has_processed``: whether a lane's rows were ever marked, in one index probe on both stores.

The sweeper asks it once a sweep for a lane none of whose rows was marked, the very lane whose
rows fill the log (replayed, then abandoned and kept): without an index of the processed rows'
lanes that answer is a scan of the whole table, which on PostgreSQL outlasts the answer timeout
the sweeper's statements are held to.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from logstore.helpers import FakeClock, new_row, real_log_store

from pipeline.config import Settings
from pipeline.logstore import LogStore
from pipeline.logstore.postgres import PostgresLogStore
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.logstore.sqlite import sql as sqlite_sql

ROWS = 4_000


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Settings
) -> AsyncIterator[LogStore]:
    """A real, empty log store of each kind."""
    if request.param == "postgres":
        request.getfixturevalue("postgres_service")
    async with real_log_store(request.param, tmp_path, settings.postgres.url, FakeClock()) as log:
        yield log


async def fill(store: LogStore) -> tuple[list[str], list[str]]:
    """``ROWS`` produced rows of lane messages, a few of engagement; the ids of each."""
    clock = FakeClock()
    rows = [new_row(n, clock, lane="messages") for n in range(ROWS)]
    rows += [
        new_row(n, clock, lane="engagement", topic="engagement") for n in range(ROWS, ROWS + 3)
    ]
    for start in range(0, len(rows), 500):
        await asyncio.gather(*(store.insert(row) for row in rows[start : start + 500]))
    ids = [row.id for row in rows]
    await store.mark_produced(ids)
    return ids[:ROWS], ids[ROWS:]


async def plan(store: LogStore, lane: str) -> str:
    """The database's plan for the probe of ``lane``."""
    if isinstance(store, SqliteLogStore):
        with sqlite3.connect(store._path) as conn:
            found = conn.execute(f"EXPLAIN QUERY PLAN {sqlite_sql.HAS_PROCESSED}", (lane,))
            return "\n".join(str(row[-1]) for row in found.fetchall())
    assert isinstance(store, PostgresLogStore)
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as conn:
        await conn.execute(psycopg.sql.SQL("ANALYZE {}").format(store._sql.table))
        query = psycopg.sql.SQL("EXPLAIN ") + store._sql.has_processed
        found = await conn.execute(query, [lane])
        return "\n".join(str(row[0]) for row in await found.fetchall())


async def test_a_lane_is_processed_once_one_of_its_rows_is(store: LogStore) -> None:
    """No processed row, no lane; one of another lane or state does not count; one does."""
    messages, engagement = await fill(store)
    assert await store.has_processed("messages") is False
    assert await store.has_processed("nowhere") is False
    await store.mark_processed(engagement[:1])
    await store.abandon(messages[:5], "gone")
    assert await store.has_processed("messages") is False
    assert await store.has_processed("engagement") is True
    await store.mark_processed(messages[-1:])
    assert await store.has_processed("messages") is True


async def test_the_probe_reads_an_index_not_the_table(store: LogStore) -> None:
    """Thousands of rows of the lane, none processed: the plan is an index probe, no scan."""
    messages, _ = await fill(store)
    await store.mark_processed(messages[:1])
    shown = await plan(store, "messages")
    assert "ingress_log_processed" in shown, shown
    assert "SCAN ingress_log" not in shown, shown  # SQLite's words for a table scan
    assert "Seq Scan" not in shown, shown  # PostgreSQL's
