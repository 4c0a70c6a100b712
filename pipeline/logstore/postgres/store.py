"""The PostgreSQL log store: psycopg 3 with an async connection pool, safe with several replicas.

Inserts are group-committed like on SQLite (:class:`~pipeline.logstore.batch.Batcher`), here as
one multi-row ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING RETURNING id`` per
batch: one round trip and one WAL flush for many webhooks. Each statement runs in autocommit
mode, so it is durable when it returns: a session whose ``synchronous_commit`` the database, role
or server sets to ``off`` (a commit returns before its WAL is flushed, and a server crash loses
it) is set to ``on`` when the pool opens it; ``local`` and the stronger modes are kept.

Several ingress replicas share the table: the unique ``(source, event_id)`` constraint dedupes
across them, and the sweeper's claims use ``FOR UPDATE SKIP LOCKED`` plus a lease column.

A statement the ingress, its dispatcher, the sweeper or ``mark_processed`` waits on must be
answered within the connection timeout: a server that hangs, or a network path that died with
the connection open, would otherwise hold a group commit, and every webhook queued behind it,
without end. Past the timeout the connection's socket is shut down, so the statement fails at
once (no cancel request to a server that does not answer), and the pool discards it. A bulk
statement (purge, replay pages, counts, read by ``pipeline purge``, ``replay`` and ``status``)
may rightly take longer: while it runs the server is checked on another connection every
timeout, and the statement is failed the same way once a check goes unanswered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from types import TracebackType
from typing import Any, Self

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from pipeline.config import hide_credentials
from pipeline.logstore import LogStoreError
from pipeline.logstore.batch import Batcher, Committed
from pipeline.logstore.postgres.sql import PROCESSED_COMMAND, Statements
from pipeline.logstore.probe import PROBE_ID, probe_row
from pipeline.logstore.protocol import TERMINAL_STATES, LogRow, NewRow, RowState, Selection

log = logging.getLogger(__name__)

Query = Any  # a composed psycopg query
PROCESSED_INDEX_MAX_ROWS = 250_000
"""The most rows of a table whose ``ingress_log_processed`` :meth:`PostgresLogStore.open` builds.

The build reads the whole table while every insert and update of it waits (the ingress's
statements are answered within ``connect_timeout_s``, 3 s, or the webhook gets a 503). Measured
(PostgreSQL 15, rows of a 700-byte body): a million rows are a 977 MB table, read in 0.6 to
0.9 s from memory, and an insert of another replica waited 1.1 s for the build; a table read from
disk takes several times longer. A quarter of that, about 250 MB, is built in a fraction of a
second even from a slow disk; a larger table's index is left to the operator, who builds it
without blocking writes (``CREATE INDEX CONCURRENTLY``, named in a warning at open).
"""
PURGE_BATCH_ROWS = 5_000
"""The most rows one statement of :meth:`PostgresLogStore.purge` deletes.

Measured (PostgreSQL 15, rows of a 700-byte body, from memory): one statement deleted 200,000
rows in 0.22 s, about a second a million, so one statement for the tens of millions of a busy
log's month runs for tens of seconds, longer from disk; a batch of 5,000 took 30 ms.
"""
_compact_json = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per row
_SYNCHRONOUS_COMMIT = sql.SQL(
    "SELECT set_config('synchronous_commit', 'on', false)"
    " WHERE current_setting('synchronous_commit') = 'off'"
)
"""Only ``off`` answers before the flush; ``local`` to ``remote_apply`` are durable already."""


class PostgresLogStore:
    """A :class:`~pipeline.logstore.protocol.LogStore` in a PostgreSQL table."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = "public",
        min_connections: int = 1,
        max_connections: int = 10,
        max_batch: int = 512,
        connect_timeout_s: float = 3.0,
        clock: Callable[[], float] = time.time,
        processed_index_max_rows: int = PROCESSED_INDEX_MAX_ROWS,
        purge_batch_rows: int = PURGE_BATCH_ROWS,
    ) -> None:
        """Describe the store; nothing connects until :meth:`open`.

        Args:
            url: ``postgresql://user:password@host:port/database``.
            schema: the schema holding ``ingress_log`` (created if missing); tests use one each.
            min_connections: connections the pool keeps open.
            max_connections: most connections the pool opens.
            max_batch: most rows inserted by one statement.
            connect_timeout_s: longest wait for a connection, pooled or new, and for the answer
                to a statement; an operation that gets neither in time fails (the server is
                unreachable or does not answer). A bulk statement (purge, replay pages, counts)
                may run longer, as long as the server answers a check within it meanwhile.
            clock: seconds since the epoch; tests pass a fake one.
            processed_index_max_rows: the most rows (as the planner estimates them) of a table
                whose index ``ingress_log_processed`` :meth:`open` builds; a larger table's is
                left to the operator (one warning says how).
            purge_batch_rows: most rows one statement (one transaction) of :meth:`purge`
                deletes.
        """
        self._url = url
        self._processed_index_max_rows = processed_index_max_rows
        self._purge_batch_rows = purge_batch_rows
        self.purge_progress: Callable[[int], Awaitable[None]] | None = None
        """Awaited between two batches of a purge with the rows deleted so far (committed)."""
        self._schema = schema
        self._sql = Statements(schema)
        self._clock = clock
        self._answer_timeout_s = connect_timeout_s
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]] = AsyncConnectionPool(
            url,
            min_size=min_connections,
            max_size=max_connections,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(2, math.ceil(connect_timeout_s)),
                # No server-side prepared statements: behind a transaction-mode PgBouncer each
                # statement may reach another server connection, where the one psycopg prepared
                # (after 5 runs) is missing, or is another client's statement of the same name.
                # All they saved was the server's parse and plan of a short statement.
                "prepare_threshold": None,
            },
            timeout=connect_timeout_s,
            # A pooled connection broken while idle (the server restarted) is replaced before
            # use instead of failing the group commit it was handed to; a check the server does
            # not answer fails in time too.
            check=self._check,
            configure=self._configure,
            # Reconnection in the background gives up this soon, and the next operation starts
            # a new attempt at once: the store is back within seconds of the server, not after
            # a backoff that doubles up to minutes.
            reconnect_timeout=connect_timeout_s,
            open=False,
        )
        self._inserts: Batcher[NewRow, bool] = Batcher(
            self._insert_batch, max_batch, alone_when=_row_fault
        )

    def __repr__(self) -> str:
        """Name the schema (never the URL, which may hold a password)."""
        return f"PostgresLogStore(schema={self._schema!r})"

    def observe_commits(self, committed: Committed) -> None:
        """Tell ``committed`` of every group commit of inserts: its rows and its seconds."""
        self._inserts.committed = committed

    async def open(self) -> None:
        """Open the pool and create the schema, table and indexes missing (idempotent, race-safe).

        Only what the catalog lacks is created: an existing log's open takes no lock on its
        table, so it never waits behind a long write of it (a purge's statement, an operator's
        transaction) with every insert of every replica queued behind it in turn.

        The index ``ingress_log_processed`` (added to tables made before it, for
        :meth:`has_processed`) is built only on a table of at most ``processed_index_max_rows``:
        a larger one would hold off every write of it (every replica's webhooks) for as long as
        the build reads it. It is left to the operator then, in one warning naming the command
        that builds it without blocking writes; until it is built, :meth:`has_processed` answers
        None. An index left invalid by a failed ``CREATE INDEX CONCURRENTLY`` counts as missing.
        """
        try:
            # One connection first: a wrong password or host fails at once with the server's
            # reason, where the pool would retry for its whole timeout and say only that.
            probe = await psycopg.AsyncConnection.connect(self._url, connect_timeout=10)
            await probe.close()
            await self._pool.open(wait=True, timeout=10.0)
        except Exception as exc:  # psycopg.Error, or psycopg_pool.PoolTimeout which is not one
            lines = [
                " ".join(line.removeprefix("connection failed: ").split())
                for line in str(exc).splitlines()
            ]
            reason = " ".join(dict.fromkeys(line for line in lines if line))  # one per host tried
            reason = hide_credentials(reason, self._url)  # a store built without the settings
            fix = ""
            if "password authentication failed" in reason:  # not a server to start or wait for
                fix = "; set the user and password the server expects in PIPELINE_POSTGRES__URL"
            raise LogStoreError(
                f"cannot connect to the log database (PIPELINE_POSTGRES__URL): {reason}{fix}"
            ) from exc
        async with self._pool.connection() as conn, conn.transaction():
            await self._migrate(conn)
            await self._migrate_processed(conn)

    async def _migrate(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        """Make the schema, table and indexes that are missing, and only those.

        The catalog is read first (under the advisory lock serialising every store's migration,
        so one waiting reads what the one before it made): an existing log's open takes no lock
        on its table, where ``CREATE INDEX IF NOT EXISTS`` of an index that exists takes its
        SHARE lock. Waiting for that behind a long write (a purge's statement), the open made
        every insert of every replica wait behind it.
        """
        await conn.execute(self._sql.migrate_lock)
        names = [name for name, _ in self._sql.objects]
        cur = await conn.execute(self._sql.found, [names])
        rows = await cur.fetchall()
        if not rows:
            await conn.execute(self._sql.create_schema)
        found = {name for (name,) in rows}
        for name, statement in self._sql.objects:
            if name not in found:
                await conn.execute(statement)

    async def _migrate_processed(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        """Build ``ingress_log_processed`` if missing and the table small; else say how to."""
        cur = await conn.execute(self._sql.processed)
        valid, size = await cur.fetchone() or (None, 0)
        if valid:
            return
        rows = 0.0
        # What follows reads the catalog only (and the planner's estimate: an ACCESS SHARE
        # lock, which no write waits for), but for the build of a small table's index.
        if size:  # not a new table: the planner's estimate, no row read
            cur = await conn.execute(self._sql.rows)
            plan = await cur.fetchone()
            rows = float(plan[0][0]["Plan"]["Plan Rows"]) if plan is not None else math.inf
        if rows <= self._processed_index_max_rows:
            await conn.execute(self._sql.create_processed)
            return
        table = f"{_shown(self._schema)}.ingress_log"
        command = PROCESSED_COMMAND.format(table=table)
        if valid is False:
            command = (
                f"DROP INDEX CONCURRENTLY {_shown(self._schema)}.ingress_log_processed; {command}"
            )
        log.warning(
            "the log table %s holds about %d rows (%d MB), too many to build its index "
            "ingress_log_processed%s at open without holding up every write of it: until it is "
            "built, the sweeper cannot tell whether a lane's rows are ever marked processed "
            "(nor warns when none is); build it without blocking writes with: %s",
            table,
            rows,
            size // 2**20,
            " (invalid: a CREATE INDEX CONCURRENTLY failed, or still runs)"
            if valid is False
            else "",
            command,
            extra={"table": table, "rows": int(rows)},
        )

    async def close(self) -> None:
        """Finish pending inserts and close the pool."""
        await self._inserts.drain()
        await self._pool.close()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def _configure(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        """Make a new session's commits wait for their WAL flush (the row survives a crash)."""
        with _Deadline(conn, self._answer_timeout_s):
            await conn.execute(_SYNCHRONOUS_COMMIT)

    async def _check(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        with _Deadline(conn, self._answer_timeout_s):
            await AsyncConnectionPool.check_connection(conn)

    @asynccontextmanager
    async def _connection(self, *, bounded: bool) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection; with ``bounded``, one whose statements must be answered in time.

        psycopg errors become :class:`LogStoreError`. A connection left without an answer is
        shut down (and so discarded by the pool): the statement's outcome is unknown, and the
        caller fails as for any other error (an insert that did land is deduplicated when the
        provider retries, and produced by the sweeper).
        """
        deadline: _Deadline | None = None
        watch: asyncio.Task[None] | None = None
        try:
            async with self._pool.connection() as conn:
                with _Deadline(conn, self._answer_timeout_s if bounded else None) as deadline:
                    if not bounded:
                        watch = asyncio.create_task(self._until_silent())
                        watch.add_done_callback(_expire_unless_cancelled(deadline))
                    try:
                        yield conn
                    except psycopg.errors.ReadOnlySqlTransaction:
                        # Opened while the server or database was read-only, the session stays
                        # so after it writes again: closed, the pool opens another.
                        await conn.close()
                        raise
                    finally:
                        if watch is not None:
                            watch.cancel()
        except psycopg.Error as exc:
            if deadline is not None and deadline.expired:
                raise LogStoreError(
                    f"the log database did not answer within {self._answer_timeout_s:g} s"
                    " (PIPELINE_POSTGRES__CONNECT_TIMEOUT_S): connection closed, the statement"
                    " may or may not have taken effect"
                ) from exc
            raise LogStoreError(f"log database error: {exc}") from exc

    async def _until_silent(self) -> None:
        """Return once the server leaves a check on another connection unanswered.

        A bulk statement (purge, replay pages, counts) may rightly run for longer than the
        answer timeout; while it runs the server is asked, every answer timeout, to answer an
        empty query within it. A server that does not (hung, or its network path dead) would
        never answer the bulk statement either.
        """
        while True:
            await asyncio.sleep(self._answer_timeout_s)
            try:
                await self._execute(sql.SQL(""), [])
            except LogStoreError:
                return

    async def _execute(
        self, query: Query, params: Sequence[object] | dict[str, object], *, bounded: bool = True
    ) -> int:
        async with self._connection(bounded=bounded) as conn:
            cur = await conn.execute(query, params)
            return cur.rowcount

    async def _fetch(
        self, query: Query, params: Sequence[object] | dict[str, object], *, bounded: bool = True
    ) -> list[TupleRow]:
        async with self._connection(bounded=bounded) as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall()

    async def probe_write(self, body_bytes: int = 0) -> None:
        """Commit a row and its deletion in one transaction: whether a webhook's row would commit.

        The row is inserted by the statement inserts use, in a transaction begun as theirs are
        (a server read-only after a failover, or a database or role whose sessions default to
        read-only, refuses it), and answered within the connection timeout. Its body is
        ``body_bytes`` random bytes, which TOAST cannot compress: the server writes them (WAL
        and table) as a webhook's of that size. Nothing is left of it: no other session ever
        sees the row.

        Raises:
            LogStoreError: the transaction could not commit.
        """
        # Drawn in a worker thread, not the event loop's: some 3 ms a MiB, each second while
        # unready, that the loop answering webhooks and /readyz would wait.
        random = await asyncio.to_thread(os.urandom, body_bytes) if body_bytes else b""
        row = probe_row(random)
        columns = [[value] for value in row]
        async with self._connection(bounded=True) as conn, conn.transaction():
            await conn.execute(self._sql.insert, columns)
            await conn.execute(self._sql.delete_probe, [PROBE_ID])

    # IngressLog

    async def insert(self, row: NewRow) -> bool:
        """Store ``row``, committed with whatever else is pending; False if a duplicate."""
        return await self._inserts.submit(row)

    async def _insert_batch(self, rows: Sequence[NewRow]) -> list[bool]:
        columns: list[list[Any]] = [[] for _ in range(10)]
        for r in rows:
            values = (
                r.id,
                r.source,
                r.tenant,
                r.key,
                r.topic,
                r.lane,
                r.event_id,
                r.received_at_ms,
                _compact_json(dict(r.headers)),
                r.body,
            )
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        inserted = {found[0] for found in await self._fetch(self._sql.insert, columns)}
        return [r.id in inserted for r in rows]

    async def mark_produced(self, ids: Sequence[str]) -> None:
        """``received -> produced`` (processed and abandoned rows stay as they are)."""
        if ids:
            await self._execute(self._sql.mark_produced, [self._now_ms(), list(ids)])

    async def record_failure(self, ids: Sequence[str], error: str) -> None:
        """Count a failed produce attempt and keep ``error``."""
        if ids:
            await self._execute(self._sql.record_failure, [error[:2000], list(ids)])

    # ProcessedMarker

    async def mark_processed(self, ids: Sequence[str]) -> int:
        """Mark rows processed in one statement; returns how many changed state."""
        if not ids:
            return 0
        return await self._execute(self._sql.mark_processed, [list(ids)])

    async def mark_running(self, ids: Sequence[str]) -> int:
        """Show produced rows' events still running (their patience starts again)."""
        if not ids:
            return 0
        return await self._execute(self._sql.mark_running, [self._now_ms(), list(ids)])

    # SweepLog

    async def claim_unproduced(
        self, received_before_ms: int, limit: int, lease_ms: int
    ) -> list[LogRow]:
        """Lease rows still ``received`` that arrived before ``received_before_ms``."""
        now_ms = self._now_ms()
        params: dict[str, object] = {
            "lease_until": now_ms + lease_ms,
            "before": received_before_ms,
            "now": now_ms,
            "limit": limit,
        }
        rows = await self._fetch(self._sql.claim_unproduced, params)
        return sorted((_row(r) for r in rows), key=lambda row: row.received_at_ms)

    async def claim_unprocessed(
        self,
        produced_before_ms: int,
        limit: int,
        lease_ms: int,
        *,
        patient_topics: Collection[str] = (),
        overdue_before_ms: int = 0,
        overdue_by_topic_ms: Mapping[str, int] | None = None,
    ) -> list[LogRow]:
        """Lease produced rows past patience (patient topics only once overdue)."""
        now_ms = self._now_ms()
        later = sorted((overdue_by_topic_ms or {}).items())
        params: dict[str, object] = {
            "lease_until": now_ms + lease_ms,
            "now": now_ms,
            "before": produced_before_ms,
            "patient": sorted(patient_topics),
            "overdue": overdue_before_ms,
            "overdue_topics": [topic for topic, _ in later],
            "overdue_times": [before for _, before in later],
            "limit": limit,
        }
        rows = await self._fetch(self._sql.claim_unprocessed, params)
        return sorted((_row(r) for r in rows), key=lambda row: row.produced_at_ms or 0)

    async def has_processed(self, lane: str) -> bool | None:
        """Whether a row of ``lane`` is processed (one probe of an index); None without it."""
        rows = await self._fetch(self._sql.has_processed, {"lane": lane})
        found = rows[0][0]
        return None if found is None else bool(found)

    async def mark_replayed(self, ids: Sequence[str]) -> None:
        """Count one more replay, acknowledged now."""
        if ids:
            await self._execute(self._sql.mark_replayed, [self._now_ms(), list(ids)])

    async def abandon(self, ids: Sequence[str], reason: str, *, min_replays: int = 0) -> int:
        """Give up on rows not yet processed, replayed ``min_replays`` times; returns how many."""
        if not ids:
            return 0
        return await self._execute(self._sql.abandon, [reason[:2000], min_replays, list(ids)])

    # ReplayLog

    async def select(self, selection: Selection, *, after_id: str = "", limit: int) -> list[LogRow]:
        """A page of ``selection`` in id order."""
        query, params = self._sql.select(selection)
        rows = await self._fetch(query, [*params, after_id, limit], bounded=False)
        return [_row(r) for r in rows]

    async def last_id(self, selection: Selection) -> str | None:
        """The highest id of ``selection``, or None."""
        query, params = self._sql.last_id(selection)
        rows = await self._fetch(query, params, bounded=False)
        return str(rows[0][0]) if rows else None

    async def count_by_state(self, selection: Selection) -> dict[RowState, int]:
        """Rows of ``selection`` per state."""
        query, params = self._sql.count_by_state(selection)
        rows = await self._fetch(query, params, bounded=False)
        return {RowState(state): count for state, count in rows}

    async def get(self, row_id: str) -> LogRow | None:
        """One row by id."""
        rows = await self._fetch(self._sql.get, [row_id])
        return _row(rows[0]) if rows else None

    async def mark_replayed_by_hand(self, ids: Sequence[str]) -> None:
        """A replay by hand, acknowledged now: the sweeper's count and patience start again."""
        if ids:
            await self._execute(self._sql.mark_replayed_by_hand, [self._now_ms(), list(ids)])

    # LogStore

    async def oldest_unfinished_ms(self, received_before_ms: int) -> int | None:
        """The receive time of the oldest unfinished row received before the given time."""
        rows = await self._fetch(self._sql.oldest_unfinished, [received_before_ms])
        return int(rows[0][0]) if rows else None

    async def purge(
        self, older_than_ms: int, states: Collection[RowState] = TERMINAL_STATES
    ) -> int:
        """Delete old rows in ``states``, oldest first, in batches; returns how many.

        Each batch of ``purge_batch_rows`` is one statement, its own transaction: no statement
        holds the table for long. Inserts do not wait for a ``DELETE``, but a statement asking
        for a lock that conflicts with it does (an index build, another version's migration),
        and every insert then waits behind that one: one ``DELETE`` of a whole month's rows held
        them for as long as it ran (about a second a million rows).
        """
        chosen = sorted(str(state) for state in states)
        deleted = 0
        from_ms = -(2**63)
        while True:
            params = {
                "before": older_than_ms,
                "from": from_ms,
                "states": chosen,
                "limit": self._purge_batch_rows,
            }
            rows = await self._fetch(self._sql.purge, params, bounded=False)
            gone, read, newest = rows[0]
            deleted += int(gone)
            if read < self._purge_batch_rows or newest is None:
                return deleted
            from_ms = newest
            if self.purge_progress is not None:
                await self.purge_progress(deleted)


def _shown(name: str) -> str:
    """``name`` as an operator types it in SQL: bare when it can be, else quoted."""
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _row(r: Sequence[Any]) -> LogRow:
    return LogRow(
        id=r[0],
        source=r[1],
        tenant=r[2],
        key=r[3],
        topic=r[4],
        lane=r[5],
        event_id=r[6],
        received_at_ms=r[7],
        headers=r[8],
        body=bytes(r[9]),
        state=RowState(r[10]),
        produce_attempts=r[11],
        replay_count=r[12],
        last_error=r[13],
        produced_at_ms=r[14],
    )


def _expire_unless_cancelled(deadline: _Deadline) -> Callable[[asyncio.Task[None]], None]:
    """A done callback expiring ``deadline`` when its watch returned (the server fell silent)."""

    def done(watch: asyncio.Task[None]) -> None:
        if not watch.cancelled():
            deadline.expire()

    return done


class _Deadline:
    """Shuts ``conn``'s socket down if the block is still running after ``seconds`` (None: never).

    A shut-down socket makes the statement waiting on it fail at once with a psycopg
    ``OperationalError``, and leaves the connection closed (so the pool discards it). Cancelling
    the statement instead would make psycopg send a cancel request and wait for the server's
    answer, which a server that does not answer never gives (5 s, then 5 s more).
    """

    def __init__(self, conn: psycopg.AsyncConnection[Any], seconds: float | None) -> None:
        """Arm the deadline on entering the block."""
        self._conn = conn
        self._seconds = seconds
        self._timer: asyncio.TimerHandle | None = None
        self.expired = False

    def __enter__(self) -> Self:
        """Start the clock."""
        if self._seconds is not None:
            self._timer = asyncio.get_running_loop().call_later(self._seconds, self.expire)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the clock."""
        if self._timer is not None:
            self._timer.cancel()

    def expire(self) -> None:
        """Shut the connection's socket down now (the statement waiting on it fails)."""
        self.expired = True
        try:
            fd = self._conn.pgconn.socket
        except psycopg.Error:  # already closed
            return
        # A duplicate of the descriptor: shutdown acts on the connection, and libpq still owns
        # (and later closes) its own descriptor, which is never closed under it.
        with socket.socket(fileno=os.dup(fd)) as sock, suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _row_fault(exc: Exception) -> bool:
    """Whether a failed batch insert may be one row's fault (not an unreachable server)."""
    return not isinstance(
        exc.__cause__, psycopg.OperationalError | psycopg.errors.ReadOnlySqlTransaction
    )
