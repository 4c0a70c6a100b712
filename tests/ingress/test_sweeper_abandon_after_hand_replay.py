"""A replay by hand that lands between the sweeper's claim of a spent row and its abandon.

The sweeper claims a row that had its ``max_replays`` and decides from the row as claimed to
abandon it. An operator's ``pipeline replay`` of it, acknowledged before the abandon is written,
sets its ``replay_count`` back to 0: the row is no longer spent, and the abandon must leave it
(no abandonment, no CRITICAL page, nothing counted). The sweeper gives it its whole budget again.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from ingress.test_replay_fresh_budget import (
    SETTINGS,
    THREE_REPLAYS_THEN_ABANDONED,
    produced_row,
    sweeper_for,
    sweeps_until_abandoned,
)
from logstore.helpers import FakeClock

from pipeline.ingress.replay import replay
from pipeline.logstore import LogStore, RowState, Selection
from pipeline.transport.protocol import Transport


class HandReplayAfterClaim:
    """``store``, but its first claim of unprocessed rows is followed by a replay by hand of them.

    The replay is the real one (``pipeline replay``'s), on the real broker, run after the claim
    has leased the rows and before the sweeper acts on them.
    """

    def __init__(self, store: LogStore, transport: Transport) -> None:
        """Wrap ``store``; replay by hand through ``transport``."""
        self._store = store
        self._transport = transport
        self.replayed: list[str] = []

    def __getattr__(self, name: str) -> Any:
        """The store's own, for everything else."""
        return getattr(self._store, name)

    async def claim_unprocessed(self, *args: Any, **kwargs: Any) -> Any:
        """The store's claim; the first rows it returns are then replayed by hand."""
        rows = await self._store.claim_unprocessed(*args, **kwargs)
        if rows and not self.replayed:
            self.replayed = [row.id for row in rows]
            producer = self._transport.producer()
            try:
                summary = await replay(self._store, producer, Selection(ids=tuple(self.replayed)))
            finally:
                await producer.close()
            assert summary.replayed == len(rows)
        return rows


async def test_a_row_replayed_by_hand_after_the_claim_is_not_abandoned(
    store: LogStore,
    kafka: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spent when claimed, replayed by hand before the abandon: produced, count 0, no page."""
    row = await produced_row(store, kafka, clock, unique)
    for _ in range(SETTINGS.max_replays):
        await store.mark_replayed([row.id])
    wrapped = HandReplayAfterClaim(store, kafka)
    sweeper = sweeper_for(wrapped, kafka, row.topic, unique, clock)
    clock.advance(SETTINGS.max_patience_s + 1)
    with caplog.at_level(logging.CRITICAL, logger="pipeline.ingress.sweeper"):
        report = await sweeper.sweep_once()
    assert wrapped.replayed == [row.id]  # the race happened: claimed, then replayed by hand
    got = await store.get(row.id)
    assert got is not None
    assert (got.state, got.replay_count, got.last_error) == (RowState.PRODUCED, 0, "")
    assert (report.abandoned, report.replayed) == (0, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
    # the replay by hand was a fresh start: the whole budget, then one abandonment
    assert await sweeps_until_abandoned(sweeper, clock) == THREE_REPLAYS_THEN_ABANDONED
    got = await store.get(row.id)
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.ABANDONED, SETTINGS.max_replays)
