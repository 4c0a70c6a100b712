"""The embedded log store: one SQLite file in WAL mode, with group commit.

Durability. Every write goes through one writer connection on one thread. Inserts are batched
by :class:`~pipeline.logstore.batch.Batcher`: rows that arrive while a commit is in progress
share the next transaction, so many answered webhooks cost one WAL fsync. ``synchronous``
decides what "durable" means (https://www.sqlite.org/pragma.html#pragma_synchronous):

* ``FULL`` (the default): the WAL is fsynced at every commit; an answered row survives
  ``kill -9`` of the process and a power loss or kernel crash.
* ``NORMAL``: no fsync at commit (only at checkpoints); an answered row survives ``kill -9`` of
  the process, but the last commits may be lost on power loss. Use it only where the disk cache
  is battery-backed or losing a few seconds on power loss is acceptable.
* ``OFF``: for benchmarks only ("durability off").

Reads for the replay CLI run on a second connection and thread, so they never wait behind the
writer (WAL readers do not block the writer nor the writer them). Checkpoints (copying the WAL
back into the database) run on a third connection and thread, in ``PASSIVE`` mode, after every
``checkpoint_rows`` committed rows: SQLite's automatic checkpoint would run inside a commit and
stall every webhook waiting on it for the whole copy. What was committed during the copy is
then copied by the writer between two commits (a few pages), so that the next commit starts the
WAL over: otherwise, under steady load, it would grow without end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

from pipeline.logstore import LogStoreError
from pipeline.logstore.batch import Batcher, Committed
from pipeline.logstore.probe import PROBE_ID, probe_row
from pipeline.logstore.protocol import TERMINAL_STATES, LogRow, NewRow, RowState, Selection
from pipeline.logstore.sqlite import sql

Synchronous = Literal["FULL", "NORMAL", "OFF"]
P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger(__name__)

_CHUNK = 500  # ids per UPDATE, well under SQLite's bound-parameter limit
_PURGE_PAUSE_S = 0.1  # between two purge chunks: SQLite's busy handler sleeps 100 ms at most
_IOERR_SHMSIZE = 4874  # SQLITE_IOERR_SHMSIZE: the -shm file could not be sized
_compact_json = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per row
PROCESSED_INDEX_MAX_ROWS = 1_000_000
"""The most rows of a log whose ``ingress_log_processed`` :meth:`SqliteLogStore.open` builds.

The build reads the whole table under the write lock, before the process serves: measured, a
log of 3 million rows of a 700-byte body (3.2 GB) opened in 2.5 s instead of at once, so a
million rows hold the start up under a second, and another process writing the file meanwhile
(``pipeline sweep``) well within its ``busy_timeout`` (10 s). A 30-day log of a busy system (a
hundred million rows) would take minutes: its index is left to the operator (a warning at open).
"""


class SqliteLogStore:
    """A :class:`~pipeline.logstore.protocol.LogStore` in one SQLite file.

    One process should own the file for writing at a time (the ingress, with its sweeper task);
    a second process (``pipeline sweep``, ``pipeline replay``) may open it too: SQLite's lock
    serialises the writers and ``busy_timeout`` makes them wait instead of failing.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        synchronous: Synchronous = "FULL",
        max_batch: int = 512,
        clock: Callable[[], float] = time.time,
        checkpoint_rows: int = 2_000,
        purge_chunk_rows: int = 2_000,
        processed_index_max_rows: int = PROCESSED_INDEX_MAX_ROWS,
    ) -> None:
        """Describe the store; nothing is opened until :meth:`open`.

        Args:
            path: the database file (created with its directory if missing).
            synchronous: the durability setting (see the module docstring).
            max_batch: most rows committed in one transaction.
            clock: seconds since the epoch; tests pass a fake one.
            checkpoint_rows: rows committed between two background checkpoints.
            purge_chunk_rows: most rows one transaction of :meth:`purge` deletes.
            processed_index_max_rows: the most rows (the span of their rowids) of a log whose
                index ``ingress_log_processed`` :meth:`open` builds; a larger log's is left to
                the operator (one warning says how).
        """
        self._path = Path(path)
        self._synchronous = synchronous
        self._clock = clock
        self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="logstore-sqlite-w")
        self._reader_pool = ThreadPoolExecutor(1, thread_name_prefix="logstore-sqlite-r")
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._checkpoint_pool = ThreadPoolExecutor(1, thread_name_prefix="logstore-sqlite-c")
        self._checkpointer: sqlite3.Connection | None = None
        self._checkpoint_rows = checkpoint_rows
        self._purge_chunk_rows = purge_chunk_rows
        self._processed_index_max_rows = processed_index_max_rows
        self._rows_since_checkpoint = 0
        self._checkpointing: asyncio.Future[None] | None = None
        self._inserts: Batcher[NewRow, bool] = Batcher(
            self._insert_batch, max_batch, alone_when=_row_fault
        )
        self.purge_progress: Callable[[int], Awaitable[None]] | None = None
        """Awaited between two chunks of a purge with the rows deleted so far (lock released)."""

    def __repr__(self) -> str:
        """Name the file and durability setting."""
        return f"SqliteLogStore({str(self._path)!r}, synchronous={self._synchronous})"

    def observe_commits(self, committed: Committed) -> None:
        """Tell ``committed`` of every group commit of inserts: its rows and its seconds."""
        self._inserts.committed = committed

    async def open(self) -> None:
        """Open both connections, switch to WAL and create the table and indexes.

        The index ``ingress_log_processed`` (added to logs made before it, for
        :meth:`has_processed`) is built only on a log of at most ``processed_index_max_rows``
        (:data:`PROCESSED_INDEX_MAX_ROWS`); a larger log's is left to the operator, in one
        warning naming the command, and until it is built :meth:`has_processed` answers None.

        Raises:
            LogStoreError: the database or its directory cannot be made or opened.
        """
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LogStoreError(
                f"cannot open the log database {self._path}: its directory cannot be made "
                f"({exc.strerror or exc})"
            ) from exc
        self._writer = await self._write(self._connect)
        self._reader = await self._read(self._connect)
        self._checkpointer = await self._on(self._checkpoint_pool, self._connect)
        await self._write(self._w.execute, "PRAGMA wal_autocheckpoint=0")

        def migrate() -> int | None:
            """Create what is missing; the log's rows when too many to build the index."""
            for statement in sql.SCHEMA:
                self._w.execute(statement)
            if self._w.execute(sql.PROCESSED_EXISTS).fetchone() is not None:
                return None
            found = self._w.execute(sql.ROWS).fetchone()
            rows = int(found[0]) if found is not None and found[0] is not None else 0
            if rows > self._processed_index_max_rows:
                return rows
            self._w.execute(sql.CREATE_PROCESSED)
            return None

        rows = await self._write(migrate)
        if rows is not None:
            log.warning(
                "the log %s holds about %d rows, too many to build its index "
                "ingress_log_processed at open (it reads them all, holding the file's write lock "
                "and the start up, about a second a million rows): until it is built, the sweeper "
                "cannot tell whether a lane's rows are ever marked processed (nor warns when none "
                'is); build it while the ingress is stopped with: sqlite3 %s "%s"',
                self._path,
                rows,
                self._path,
                sql.CREATE_PROCESSED,
                extra={"path": str(self._path), "rows": rows},
            )

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            for pragma in sql.PRAGMAS:
                conn.execute(pragma)
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
        except sqlite3.Error as exc:
            reason = full_volume(self._path, exc) or str(exc)
            raise LogStoreError(f"cannot open the log database {self._path}: {reason}") from exc
        return conn

    async def close(self) -> None:
        """Commit what is pending, checkpoint, then close every connection.

        A checkpoint that fails (a full disk: the database cannot grow to take the WAL) is
        logged, not raised: every committed row is in the WAL, which the next open reads (and a
        later checkpoint copies back), and the connections are closed all the same.
        """
        await self._inserts.drain()
        try:
            if self._checkpointing is not None:
                await self._checkpointing
            if self._checkpointer is not None:
                await self._on(self._checkpoint_pool, self._checkpoint, "TRUNCATE")
        except LogStoreError as exc:
            log.warning(
                "WAL checkpoint at close failed: %s; the rows stay in %s-wal, read when the "
                "database is next opened",
                exc,
                self._path,
            )
        for conn, pool in (
            (self._writer, self._writer_pool),
            (self._reader, self._reader_pool),
            (self._checkpointer, self._checkpoint_pool),
        ):
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(pool, conn.close)
            pool.shutdown(wait=True)
        self._writer = self._reader = self._checkpointer = None

    def _checkpoint(self, mode: str) -> None:
        if self._checkpointer is not None:
            self._checkpointer.execute(f"PRAGMA wal_checkpoint({mode})")

    def _committed(self, rows: int) -> None:
        """Count committed rows; start a background checkpoint every ``checkpoint_rows``."""
        self._rows_since_checkpoint += rows
        if self._rows_since_checkpoint < self._checkpoint_rows or self._checkpointing is not None:
            return
        self._rows_since_checkpoint = 0
        self._checkpointing = asyncio.ensure_future(self._checkpoint_passive())

        def done(future: asyncio.Future[None]) -> None:
            self._checkpointing = None
            if not future.cancelled() and future.exception() is not None:
                log.warning("WAL checkpoint failed: %s", future.exception())

        self._checkpointing.add_done_callback(done)

    async def _checkpoint_passive(self) -> None:
        """Copy the WAL back in the background, then the little committed meanwhile, in line.

        SQLite starts the WAL over (instead of appending to it) only at a commit that finds all
        of it copied; under steady load rows are always committed while the background copy
        runs, so that never happens and the WAL would grow without end. What they added is
        copied by the writer between two commits, a short stall, and the next commit rewinds.
        """
        await self._on(self._checkpoint_pool, self._checkpoint, "PASSIVE")
        await self._write(lambda: self._w.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall())

    @property
    def _w(self) -> sqlite3.Connection:
        if self._writer is None:
            raise LogStoreError("the log store is not open (call open() first)")
        return self._writer

    @property
    def _r(self) -> sqlite3.Connection:
        if self._reader is None:
            raise LogStoreError("the log store is not open (call open() first)")
        return self._reader

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def _write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._on(self._writer_pool, fn, *args, **kwargs)

    async def _read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._on(self._reader_pool, fn, *args, **kwargs)

    async def _on(
        self, pool: ThreadPoolExecutor, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        def call() -> T:
            try:
                return fn(*args, **kwargs)
            except sqlite3.Error as exc:
                reason = full_volume(self._path, exc) or f"log database error: {exc}"
                raise LogStoreError(reason) from exc

        return await asyncio.get_running_loop().run_in_executor(pool, call)

    def _transaction(self, body: Callable[[sqlite3.Cursor], T]) -> T:
        """Run ``body`` in one ``BEGIN IMMEDIATE`` transaction on the writer (writer thread)."""
        cur = self._w.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            result = body(cur)
            cur.execute("COMMIT")
        except BaseException:
            if self._w.in_transaction:
                cur.execute("ROLLBACK")
            raise
        return result

    async def probe_write(self, body_bytes: int = 0) -> None:
        """Commit a row and its deletion in one transaction: whether a webhook's row would commit.

        The row's body is ``body_bytes`` random bytes, written to the WAL as a webhook's would
        be: on a nearly full volume a small row still commits where a webhook of that size does
        not. Nothing is left of it (no reader sees the row); its WAL frames take their room until
        the next checkpoint. While the log cannot write (its volume is full) this raises what an
        insert would.

        Raises:
            LogStoreError: the transaction could not commit.
        """

        def body(cur: sqlite3.Cursor) -> None:
            # Drawn in the writer's thread, not the event loop's: some 3 ms a MiB, each second
            # while unready, that the loop answering webhooks and /readyz would wait.
            random = os.urandom(body_bytes)
            row = probe_row(random)
            cur.execute(sql.INSERT, row)
            cur.execute(sql.DELETE_PROBE, (PROBE_ID,))

        await self._write(self._transaction, body)

    # IngressLog

    async def insert(self, row: NewRow) -> bool:
        """Store ``row``, committed with whatever else is pending; False if a duplicate."""
        return await self._inserts.submit(row)

    async def _insert_batch(self, rows: Sequence[NewRow]) -> list[bool]:
        params = [
            (
                r.id,
                r.source,
                r.tenant,
                r.key,
                r.topic,
                r.lane,
                r.event_id,
                r.received_at_ms,
                _compact_json(r.headers),
                r.body,
            )
            for r in rows
        ]

        def body(cur: sqlite3.Cursor) -> list[bool]:
            cur.executemany(sql.INSERT, params)
            if cur.rowcount == len(rows):  # the common case: no redelivery in the batch
                return [True] * len(rows)
            # Some were duplicates: the fresh ids that now exist are the ones inserted.
            ids = [r.id for r in rows]
            found = {
                found_id
                for start in range(0, len(ids), _CHUNK)
                for (found_id,) in cur.execute(
                    sql.existing_ids(len(ids[start : start + _CHUNK])), ids[start : start + _CHUNK]
                )
            }
            return [r.id in found for r in rows]

        inserted = await self._write(self._transaction, body)
        self._committed(len(rows))
        return inserted

    async def mark_produced(self, ids: Sequence[str]) -> None:
        """``received -> produced`` (processed and abandoned rows stay as they are)."""
        await self._update_ids(sql.mark_produced, ids, self._now_ms())

    async def record_failure(self, ids: Sequence[str], error: str) -> None:
        """Count a failed produce attempt and keep ``error``."""
        await self._update_ids(sql.record_failure, ids, error[:2000])

    # ProcessedMarker

    async def mark_processed(self, ids: Sequence[str]) -> int:
        """Mark rows processed in one transaction; returns how many changed state."""
        return await self._update_ids(sql.mark_processed, ids)

    async def mark_running(self, ids: Sequence[str]) -> int:
        """Show produced rows' events still running (their patience starts again)."""
        return await self._update_ids(sql.mark_running, ids, self._now_ms())

    # SweepLog

    async def claim_unproduced(
        self, received_before_ms: int, limit: int, lease_ms: int
    ) -> list[LogRow]:
        """Lease rows still ``received`` that arrived before ``received_before_ms``."""
        now_ms = self._now_ms()
        params = {
            "lease_until": now_ms + lease_ms,
            "before": received_before_ms,
            "now": now_ms,
            "limit": limit,
        }
        rows = await self._write(
            self._transaction, lambda cur: cur.execute(sql.CLAIM_UNPRODUCED, params).fetchall()
        )
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
        topics = sorted(patient_topics)
        later = sorted((overdue_by_topic_ms or {}).items())
        statement = sql.claim_unprocessed(len(topics), len(later))
        params = [now_ms + lease_ms, now_ms, produced_before_ms, overdue_before_ms, *topics, limit]
        params += [value for pair in later for value in pair]
        rows = await self._write(
            self._transaction, lambda cur: cur.execute(statement, params).fetchall()
        )
        return sorted((_row(r) for r in rows), key=lambda row: row.produced_at_ms or 0)

    async def has_processed(self, lane: str) -> bool | None:
        """Whether a row of ``lane`` is processed (one probe of an index); None without it."""

        def probe() -> bool | None:
            if self._r.execute(sql.PROCESSED_EXISTS).fetchone() is None:
                return None
            return self._r.execute(sql.HAS_PROCESSED, (lane,)).fetchone() is not None

        return await self._read(probe)

    async def mark_replayed(self, ids: Sequence[str]) -> None:
        """Count one more replay, acknowledged now."""
        await self._update_ids(sql.mark_replayed, ids, self._now_ms())

    async def abandon(self, ids: Sequence[str], reason: str, *, min_replays: int = 0) -> int:
        """Give up on rows not yet processed, replayed ``min_replays`` times; returns how many."""
        return await self._update_ids(sql.abandon, ids, reason[:2000], min_replays)

    # ReplayLog

    async def select(self, selection: Selection, *, after_id: str = "", limit: int) -> list[LogRow]:
        """A page of ``selection`` in id order."""
        statement, params = sql.select(selection)
        rows = await self._read(lambda: self._r.execute(statement, [*params, after_id, limit]))
        return [_row(r) for r in rows.fetchall()]

    async def last_id(self, selection: Selection) -> str | None:
        """The highest id of ``selection``, or None."""
        statement, params = sql.last_id(selection)
        found = await self._read(lambda: self._r.execute(statement, params).fetchone())
        return str(found[0]) if found is not None else None

    async def count_by_state(self, selection: Selection) -> dict[RowState, int]:
        """Rows of ``selection`` per state."""
        statement, params = sql.count_by_state(selection)
        rows = await self._read(lambda: self._r.execute(statement, params).fetchall())
        return {RowState(state): count for state, count in rows}

    async def get(self, row_id: str) -> LogRow | None:
        """One row by id."""
        found = await self._read(lambda: self._r.execute(sql.GET, (row_id,)).fetchone())
        return _row(found) if found is not None else None

    async def mark_replayed_by_hand(self, ids: Sequence[str]) -> None:
        """A replay by hand, acknowledged now: the sweeper's count and patience start again."""
        await self._update_ids(sql.mark_replayed_by_hand, ids, self._now_ms())

    # LogStore

    async def oldest_unfinished_ms(self, received_before_ms: int) -> int | None:
        """The receive time of the oldest unfinished row received before the given time."""
        statement = sql.OLDEST_UNFINISHED
        found = await self._read(
            lambda: self._r.execute(statement, (received_before_ms,)).fetchone()
        )
        return int(found[0]) if found is not None else None

    async def purge(
        self, older_than_ms: int, states: Collection[RowState] = TERMINAL_STATES
    ) -> int:
        """Delete old rows in ``states``, oldest first, in chunks; returns how many.

        Each chunk of ``purge_chunk_rows`` is its own transaction, and the write lock stays free
        for 100 ms after it: another process waiting to write (the ingress, whose busy handler
        tries again every 100 ms at most) commits in between instead of waiting for the whole
        purge, which for millions of rows would outlast its ``busy_timeout`` (10 s).
        """
        chosen = sorted(str(state) for state in states)
        statement = sql.purge(len(chosen))
        deleted = 0
        from_ms = -(2**63)
        while True:
            params = [older_than_ms, from_ms, self._purge_chunk_rows, *chosen]
            times = await self._write(self._transaction, _fetch_all(statement, params))
            deleted += len(times)
            if len(times) < self._purge_chunk_rows:
                return deleted
            from_ms = max(received_at_ms for (received_at_ms,) in times)
            if self.purge_progress is not None:
                await self.purge_progress(deleted)
            await asyncio.sleep(_PURGE_PAUSE_S)

    async def _update_ids(
        self, statement: Callable[[int], str], ids: Sequence[str], *first: Any
    ) -> int:
        if not ids:
            return 0

        def body(cur: sqlite3.Cursor) -> int:
            changed = 0
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                changed += cur.execute(statement(len(chunk)), [*first, *chunk]).rowcount
            return changed

        return await self._write(self._transaction, body)


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
        headers=json.loads(r[8]),
        body=bytes(r[9]),
        state=RowState(r[10]),
        produce_attempts=r[11],
        replay_count=r[12],
        last_error=r[13],
        produced_at_ms=r[14],
    )


def _fetch_all(statement: str, params: Sequence[object]) -> Callable[[sqlite3.Cursor], list[Any]]:
    """A transaction body running ``statement`` and returning its rows."""
    return lambda cur: cur.execute(statement, params).fetchall()


def full_volume(path: Path, exc: sqlite3.Error) -> str | None:
    """What to do, on one line, when ``exc`` says the volume of the database ``path`` is full.

    SQLite says ``SQLITE_FULL`` when a write finds no room, and ``SQLITE_IOERR_SHMSIZE`` when
    opening a log in WAL mode cannot make its ``-shm`` file (a cleanly closed log on a full
    volume). None for any other error.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or (code & 0xFF != sqlite3.SQLITE_FULL and code != _IOERR_SHMSIZE):
        return None
    return (
        f"the volume of the log database {path} is full ({exc}): free space on the volume of "
        f"{path} (delete other files there, or grow it); writes succeed again once there is room"
    )


def _row_fault(exc: Exception) -> bool:
    """Whether a failed batch insert may be one row's fault (not a locked or failing disk)."""
    return not isinstance(exc.__cause__, sqlite3.OperationalError)
