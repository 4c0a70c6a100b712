"""A purge of the SQLite log deletes in chunks, so the ingress can write while it runs."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from logstore.helpers import FakeClock, new_row

from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore, sql


def _insert_now(path: Path, row_id: str, received_at_ms: int) -> None:
    """Insert one row from a connection of its own that does not wait for the lock."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=0")  # locked: fail at once ("database is locked")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            sql.INSERT,
            (
                row_id,
                "meta",
                "t1",
                "k",
                "messages",
                "messages",
                f"ev-{row_id}",
                received_at_ms,
                json.dumps({}),
                b"{}",
            ),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_another_writer_gets_the_lock_between_purge_chunks(tmp_path: Path) -> None:
    """Between two purge chunks a writer that never waits can insert; the count stays exact."""
    clock = FakeClock()
    path = tmp_path / "log.db"
    store = SqliteLogStore(path, clock=clock, purge_chunk_rows=1_000)
    await store.open()
    try:
        old = [new_row(n, clock) for n in range(2_500)]
        unfinished = [new_row(n, clock) for n in range(2_500, 2_510)]
        assert all(await asyncio.gather(*(store.insert(r) for r in old + unfinished)))
        await store.mark_processed([r.id for r in old])
        clock.advance(60)
        cutoff_ms = clock.now_ms
        recent = [new_row(n, clock) for n in range(3_000, 3_010)]
        assert all(await asyncio.gather(*(store.insert(r) for r in recent)))
        await store.mark_processed([r.id for r in recent])

        progress: list[int] = []

        async def between_chunks(deleted: int) -> None:
            progress.append(deleted)
            await asyncio.to_thread(_insert_now, path, f"extra-{deleted}", cutoff_ms - 1)

        store.purge_progress = between_chunks
        deleted = await store.purge(cutoff_ms)

        assert deleted == len(old)
        assert progress == [1_000, 2_000]
        counts = await store.count_by_state(Selection())
        assert counts == {RowState.RECEIVED: 10 + 2, RowState.PROCESSED: 10}
    finally:
        await store.close()
