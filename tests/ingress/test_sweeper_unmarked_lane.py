"""The sweeper says so, once per lane, when no row of a lane it replays was ever marked processed.

Members mark rows only with ``PIPELINE_RUNTIME__MARK_PROCESSED=true`` (off by default, the
sweeper on by default): without it every webhook is handled, replayed ``max_replays`` times and
abandoned, and each abandonment alone said "abandoned after 3 replays without being processed".

The log answers from an index of the processed rows' lanes, which a store opening a log made
before it builds only when the log is small: a larger one cannot tell until the operator builds
it, and the sweeper then neither warns nor adds the hint.
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing

import psycopg
import pytest
from contract.helpers import make_topic
from logstore.helpers import FakeClock, new_row

from pipeline.config import SweeperSettings
from pipeline.ingress.backlog import GroupLagBacklog
from pipeline.ingress.sweeper import Sweeper
from pipeline.logstore import LogStore, RowState
from pipeline.logstore.postgres import PostgresLogStore
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport.protocol import Transport

HINT = "PIPELINE_RUNTIME__MARK_PROCESSED=true"


async def sweeper_for(
    store: LogStore, streams: Transport, clock: FakeClock, unique: str, lanes: list[str]
) -> Sweeper:
    """A sweeper of ``lanes`` (one fresh topic each, group ``<lane>-workers``) on ``store``."""
    topics = {lane: [f"{lane}-{unique}"] for lane in lanes}
    for (topic,) in topics.values():
        await make_topic(streams, topic, 1)
    groups = {lane: f"{lane}-workers" for lane in lanes}
    settings = SweeperSettings(
        patience_s=300, max_patience_s=900, max_replays=2, lease_s=30, lane_groups=groups
    )
    backlog = GroupLagBacklog(streams.admin(), topics, groups)
    return Sweeper(store, streams.producer(), backlog, topics, settings, clock=clock)


async def produced(
    store: LogStore, clock: FakeClock, unique: str, lane: str, numbers: range
) -> list[str]:
    """Rows of ``lane`` (its topic of :func:`sweeper_for`), inserted and produced; their ids."""
    topic = f"{lane}-{unique}"
    rows = [new_row(n, clock, topic=topic, lane=lane, event_id=f"{lane}-{n}") for n in numbers]
    for row in rows:
        await store.insert(row)
    await store.mark_produced([row.id for row in rows])
    return [row.id for row in rows]


def hints(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The sweeper's warnings that name the marking setting."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and HINT in r.getMessage()
    ]


def abandonments(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The sweeper's CRITICAL lines."""
    return [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]


async def test_a_lane_never_marked_is_named_once_and_its_abandonments_say_why(
    store: LogStore,
    streams: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two lanes never marked: one warning each, not one per row or sweep; hints on CRITICAL."""
    sweeper = await sweeper_for(store, streams, clock, unique, ["messages", "engagement"])
    messages = await produced(store, clock, unique, "messages", range(5))
    await produced(store, clock, unique, "engagement", range(10, 13))
    counts = []
    with caplog.at_level(logging.INFO, logger="pipeline.ingress.sweeper"):
        for _ in range(4):
            clock.advance(1_000)  # past the maximum patience: replayed backed up or not
            report = await sweeper.sweep_once()
            counts.append((report.replayed, report.abandoned))
    assert counts == [(8, 0), (8, 0), (0, 8), (0, 0)]
    warned = hints(caplog)
    assert len(warned) == 2, warned
    by_lane = {line.split()[4]: line for line in warned}
    assert set(by_lane) == {"messages", "engagement"}
    assert by_lane["messages"] == (
        "no row of lane messages (consumer group messages-workers) was ever marked processed "
        "in the log: its members run without PIPELINE_RUNTIME__MARK_PROCESSED=true (or none "
        "consumes it), so every webhook of it is replayed after 300 s and abandoned after 2 "
        "replays"
    )
    critical = abandonments(caplog)
    assert len(critical) == 8
    assert all(HINT in line for line in critical), critical
    assert sum("no row of lane engagement " in line for line in critical) == 3
    row = await store.get(messages[0])
    assert row is not None
    assert row.state is RowState.ABANDONED
    assert row.last_error.startswith("abandoned after 2 replays without being processed; ")
    assert HINT in row.last_error


async def test_a_lane_whose_rows_are_marked_gets_no_warning_for_the_one_that_went_missing(
    store: LogStore,
    streams: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Marked rows in the lane, one never processed: replayed and abandoned as before, no hint."""
    sweeper = await sweeper_for(store, streams, clock, unique, ["messages"])
    ids = await produced(store, clock, unique, "messages", range(4))
    assert await store.mark_processed(ids[1:]) == 3
    with caplog.at_level(logging.INFO, logger="pipeline.ingress.sweeper"):
        for _ in range(3):
            clock.advance(1_000)
            await sweeper.sweep_once()
    assert hints(caplog) == []
    assert abandonments(caplog) == [
        "webhook abandoned: abandoned after 2 replays without being processed"
    ]


async def test_once_a_row_of_the_lane_is_marked_its_abandonments_lose_the_hint(
    store: LogStore,
    streams: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The members fixed after the warning: no second warning, and later abandonments are plain."""
    sweeper = await sweeper_for(store, streams, clock, unique, ["messages"])
    before = await produced(store, clock, unique, "messages", range(2))
    with caplog.at_level(logging.INFO, logger="pipeline.ingress.sweeper"):
        clock.advance(1_000)
        assert (await sweeper.sweep_once()).replayed == 2
        assert len(hints(caplog)) == 1
        fixed = await produced(store, clock, unique, "messages", range(20, 22))
        assert await store.mark_processed(fixed[:1]) == 1  # a member marks now
        for _ in range(3):
            clock.advance(1_000)
            await sweeper.sweep_once()
    assert len(hints(caplog)) == 1
    critical = abandonments(caplog)
    assert len(critical) == 3  # the two rows from before and the fixed lane's lost one
    assert all(HINT not in line for line in critical), critical
    for row_id in (*before, fixed[1]):
        row = await store.get(row_id)
        assert row is not None
        assert row.state is RowState.ABANDONED


async def test_a_log_too_large_to_index_at_open_cannot_tell_and_the_sweeper_does_not_warn(
    store: LogStore,
    streams: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A log made before the index and above the bound: unknown, so no warning and no hint.

    The rows of a lane never marked are replayed and abandoned as before the warning existed;
    only the store's own warning at open (the command that builds the index) is logged.
    """
    await produced(store, clock, unique, "messages", range(5))
    await drop_processed_index(store)
    upgraded = reopened(store, bound=3, clock=clock)
    with caplog.at_level(logging.INFO):
        await upgraded.open()
        try:
            assert await upgraded.has_processed("messages") is None
            sweeper = await sweeper_for(upgraded, streams, clock, unique, ["messages"])
            counts = []
            for _ in range(4):
                clock.advance(1_000)
                report = await sweeper.sweep_once()
                counts.append((report.replayed, report.abandoned))
        finally:
            await upgraded.close()
    assert counts == [(5, 0), (5, 0), (0, 5), (0, 0)]
    assert hints(caplog) == []
    opened = [r.getMessage() for r in caplog.records if r.name.startswith("pipeline.logstore")]
    assert len(opened) == 1
    assert "CREATE INDEX" in opened[0]
    assert (
        abandonments(caplog)
        == ["webhook abandoned: abandoned after 2 replays without being processed"] * 5
    )


async def test_a_small_log_made_before_the_index_gets_it_at_open_and_the_warning(
    store: LogStore,
    streams: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Within the bound the index is built at open, and the lane never marked is named."""
    await produced(store, clock, unique, "messages", range(5))
    await drop_processed_index(store)
    upgraded = reopened(store, bound=1_000, clock=clock)
    with caplog.at_level(logging.INFO):
        await upgraded.open()
        try:
            sweeper = await sweeper_for(upgraded, streams, clock, unique, ["messages"])
            clock.advance(1_000)
            assert (await sweeper.sweep_once()).replayed == 5
        finally:
            await upgraded.close()
    assert [r for r in caplog.records if r.name.startswith("pipeline.logstore")] == []
    assert len(hints(caplog)) == 1


async def drop_processed_index(store: LogStore) -> None:
    """Take ``store``'s log back to before ``ingress_log_processed`` (a log made before it)."""
    if isinstance(store, SqliteLogStore):
        with closing(sqlite3.connect(store._path, isolation_level=None)) as conn:
            conn.execute("DROP INDEX ingress_log_processed")
        return
    assert isinstance(store, PostgresLogStore)
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as conn:
        await conn.execute(
            psycopg.sql.SQL("DROP INDEX {}").format(
                psycopg.sql.Identifier(store._schema, "ingress_log_processed")
            )
        )


def reopened(store: LogStore, *, bound: int, clock: FakeClock) -> LogStore:
    """Another store on ``store``'s log, its index built at open only up to ``bound`` rows."""
    if isinstance(store, SqliteLogStore):
        return SqliteLogStore(store._path, clock=clock, processed_index_max_rows=bound)
    assert isinstance(store, PostgresLogStore)
    return PostgresLogStore(
        store._url, schema=store._schema, clock=clock, processed_index_max_rows=bound
    )
