"""The PostgreSQL log store behind a transaction-mode PgBouncer, as many operators run it.

PgBouncer hands each transaction (each autocommit statement) to whichever server connection is
free, so nothing a session keeps is found again: psycopg's automatic server-side prepared
statements (after 5 runs of one statement on a connection) were prepared on one server
connection and then run on another ("prepared statement "_pg3_0" does not exist"), or under the
same name as another client's ("already exists"), or as another client's different statement
of that name ("bind message supplies 1 parameters, but prepared statement "_pg3_4" requires 4").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from logstore.helpers import FakeClock, new_row, postgres_log_store
from pgbouncer_proc import pgbouncer

from pipeline.logstore.postgres import PostgresLogStore
from pipeline.logstore.protocol import RowState, Selection

ROUNDS = 12
"""Enough for every statement to run past psycopg's prepare threshold (5) on each connection."""
ROWS = 6


async def test_every_statement_runs_again_and_again_behind_pgbouncer(
    postgres_service: str, tmp_path: Path
) -> None:
    """Group commits, marks, claims, reads and purges, many times over, through PgBouncer."""
    clock = FakeClock()
    with pgbouncer(postgres_service, tmp_path) as url:
        # More pool connections than PgBouncer's server connections: they share them.
        async with postgres_log_store(
            url, clock=clock, min_connections=4, max_connections=4
        ) as store:
            for r in range(ROUNDS):
                await _one_round(store, clock, r)


async def _one_round(store: PostgresLogStore, clock: FakeClock, r: int) -> None:
    """What the ingress, consumers, sweeper, purge, replay and status do, once each."""
    rows = [new_row(r * ROWS + i, clock) for i in range(ROWS)]
    ids = [row.id for row in rows]
    async with asyncio.TaskGroup() as tg:  # one group commit, several connections busy
        inserted = [tg.create_task(store.insert(row)) for row in rows]
        for row_id in ids[:2]:  # a replay reads meanwhile
            tg.create_task(store.get(row_id))
    assert all(task.result() for task in inserted)
    await store.mark_produced(ids[:4])
    async with asyncio.TaskGroup() as tg:  # consumers of two lanes mark at once
        marked = [tg.create_task(store.mark_processed([row_id])) for row_id in ids[:2]]
        tg.create_task(store.mark_running(ids[2:3]))
    assert [task.result() for task in marked] == [1, 1]
    await store.record_failure(ids[4:5], "broker down")
    await store.abandon(ids[5:6], "gave up")
    await store.mark_replayed(ids[5:6])
    clock.advance(60)
    assert len(await store.claim_unproduced(clock.now_ms, 100, 1_000)) == r + 1
    assert len(await store.claim_unprocessed(clock.now_ms, 100, 1_000)) == 3 * (r + 1)
    assert await store.has_processed("messages") is True
    counts = await store.count_by_state(Selection())
    assert (counts[RowState.RECEIVED], counts[RowState.PRODUCED]) == (r + 1, 3 * (r + 1))
    page = await store.select(Selection(states=(RowState.RECEIVED,)), limit=100)
    assert len(page) == r + 1
    assert await store.last_id(Selection()) is not None
    assert await store.oldest_unfinished_ms(clock.now_ms) is not None
    found = await store.get(ids[0])
    assert found is not None
    assert found.state is RowState.PROCESSED
    await store.purge(clock.now_ms - 120_000)
