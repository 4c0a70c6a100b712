"""The SQLite log's WAL stays bounded under steady writes: checkpoints let it start over."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from logstore.helpers import FakeClock, new_row

from pipeline.logstore.sqlite import SqliteLogStore

CHECKPOINT_ROWS = 200


async def test_the_wal_starts_over_after_a_checkpoint_that_rows_were_committed_during(
    tmp_path: Path,
) -> None:
    """Rows committed while the background checkpoint copies do not keep the WAL from rewinding."""
    path = tmp_path / "log.db"
    store = SqliteLogStore(path, synchronous="OFF", checkpoint_rows=CHECKPOINT_ROWS)
    await store.open()
    loop = asyncio.get_running_loop()
    copied, go_on = asyncio.Event(), threading.Event()
    copy = store._checkpoint  # held open while rows are committed

    def copy_then_hold(mode: str) -> None:
        copy(mode)
        if mode == "PASSIVE":
            loop.call_soon_threadsafe(copied.set)
            go_on.wait()

    store._checkpoint = copy_then_hold  # type: ignore[method-assign]
    clock = FakeClock()
    try:
        for n in range(CHECKPOINT_ROWS):  # the last commit starts the background checkpoint
            assert await store.insert(new_row(n, clock)) is True
        await copied.wait()
        for n in range(CHECKPOINT_ROWS, CHECKPOINT_ROWS + 20):  # committed during the copy
            assert await store.insert(new_row(n, clock)) is True
        go_on.set()
        checkpointing = store._checkpointing
        if checkpointing is not None:
            await checkpointing
        assert await store.insert(new_row(10_000, clock)) is True  # rewinds the WAL, or appends
        probe = sqlite3.connect(path)
        try:
            _, wal_frames, _ = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            probe.close()
    finally:
        go_on.set()
        await store.close()
    # A rewound WAL holds the last commit's few pages; one appended to holds every commit since.
    assert wal_frames < 20, wal_frames
