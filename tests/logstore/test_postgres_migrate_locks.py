"""Opening a PostgreSQL log makes only what is missing, so it never queues writes behind a purge.

``CREATE INDEX IF NOT EXISTS`` of an index that exists still asks for the table's SHARE lock and
holds it to the commit. An open that ran them all waited behind any long write of the table (a
purge's one ``DELETE``, an operator's transaction), and every insert of every other replica
queued behind that open: their webhooks got a 503 past the 3 s answer bound for as long as the
write ran. The migration now reads the catalog first, under its advisory lock, and a purge
deletes in batches of bounded size, each its own transaction.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from logstore.helpers import FakeClock, new_row

from pipeline.logstore import RowState, Selection
from pipeline.logstore.postgres import PostgresLogStore

BOUND_S = 30.0
"""A bound no passing run approaches: a failing one waits for a lock without end."""

INDEXES = {
    "ingress_log_pkey": "CREATE UNIQUE INDEX ingress_log_pkey ON {t} USING btree (id)",
    "ingress_log_source_event_id_key": (
        "CREATE UNIQUE INDEX ingress_log_source_event_id_key ON {t} USING btree (source, event_id)"
    ),
    "ingress_log_unproduced": (
        "CREATE INDEX ingress_log_unproduced ON {t} USING btree (received_at_ms)"
        " WHERE (state = 'received'::text)"
    ),
    "ingress_log_unprocessed": (
        "CREATE INDEX ingress_log_unprocessed ON {t} USING btree (produced_at_ms)"
        " WHERE (state = 'produced'::text)"
    ),
    "ingress_log_received": (
        "CREATE INDEX ingress_log_received ON {t} USING btree (received_at_ms)"
    ),
    "ingress_log_processed": (
        "CREATE INDEX ingress_log_processed ON {t} USING btree (lane)"
        " WHERE (state = 'processed'::text)"
    ),
}
"""Every index of a fresh log, as ``pg_indexes`` shows it (``{t}``: the table)."""


@pytest.fixture
async def schema(postgres_service: str) -> AsyncIterator[str]:
    """A schema name of the test's own, dropped afterwards with whatever it holds."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    async with await psycopg.AsyncConnection.connect(postgres_service, autocommit=True) as c:
        await c.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@asynccontextmanager
async def opened(url: str, schema: str, **options: int) -> AsyncIterator[PostgresLogStore]:
    """An open store of ``schema``, closed afterwards."""
    store = PostgresLogStore(url, schema=schema, **options)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def indexes(url: str, schema: str) -> dict[str, str]:
    """The log table's indexes by name, each with its definition."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        cur = await c.execute(
            "SELECT indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = %s AND tablename = 'ingress_log'",
            [schema],
        )
        return dict(await cur.fetchall())


async def first_lock_wait(url: str, schema: str) -> int:
    """Return the pid of the first session waiting for a lock on the log table."""
    waiting = "SELECT pid FROM pg_locks WHERE NOT granted AND relation = %s::regclass ORDER BY pid"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as probe:
        while True:
            found = await (await probe.execute(waiting, [f'"{schema}".ingress_log'])).fetchall()
            if found:
                return int(found[0][0])
            await asyncio.sleep(0.02)  # polls the server's locks; no event signals a wait


async def test_an_open_during_a_long_write_leaves_the_other_replicas_inserts_alone(
    postgres_service: str, schema: str
) -> None:
    """A log's open while another transaction deletes from it: no lock wait, inserts go on.

    Before, the open waited for the table's SHARE lock until that transaction ended, and the
    other replica's insert waited behind the open and failed past the 3 s answer bound.
    """
    clock = FakeClock()
    async with opened(postgres_service, schema) as replica:
        old = [new_row(n, clock) for n in range(50)]
        assert all(await asyncio.gather(*(replica.insert(row) for row in old)))
        await replica.mark_processed([row.id for row in old])
        clock.advance(60)
        async with await psycopg.AsyncConnection.connect(postgres_service) as purging:
            # A purge's long statement, or any write transaction left open: ROW EXCLUSIVE held.
            await purging.execute(
                psycopg.sql.SQL("DELETE FROM {} WHERE received_at_ms < %s").format(
                    psycopg.sql.Identifier(schema, "ingress_log")
                ),
                [clock.now_ms],
            )
            starting = PostgresLogStore(postgres_service, schema=schema)
            opening = asyncio.ensure_future(starting.open())
            waiting = asyncio.ensure_future(first_lock_wait(postgres_service, schema))
            try:
                done, _ = await asyncio.wait(
                    {opening, waiting}, timeout=BOUND_S, return_when=asyncio.FIRST_COMPLETED
                )
                assert opening in done, "the open waits for a lock on the table"
                assert not waiting.done()
                await opening
                # The third store's insert while the long transaction still runs.
                arrived = new_row(1_000, clock)
                assert await asyncio.wait_for(replica.insert(arrived), BOUND_S) is True
                assert await starting.insert(new_row(1_001, clock)) is True
            finally:
                waiting.cancel()
                await purging.rollback()
                if not opening.done():
                    await asyncio.wait({opening}, timeout=BOUND_S)
                await starting.close()
        counts = await replica.count_by_state(Selection())
        assert counts == {RowState.PROCESSED: 50, RowState.RECEIVED: 2}


async def test_a_fresh_schema_gets_every_object(postgres_service: str, schema: str) -> None:
    """The schema, the table, its constraints and every index; several opens at once agree."""
    stores = [PostgresLogStore(postgres_service, schema=schema) for _ in range(4)]
    try:
        await asyncio.gather(*(store.open() for store in stores))
        table = f"{schema}.ingress_log"
        assert await indexes(postgres_service, schema) == {
            name: definition.format(t=table) for name, definition in INDEXES.items()
        }
        clock = FakeClock()
        row = new_row(1, clock)
        assert await stores[0].insert(row) is True
        assert await stores[1].insert(row) is False  # the unique (source, event_id)
        assert await stores[2].has_processed("messages") is False
    finally:
        for store in stores:
            await store.close()


async def test_an_empty_schema_made_beforehand_gets_the_table(
    postgres_service: str, schema: str
) -> None:
    """A schema an operator made before the first open: the table and every index in it."""
    async with await psycopg.AsyncConnection.connect(postgres_service, autocommit=True) as c:
        await c.execute(f'CREATE SCHEMA "{schema}"')
    async with opened(postgres_service, schema) as store:
        assert await store.insert(new_row(1, FakeClock())) is True
    assert set(await indexes(postgres_service, schema)) == set(INDEXES)


async def test_an_existing_log_keeps_its_rows_and_gets_a_missing_index_back(
    postgres_service: str, schema: str
) -> None:
    """Opened again: nothing is remade, rows stay; an index dropped is made again."""
    clock = FakeClock()
    rows = [new_row(n, clock) for n in range(10)]
    async with opened(postgres_service, schema) as store:
        assert all(await asyncio.gather(*(store.insert(row) for row in rows)))
        await store.mark_processed([rows[0].id])
    before = await indexes(postgres_service, schema)
    async with await psycopg.AsyncConnection.connect(postgres_service, autocommit=True) as c:
        await c.execute(f'DROP INDEX "{schema}".ingress_log_unprocessed')
    async with opened(postgres_service, schema) as store:
        assert await indexes(postgres_service, schema) == before
        assert await store.insert(rows[1]) is False
        assert await store.insert(new_row(10, clock)) is True
        assert await store.has_processed("messages") is True
        counts = await store.count_by_state(Selection())
        assert counts == {RowState.PROCESSED: 1, RowState.RECEIVED: 10}


async def test_a_purge_deletes_in_batches_each_its_own_transaction(
    postgres_service: str, schema: str
) -> None:
    """Between two batches nothing holds the table: a SHARE lock is granted at once.

    Exactly the old finished rows go, many of them sharing one receive time across batches;
    old unfinished rows and recent finished ones stay.
    """
    clock = FakeClock()
    async with opened(postgres_service, schema, purge_batch_rows=100) as store:
        same_ms = [new_row(n, clock) for n in range(150)]  # one time, across two batches
        clock.advance(1)
        later = [new_row(n, clock) for n in range(150, 260)]
        owed = [new_row(n, clock) for n in range(260, 275)]
        clock.advance(1)
        abandoned = [new_row(n, clock) for n in range(275, 300)]
        clock.advance(60)
        cutoff_ms = clock.now_ms
        recent = [new_row(n, clock) for n in range(300, 310)]
        everything = same_ms + later + owed + abandoned + recent
        assert all(await asyncio.gather(*(store.insert(row) for row in everything)))
        await store.mark_processed([row.id for row in same_ms + later + recent])
        await store.abandon([row.id for row in abandoned], "poison")

        progress: list[int] = []

        async def between_batches(deleted: int) -> None:
            progress.append(deleted)
            async with await psycopg.AsyncConnection.connect(postgres_service) as c:
                await c.execute("SET lock_timeout = '1ms'")  # not granted at once: fails
                await c.execute(f'LOCK TABLE "{schema}".ingress_log IN SHARE MODE')
                await c.rollback()

        store.purge_progress = between_batches
        deleted = await store.purge(cutoff_ms)

        assert deleted == len(same_ms) + len(later) + len(abandoned)
        assert progress == [100, 200]
        counts = await store.count_by_state(Selection())
        assert counts == {RowState.RECEIVED: len(owed), RowState.PROCESSED: len(recent)}
        for row in owed + recent:
            assert await store.get(row.id) is not None
        assert await store.purge(cutoff_ms) == 0
