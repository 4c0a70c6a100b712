"""The log store contract: one body of tests every LogStore passes on its real database.

Subclassed per store in ``test_sqlite.py`` and ``test_postgres.py``; PostgreSQL isolates each
test in a uuid-named schema, dropped afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest
from logstore.helpers import FakeClock, new_row, real_log_store

from pipeline.config import Settings
from pipeline.logstore import LogStore, RowState, Selection


class LogStoreContract:
    """The LogStore protocol's contract; a subclass per database names it in ``kind``."""

    kind: ClassVar[str]

    @pytest.fixture
    def clock(self) -> FakeClock:
        """A clock the test moves by hand."""
        return FakeClock()

    @pytest.fixture
    async def store(
        self, request: pytest.FixtureRequest, tmp_path: Path, settings: Settings, clock: FakeClock
    ) -> AsyncIterator[LogStore]:
        """The subclass's store, empty; PostgreSQL in a schema of its own."""
        if self.kind == "postgres":
            request.getfixturevalue("postgres_service")
        async with real_log_store(self.kind, tmp_path, settings.postgres.url, clock) as store:
            yield store

    async def test_insert_stores_every_field(self, store: LogStore, clock: FakeClock) -> None:
        """An inserted row reads back byte for byte, in state received with zeroed counters."""
        row = new_row(1, clock, body=b"\x00\xff raw bytes", headers={"webhook-id": "msg_1"})
        assert await store.insert(row) is True
        got = await store.get(row.id)
        assert got is not None
        assert (got.id, got.source, got.tenant, got.key, got.topic, got.lane, got.event_id) == (
            row.id,
            row.source,
            row.tenant,
            row.key,
            row.topic,
            row.lane,
            row.event_id,
        )
        assert got.received_at_ms == row.received_at_ms
        assert got.body == b"\x00\xff raw bytes"
        assert dict(got.headers) == {"webhook-id": "msg_1"}
        assert got.state is RowState.RECEIVED
        assert (got.produce_attempts, got.replay_count, got.last_error, got.produced_at_ms) == (
            0,
            0,
            "",
            None,
        )

    async def test_redelivery_of_an_event_inserts_nothing(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """A second row with the same (source, event id) is refused, and the first is kept."""
        assert await store.insert(new_row(1, clock, event_id="same")) is True
        assert await store.insert(new_row(2, clock, event_id="same")) is False
        assert await store.insert(new_row(3, clock, event_id="same", source="other")) is True
        assert await store.get(new_row(2, clock).id) is None

    async def test_concurrent_inserts_are_group_committed(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """Many concurrent inserts all land, duplicates among them deduplicated to one row each."""
        rows = [new_row(n, clock, event_id=f"ev-{n % 150}") for n in range(300)]
        results = await asyncio.gather(*(store.insert(row) for row in rows))
        assert sum(results) == 150
        counts = await store.count_by_state(Selection())
        assert counts == {RowState.RECEIVED: 150}

    async def test_each_group_commit_is_told_with_its_rows_and_time(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """The commit observer hears of every group commit: the rows it carried and its time."""
        seen: list[tuple[int, float]] = []
        store.observe_commits(lambda rows, seconds: seen.append((rows, seconds)))
        rows = [new_row(n, clock) for n in range(120)]
        assert all(await asyncio.gather(*(store.insert(row) for row in rows)))
        assert sum(count for count, _ in seen) == len(rows)
        assert len(seen) < len(rows)  # concurrent inserts shared commits
        assert all(seconds > 0 for _, seconds in seen)
        assert await store.insert(new_row(500, clock)) is True  # alone: a commit of one row
        assert seen[-1][0] == 1

    async def test_marking_moves_rows_forward_only(self, store: LogStore, clock: FakeClock) -> None:
        """Produced then processed; a late produce acknowledgement does not undo processed."""
        a, b = new_row(1, clock), new_row(2, clock)
        await store.insert(a)
        await store.insert(b)
        await store.mark_produced([a.id])
        got = await store.get(a.id)
        assert got is not None
        assert got.state is RowState.PRODUCED
        assert got.produce_attempts == 1
        assert got.produced_at_ms == clock.now_ms
        assert await store.mark_processed([a.id, b.id, "no-such-id"]) == 2
        await store.mark_produced([a.id, b.id])
        for row in (a, b):
            got = await store.get(row.id)
            assert got is not None
            assert got.state is RowState.PROCESSED
        assert await store.mark_processed([a.id]) == 0

    async def test_failures_are_counted_with_the_last_error(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """A failed produce counts an attempt, keeps the error and leaves the row received."""
        row = new_row(1, clock)
        await store.insert(row)
        await store.record_failure([row.id], "broker down")
        await store.record_failure([row.id], "still down")
        got = await store.get(row.id)
        assert got is not None
        assert (got.state, got.produce_attempts, got.last_error) == (
            RowState.RECEIVED,
            2,
            "still down",
        )

    async def test_claims_of_unproduced_rows_are_leased(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """Rows older than the cut-off are claimed once per lease, oldest first, up to the limit."""
        old = []
        for n in range(3):
            old.append(new_row(n, clock))
            await store.insert(old[-1])
            clock.advance(1)
        fresh = new_row(9, clock)
        await store.insert(fresh)
        cutoff_ms = clock.now_ms
        first = await store.claim_unproduced(cutoff_ms, limit=2, lease_ms=10_000)
        assert [r.id for r in first] == [old[0].id, old[1].id]
        second = await store.claim_unproduced(cutoff_ms, limit=10, lease_ms=10_000)
        assert [r.id for r in second] == [old[2].id]
        assert await store.claim_unproduced(cutoff_ms, limit=10, lease_ms=10_000) == []
        clock.advance(11)
        again = await store.claim_unproduced(cutoff_ms, limit=10, lease_ms=10_000)
        assert [r.id for r in again] == [r.id for r in old]

    async def test_claims_of_unprocessed_rows_respect_patience(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """A patient topic's rows are claimed only once overdue, other topics' past patience."""
        calm = new_row(1, clock, topic="engagement")
        busy = new_row(2, clock, topic="messages")
        for row in (calm, busy):
            await store.insert(row)
        await store.mark_produced([calm.id, busy.id])
        produced_ms = clock.now_ms
        clock.advance(60)
        claimed = await store.claim_unprocessed(
            clock.now_ms,
            limit=10,
            lease_ms=1_000,
            patient_topics={"messages"},
            overdue_before_ms=produced_ms,
        )
        assert [r.id for r in claimed] == [calm.id]
        claimed = await store.claim_unprocessed(
            clock.now_ms,
            limit=10,
            lease_ms=1_000,
            patient_topics={"messages"},
            overdue_before_ms=produced_ms + 1,
        )
        assert [r.id for r in claimed] == [busy.id]

    async def test_replays_are_counted_and_abandon_is_terminal(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """A replay counts, refreshes the produce time; abandon keeps the reason and stays put."""
        row = new_row(1, clock)
        await store.insert(row)
        await store.mark_produced([row.id])
        clock.advance(5)
        await store.mark_replayed([row.id])
        got = await store.get(row.id)
        assert got is not None
        assert (got.replay_count, got.produce_attempts, got.produced_at_ms) == (1, 2, clock.now_ms)
        await store.abandon([row.id], "abandoned after 1 replays without being processed")
        assert await store.mark_processed([row.id]) == 0
        await store.mark_produced([row.id])
        got = await store.get(row.id)
        assert got is not None
        assert got.state is RowState.ABANDONED
        assert got.last_error == "abandoned after 1 replays without being processed"
        clock.advance(60)
        assert await store.claim_unprocessed(clock.now_ms, limit=10, lease_ms=1) == []

    async def test_abandon_with_min_replays_takes_only_rows_still_spent(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """With ``min_replays``, a row whose count is below it (replayed by hand) is left as is.

        The count of rows abandoned is returned; without the condition any row not finished goes.
        """
        spent, fresh, low, unproduced = (new_row(n, clock) for n in range(4))
        for row in (spent, fresh, low, unproduced):
            await store.insert(row)
        await store.mark_produced([spent.id, fresh.id, low.id])
        for _ in range(3):
            await store.mark_replayed([spent.id, fresh.id])
        await store.mark_replayed([low.id])
        await store.mark_replayed_by_hand([fresh.id])  # a fresh start: its count is 0 again
        ids = [spent.id, fresh.id, low.id, unproduced.id, "no-such-row"]
        assert await store.abandon(ids, "spent", min_replays=3) == 1
        got = {row.id: await store.get(row.id) for row in (spent, fresh, low, unproduced)}
        assert {row_id: (r.state, r.replay_count) for row_id, r in got.items() if r} == {
            spent.id: (RowState.ABANDONED, 3),
            fresh.id: (RowState.PRODUCED, 0),
            low.id: (RowState.PRODUCED, 1),
            unproduced.id: (RowState.RECEIVED, 0),
        }
        assert [r.last_error for r in got.values() if r] == ["spent", "", "", ""]
        assert await store.abandon(ids, "spent", min_replays=3) == 0  # abandoned already
        assert await store.abandon(ids, "poison") == 3
        assert await store.count_by_state(Selection()) == {RowState.ABANDONED: 4}

    async def test_selection_filters_and_pages(self, store: LogStore, clock: FakeClock) -> None:
        """Select filters by source, tenant, time, state and id, and pages in id order."""
        rows = []
        for n in range(12):
            row = new_row(n, clock, source="a" if n % 2 else "b", tenant=f"t{n % 3}")
            rows.append(row)
            await store.insert(row)
            clock.advance(1)
        await store.mark_produced([rows[1].id, rows[3].id])
        by_source = await store.select(Selection(source="a"), limit=100)
        assert [r.id for r in by_source] == [r.id for r in rows if r.source == "a"]
        both = await store.select(Selection(source="a", tenant="t0"), limit=100)
        assert [r.id for r in both] == [rows[3].id, rows[9].id]
        window = Selection(since_ms=rows[2].received_at_ms, until_ms=rows[5].received_at_ms)
        assert [r.id for r in await store.select(window, limit=100)] == [r.id for r in rows[2:5]]
        produced = await store.select(Selection(states=(RowState.PRODUCED,)), limit=100)
        assert [r.id for r in produced] == [rows[1].id, rows[3].id]
        picked = await store.select(Selection(ids=(rows[7].id, rows[0].id)), limit=100)
        assert [r.id for r in picked] == [rows[0].id, rows[7].id]
        page1 = await store.select(Selection(), limit=5)
        page2 = await store.select(Selection(), after_id=page1[-1].id, limit=5)
        assert [r.id for r in page1 + page2] == [r.id for r in rows[:10]]
        assert await store.count_by_state(Selection(source="a")) == {
            RowState.PRODUCED: 2,
            RowState.RECEIVED: 4,
        }

    async def test_purge_deletes_only_old_finished_rows(
        self, store: LogStore, clock: FakeClock
    ) -> None:
        """Purge removes old processed and abandoned rows and keeps everything still owed."""
        old_done, old_owed, old_abandoned = new_row(1, clock), new_row(2, clock), new_row(3, clock)
        for row in (old_done, old_owed, old_abandoned):
            await store.insert(row)
        await store.mark_processed([old_done.id])
        await store.abandon([old_abandoned.id], "poison")
        clock.advance(100)
        new_done = new_row(4, clock)
        await store.insert(new_done)
        await store.mark_processed([new_done.id])
        assert await store.purge(clock.now_ms) == 2
        assert await store.get(old_done.id) is None
        assert await store.get(old_abandoned.id) is None
        assert await store.get(old_owed.id) is not None
        assert await store.get(new_done.id) is not None

    async def test_marking_many_ids_in_one_batch(self, store: LogStore, clock: FakeClock) -> None:
        """One call marks more ids than fit one statement's parameter list."""
        rows = [new_row(n, clock) for n in range(1200)]
        await asyncio.gather(*(store.insert(row) for row in rows))
        await store.mark_produced([r.id for r in rows])
        assert await store.mark_processed([r.id for r in rows]) == 1200
        assert await store.count_by_state(Selection()) == {RowState.PROCESSED: 1200}
