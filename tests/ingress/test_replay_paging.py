"""Replay pages through the selection as it stood at the start, whatever changes meanwhile.

Each test changes the log between the first page (200 rows) and the second, from inside the
producer's first batch, so the change lands exactly between two reads; on both real stores.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import pytest
from logstore.helpers import FakeClock, new_row, real_log_store

from pipeline.config import Settings
from pipeline.envelope import Delivered, Record
from pipeline.ingress import headers as h
from pipeline.ingress.replay import replay
from pipeline.logstore import LogStore, NewRow, RowState, Selection

ROWS = 250  # more than one page of 200


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Settings
) -> AsyncIterator[LogStore]:
    """Each real log store; PostgreSQL in a schema of its own, dropped afterwards."""
    if request.param == "postgres":
        request.getfixturevalue("postgres_service")
    async with real_log_store(request.param, tmp_path, settings.postgres.url) as log_store:
        yield log_store


class BetweenPages:
    """A producer that records the event ids it is sent and runs ``between`` once.

    ``between`` runs inside the first batch, that is after the replay read its first page and
    before it reads the second.
    """

    def __init__(self, between: Callable[[], Awaitable[None]]) -> None:
        """Run ``between`` during the first batch."""
        self.sent: list[str] = []
        self._between: Callable[[], Awaitable[None]] | None = between

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Record one message."""
        (receipt,) = await self.send_many(topic, [Record(value, key, headers, partition)])
        return receipt

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Record the batch, then (the first time) change the log."""
        start = len(self.sent)
        self.sent += [(r.headers or {})[h.EVENT_ID].decode() for r in records]
        if self._between is not None:
            between, self._between = self._between, None
            await between()
        return [Delivered(topic, 0, start + n) for n in range(len(records))]

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Nothing is pending."""

    async def close(self) -> None:
        """Nothing to release."""


async def insert_all(store: LogStore, rows: Sequence[NewRow]) -> None:
    """Insert ``rows`` (group-committed together)."""
    assert all(await asyncio.gather(*(store.insert(row) for row in rows)))


async def test_a_row_joining_the_selection_midway_does_not_push_out_a_selected_one(
    store: LogStore,
) -> None:
    """Every row selected at the start is replayed, even when another joins the selection.

    Row 220 is abandoned (by the sweeper, say) while the replay of abandoned rows is between
    its pages: the replay must still reach the last abandoned row, 249.
    """
    clock = FakeClock()
    rows = [new_row(n, clock) for n in range(ROWS)]
    await insert_all(store, rows)
    await store.abandon([row.id for row in rows if row is not rows[220]], "poison")
    selected = {row.event_id for row in rows if row is not rows[220]}

    async def sweeper_abandons_220() -> None:
        await store.abandon([rows[220].id], "poison")

    producer = BetweenPages(sweeper_abandons_220)
    summary = await replay(store, producer, Selection(states=(RowState.ABANDONED,)))

    assert summary.total == ROWS - 1
    assert selected <= set(producer.sent), sorted(selected - set(producer.sent))
    # Row 220 was in the selection when its page was read, below the start's last row: taken.
    assert sorted(producer.sent) == sorted(selected | {"ev-220"})
    assert len(producer.sent) == len(set(producer.sent)) == summary.replayed


async def test_a_row_leaving_the_selection_midway_lets_no_later_arrival_in(
    store: LogStore,
) -> None:
    """Rows received after the replay started are not replayed, even when a selected one left.

    Row 230 is processed by a consumer and row 250 arrives while the replay of unprocessed rows
    is between its pages: 230 is skipped (no longer selected) and 250 is not taken instead.
    """
    clock = FakeClock()
    rows = [new_row(n, clock) for n in range(ROWS)]
    await insert_all(store, rows)
    unprocessed = Selection(states=(RowState.RECEIVED, RowState.PRODUCED, RowState.ABANDONED))

    async def consumer_and_ingress_meanwhile() -> None:
        assert await store.mark_processed([rows[230].id]) == 1
        clock.advance(1)
        await insert_all(store, [new_row(ROWS, clock)])

    producer = BetweenPages(consumer_and_ingress_meanwhile)
    summary = await replay(store, producer, unprocessed)

    assert summary.total == ROWS
    assert f"ev-{ROWS}" not in producer.sent
    assert sorted(producer.sent) == sorted(row.event_id for row in rows if row is not rows[230])
    assert summary.replayed == ROWS - 1
    late = await store.get(new_row(ROWS, clock).id)
    assert late is not None
    assert (late.state, late.replay_count) == (RowState.RECEIVED, 0)
