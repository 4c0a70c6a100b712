"""``has_processed``: whether a lane's rows were ever marked, in one index probe on both stores.

The sweeper asks it once a sweep for a lane none of whose rows was marked, the very lane whose
rows fill the log (replayed, then abandoned and kept): without an index of the processed rows'
lanes that answer is a scan of the whole table, which on PostgreSQL outlasts the answer timeout
the sweeper's statements are held to.

The index is built when a store opens a log made before it, but only a new or small one: the
build reads the whole table and holds its writes meanwhile (every replica's webhooks, minutes on
a large log). A larger log opens without it, one warning names the command that builds it, and
until then ``has_processed`` answers None (unknown) without reading the table.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
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


def probe_params(lane: str) -> dict[str, object]:
    """The parameters of PostgreSQL's probe of ``lane``."""
    return {"lane": lane}


async def plan(store: LogStore, lane: str) -> str:
    """The database's plan for the probe of ``lane``."""
    if isinstance(store, SqliteLogStore):
        with sqlite3.connect(store._path) as conn:
            steps = conn.execute(f"EXPLAIN QUERY PLAN {sqlite_sql.HAS_PROCESSED}", (lane,))
            return "\n".join(str(row[-1]) for row in steps.fetchall())
    assert isinstance(store, PostgresLogStore)
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as conn:
        await conn.execute(psycopg.sql.SQL("ANALYZE {}").format(store._sql.table))
        query = psycopg.sql.SQL("EXPLAIN ") + store._sql.has_processed
        found = await conn.execute(query, probe_params(lane))
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
    assert "Seq Scan on ingress_log" not in shown, shown  # PostgreSQL's (the catalog's may be)


# A log made before the index (this version's first open of it) -------------------------------

BOUND = 50
"""The lowered bound of the reopened stores, under the 203 rows of a large log."""


def reopened(store: LogStore, bound: int) -> LogStore:
    """Another store on ``store``'s log, building the index at open only up to ``bound`` rows."""
    if isinstance(store, SqliteLogStore):
        return SqliteLogStore(store._path, processed_index_max_rows=bound)
    assert isinstance(store, PostgresLogStore)
    return PostgresLogStore(store._url, schema=store._schema, processed_index_max_rows=bound)


async def run_sql(store: LogStore, statement: str) -> list[tuple[object, ...]]:
    """``statement`` on a connection of its own (an operator's); ``{schema}`` is the store's."""
    if isinstance(store, SqliteLogStore):
        with closing(sqlite3.connect(store._path, isolation_level=None)) as conn:
            return conn.execute(statement.replace("{schema}.", "")).fetchall()
    assert isinstance(store, PostgresLogStore)
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as conn:
        cur = await conn.execute(statement.replace("{schema}", store._schema).encode())
        return list(await cur.fetchall()) if cur.description else []


async def index_state(store: LogStore) -> bool | None:
    """Whether ``ingress_log_processed`` is valid; None: there is none."""
    if isinstance(store, SqliteLogStore):
        found = await run_sql(store, sqlite_sql.PROCESSED_EXISTS)
        return True if found else None
    found = await run_sql(
        store,
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = '{schema}' AND c.relname = 'ingress_log_processed'",
    )
    return bool(found[0][0]) if found else None


async def old_log(store: LogStore, rows: int) -> None:
    """``store`` holding ``rows`` rows, some processed, and no index of the processed rows."""
    clock = FakeClock()
    new = [new_row(n, clock, lane="messages") for n in range(rows)]
    new += [new_row(n, clock, lane="engagement") for n in range(rows, rows + 3)]
    await asyncio.gather(*(store.insert(row) for row in new))
    await store.mark_produced([row.id for row in new])
    await store.mark_processed([row.id for row in new[:2]])
    await run_sql(store, "DROP INDEX {schema}.ingress_log_processed")
    assert await index_state(store) is None


def index_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The stores' warnings about the index."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("pipeline.logstore")
        and r.levelno == logging.WARNING
        and "ingress_log_processed" in r.getMessage()
    ]


async def probe_read_the_table(store: LogStore, lane: str) -> bool:
    """Whether :meth:`has_processed` of ``lane`` reads the table's rows (runs the lane's probe)."""
    if isinstance(store, SqliteLogStore):
        statements: list[str] = []
        store._r.set_trace_callback(statements.append)
        try:
            await store.has_processed(lane)
        finally:
            store._r.set_trace_callback(None)
        return sqlite_sql.HAS_PROCESSED in statements
    assert isinstance(store, PostgresLogStore)
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as conn:
        query = psycopg.sql.SQL("EXPLAIN (ANALYZE, COSTS OFF) ") + store._sql.has_processed
        found = await conn.execute(query, probe_params(lane))
        lines = [str(row[0]) for row in await found.fetchall()]
    # Its scans of the table or the index, by either name ("Seq Scan on ingress_log", "Index
    # Only Scan using ingress_log_processed on ingress_log"): planned, never executed.
    scans = [line for line in lines if " on ingress_log " in line]
    assert scans, lines
    return any("never executed" not in line for line in scans)


async def test_a_log_above_the_bound_opens_without_the_index_and_says_how_to_build_it(
    store: LogStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Not built at open (it would hold the writes): one warning with the command; unknown."""
    await old_log(store, 200)
    if isinstance(store, PostgresLogStore):
        await run_sql(store, "ANALYZE {schema}.ingress_log")  # as autovacuum would have
    upgraded = reopened(store, BOUND)
    with caplog.at_level(logging.WARNING, logger="pipeline.logstore"):
        await upgraded.open()
    try:
        warned = index_warnings(caplog)
        assert len(warned) == 1, warned
        assert "about 203 rows" in warned[0]
        assert await index_state(store) is None
        assert await upgraded.has_processed("messages") is None
        assert await upgraded.has_processed("engagement") is None
        assert not await probe_read_the_table(upgraded, "messages")
        command = warned[0].split(" with: ", 1)[1]
        if isinstance(store, PostgresLogStore):
            assert command == (
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS ingress_log_processed ON "
                f"{store._schema}.ingress_log (lane) WHERE state = 'processed'"
            )
            await run_sql(store, command)  # what the operator runs, the ingress running
        else:
            assert isinstance(store, SqliteLogStore)
            assert command == (
                f'sqlite3 {store._path} "CREATE INDEX IF NOT EXISTS ingress_log_processed ON '
                "ingress_log (lane) WHERE state = 'processed'\""
            )
            await run_sql(store, command.split('"')[1])
        # The store running since asks the index now, without being opened again.
        assert await upgraded.has_processed("messages") is True
        assert await upgraded.has_processed("engagement") is False
        assert "ingress_log_processed" in await plan(upgraded, "messages")
    finally:
        await upgraded.close()
    caplog.clear()
    again = reopened(store, BOUND)
    with caplog.at_level(logging.WARNING, logger="pipeline.logstore"):
        await again.open()
    await again.close()
    assert index_warnings(caplog) == []


async def test_a_log_within_the_bound_gets_the_index_at_open(
    store: LogStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A small log made before the index: built at open, no warning, the lanes answered.

    On PostgreSQL the table was never analyzed: the planner's estimate is from its pages.
    """
    await old_log(store, 20)
    upgraded = reopened(store, 1_000)
    with caplog.at_level(logging.WARNING, logger="pipeline.logstore"):
        await upgraded.open()
    try:
        assert index_warnings(caplog) == []
        assert await index_state(store) is True
        assert await upgraded.has_processed("messages") is True
        assert await upgraded.has_processed("engagement") is False
    finally:
        await upgraded.close()


async def test_an_index_left_invalid_by_a_failed_concurrent_build_counts_as_missing(
    tmp_path: Path, settings: Settings, postgres_service: str, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL: an INVALID index is not asked; a large table's is named, a small one rebuilt."""
    async with real_log_store("postgres", tmp_path, settings.postgres.url) as store:
        await old_log(store, 200)
        await run_sql(store, "ANALYZE {schema}.ingress_log")  # as autovacuum would have
        with pytest.raises(psycopg.errors.UniqueViolation):  # two processed rows of messages
            await run_sql(
                store,
                "CREATE UNIQUE INDEX CONCURRENTLY ingress_log_processed"
                " ON {schema}.ingress_log (lane) WHERE state = 'processed'",
            )
        assert await index_state(store) is False
        assert await store.has_processed("messages") is None
        assert not await probe_read_the_table(store, "messages")
        upgraded = reopened(store, BOUND)
        with caplog.at_level(logging.WARNING, logger="pipeline.logstore"):
            await upgraded.open()
        await upgraded.close()
        warned = index_warnings(caplog)
        assert len(warned) == 1, warned
        assert "about 203 rows" in warned[0]
        assert isinstance(store, PostgresLogStore)
        assert warned[0].endswith(
            f"with: DROP INDEX CONCURRENTLY {store._schema}.ingress_log_processed; "
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS ingress_log_processed ON "
            f"{store._schema}.ingress_log (lane) WHERE state = 'processed'"
        )
        assert await index_state(store) is False
        small = reopened(store, 1_000)
        await small.open()
        try:
            assert await index_state(store) is True
            assert await small.has_processed("messages") is True
        finally:
            await small.close()


# A log of a realistic mix, analyzed --------------------------------------------------------

MIX = 100_000
"""Rows of the mix: half of lane messages, never marked, half of lane engagement, processed."""


async def fill_mix(store: LogStore) -> None:
    """``MIX`` rows in one statement, then the statistics autovacuum or ``ANALYZE`` would keep.

    The lane the sweeper asks about (messages: produced and abandoned rows, none processed)
    beside another's processed rows: the planner, multiplying the selectivities of the lane and
    of the state, expects thousands of the lane's processed rows, so a scan that stops at the
    first looks cheap, and finds none.
    """
    if isinstance(store, SqliteLogStore):
        with closing(sqlite3.connect(store._path)) as conn, conn:
            conn.execute(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)"
                " INSERT INTO ingress_log (id, source, tenant, key, topic, lane, event_id,"
                " received_at_ms, headers, body, state)"
                " SELECT 'mix-' || n, 's', 't', 'k', 'x',"
                " CASE WHEN n % 2 = 0 THEN 'messages' ELSE 'engagement' END, 'e' || n, n,"
                " '{}', x'', CASE WHEN n % 2 = 1 THEN 'processed'"
                " WHEN n % 4 = 0 THEN 'produced' ELSE 'abandoned' END FROM g",
                (MIX,),
            )
            conn.execute("ANALYZE")
            stat = "SELECT stat FROM sqlite_stat1 WHERE idx = 'ingress_log_processed'"
            assert conn.execute(stat).fetchone() is not None
        return
    assert isinstance(store, PostgresLogStore)
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as pg:
        fill = psycopg.sql.SQL(
            "INSERT INTO {} (id, source, tenant, key, topic, lane, event_id, received_at_ms,"
            " headers, body, state)"
            " SELECT 'mix-' || n, 's', 't', 'k', 'x',"
            " CASE WHEN n %% 2 = 0 THEN 'messages' ELSE 'engagement' END, 'e' || n, n,"
            " '{{}}', '', CASE WHEN n %% 2 = 1 THEN 'processed'"
            " WHEN n %% 4 = 0 THEN 'produced' ELSE 'abandoned' END"
            " FROM generate_series(1, %s) n"
        )
        await pg.execute(fill.format(store._sql.table), [MIX])
        await pg.execute(psycopg.sql.SQL("ANALYZE {}").format(store._sql.table))


def scan_of_the_table(lines: list[str]) -> list[str]:
    """The node of an ``EXPLAIN`` that reads ``ingress_log`` and its detail lines."""
    starts = [n for n, line in enumerate(lines) if " on ingress_log " in line]
    assert len(starts) == 1, lines
    start = starts[0]
    depth = len(lines[start]) - len(lines[start].lstrip())
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if len(line) - len(line.lstrip()) <= depth or line.lstrip().startswith("->"):
            break
        block.append(line)
    return block


async def test_the_probe_of_a_lane_never_marked_reads_no_row_of_a_large_analyzed_log(
    store: LogStore,
) -> None:
    """The sweeper's very question, with statistics: one look into the index, not a scan."""
    await fill_mix(store)
    assert await store.has_processed("messages") is False
    assert await store.has_processed("engagement") is True
    assert await store.has_processed("a") is False  # before every processed lane
    assert await store.has_processed("nowhere") is False  # after them
    if isinstance(store, SqliteLogStore):
        shown = await plan(store, "messages")
        assert "USING INDEX ingress_log_processed" in shown, shown
        assert "SCAN ingress_log" not in shown, shown
        steps = 0

        def count() -> int:
            nonlocal steps
            steps += 1
            return 0

        store._r.set_progress_handler(count, 1)  # one call a virtual machine instruction
        try:
            assert await store.has_processed("messages") is False
        finally:
            store._r.set_progress_handler(None, 1)
        assert steps < 100, steps  # a scan: several instructions a row
        return
    assert isinstance(store, PostgresLogStore)
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as conn:
        query = psycopg.sql.SQL("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ")
        found = await conn.execute(query + store._sql.has_processed, probe_params("messages"))
        lines = [str(row[0]) for row in await found.fetchall()]
    scan = scan_of_the_table(lines)
    assert "Seq Scan" not in scan[0], lines
    assert "using ingress_log_processed" in scan[0], lines
    assert "actual rows=0 " in scan[0] or "actual rows=1 " in scan[0], lines
    assert not any("Rows Removed" in line for line in scan), lines
