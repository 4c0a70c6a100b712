"""The fast path on a log that cannot write its marks: one line, backed off, no traceback.

On a full log volume every batched ``mark_produced`` of the fast path fails. Its rows are out on
the broker but stay ``received``, and the sweeper produces them again: worth one line saying so,
repeated as rarely as every other known failure (the handlers' :class:`RepeatFilter`), not a
traceback per batch.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from contract.helpers import make_topic
from logstore.helpers import FakeClock, new_row

from pipeline.ingress.dispatch import Dispatcher
from pipeline.log_repeats import RepeatFilter
from pipeline.logstore import LogStoreError, NewRow, RowState
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.logstore.sqlite.store import full_volume
from pipeline.transport.protocol import Transport

FAILED_MARKS = 20


class FullVolume:
    """``store`` whose ``mark_produced`` fails as the store's does on a full volume."""

    def __init__(self, store: SqliteLogStore, path: Path) -> None:
        """Insert into ``store``, whose database is ``path``; fail every mark."""
        self.store = store
        self.marks = 0
        self.marked = asyncio.Event()
        cause = sqlite3.OperationalError("database or disk is full")
        cause.sqlite_errorcode = sqlite3.SQLITE_FULL
        self.error = full_volume(path, cause)
        assert self.error is not None

    async def insert(self, row: NewRow) -> bool:
        """The store's insert."""
        return await self.store.insert(row)

    async def mark_produced(self, ids: Sequence[str]) -> None:  # noqa: ARG002 - the protocol's
        """Fail as the store does when its volume is full."""
        self.marks += 1
        self.marked.set()
        raise LogStoreError(str(self.error))

    async def record_failure(self, ids: Sequence[str], error: str) -> None:
        """The store's own."""
        await self.store.record_failure(ids, error)


async def _dispatch_one_at_a_time(
    log: FullVolume, streams: Transport, rows: list[NewRow], caplog: pytest.LogCaptureFixture
) -> tuple[Dispatcher, list[logging.LogRecord]]:
    """Dispatch ``rows`` one at a time through ``log``; the dispatcher's lines, backed off.

    The handlers' :class:`RepeatFilter` sits on pytest's one capture handler for the session
    while the rows go, and is removed after.
    """
    producer = streams.producer()
    dispatcher = Dispatcher(producer, log, linger_s=0, mark_interval_s=0)
    repeats = RepeatFilter(clock=lambda: 0.0)  # as configure_logging installs; no time passes
    caplog.handler.addFilter(repeats)
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.ingress.dispatch"):
            for row in rows:  # one row, one produce, one failed write at a time
                log.marked.clear()
                await log.insert(row)
                assert dispatcher.submit(row)
                await log.marked.wait()
            await dispatcher.close()
    finally:
        caplog.handler.removeFilter(repeats)
        await producer.close()
    return dispatcher, [r for r in caplog.records if r.name == "pipeline.ingress.dispatch"]


async def test_failed_marks_log_one_line_without_a_traceback(
    tmp_path: Path,
    sqlite_store: SqliteLogStore,
    streams: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """20 failed marks in a row: one line (the rest backed off), the log's reason, no traceback."""
    topic = f"messages-{unique}"
    await make_topic(streams, topic, 1)
    log = FullVolume(sqlite_store, tmp_path / "ingress.db")
    rows = [new_row(n, clock, topic=topic) for n in range(FAILED_MARKS)]
    dispatcher, lines = await _dispatch_one_at_a_time(log, streams, rows, caplog)
    assert (log.marks, dispatcher.counters.produced) == (FAILED_MARKS, FAILED_MARKS)
    for row in rows:  # out on the broker, not marked: the sweeper produces them again
        got = await sqlite_store.get(row.id)
        assert got is not None
        assert got.state is RowState.RECEIVED
    assert len(lines) == 1, [r.getMessage() for r in lines]
    line = lines[0]
    assert (line.exc_info, line.exc_text) == (None, None)
    message = line.getMessage()
    assert "could not mark 1 rows produced" in message
    assert str(log.error) in message  # what failed and where: the volume to free
    assert "sweeper will produce them again" in message


class FullVolumeForFailures(FullVolume):
    """A full volume that also fails to record a produce failure, as a full volume does."""

    async def record_failure(self, ids: Sequence[str], error: str) -> None:  # noqa: ARG002
        """Fail as the store does when its volume is full."""
        self.marks += 1
        self.marked.set()
        raise LogStoreError(str(self.error))


async def test_failed_records_of_produce_failures_log_one_line_without_a_traceback(
    tmp_path: Path,
    sqlite_store: SqliteLogStore,
    streams: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Produces that fail (no such topic) on a full volume: a line each, once, no traceback."""
    log = FullVolumeForFailures(sqlite_store, tmp_path / "ingress.db")
    rows = [new_row(n, clock, topic=f"absent-{unique}") for n in range(FAILED_MARKS)]
    dispatcher, lines = await _dispatch_one_at_a_time(log, streams, rows, caplog)
    assert (log.marks, dispatcher.counters.produced) == (FAILED_MARKS, 0)
    failed, unrecorded = lines  # the produce's line and the record's, each once
    said = failed.getMessage()
    assert said.startswith(f"produce of 1 rows to absent-{unique} failed (UnknownTopic: ")
    assert said.endswith("; the sweeper will retry")
    assert all((line.exc_info, line.exc_text) == (None, None) for line in lines)
    message = unrecorded.getMessage()
    assert "could not record a produce failure of 1 rows" in message
    assert str(log.error) in message
