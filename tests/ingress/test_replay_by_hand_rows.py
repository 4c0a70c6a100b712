"""What a replay by hand leaves in each row, on both real stores and real brokers.

A row the broker took is produced again with a fresh sweeper budget (``replay_count`` 0, its
patience from now), a processed row stays processed, and a row whose produce failed keeps its
state and count and has the attempt and its error recorded, as the sweeper's failures are.
"""

from __future__ import annotations

import pytest
from contract.helpers import make_topic
from logstore.helpers import FakeClock, new_row

from pipeline.ingress.replay import replay
from pipeline.logstore import LogRow, LogStore, RowState, Selection
from pipeline.transport.protocol import Transport


async def _got(store: LogStore, row_id: str) -> LogRow:
    got = await store.get(row_id)
    assert got is not None
    return got


async def test_a_row_whose_produce_fails_keeps_its_state_and_records_the_attempt(
    store: LogStore, streams: Transport, clock: FakeClock, unique: str
) -> None:
    """Rows to a topic that is gone: state and count unchanged, the attempt and error kept.

    Before, a failed replay by hand left no trace in the row: its ``produce_attempts``
    (replays counted, failed or not) and ``last_error`` said nothing of it.
    """
    kept, gone = f"kept-{unique}", f"gone-{unique}"
    await make_topic(streams, kept, 1)
    received = new_row(1, clock, topic=gone)
    abandoned = new_row(2, clock, topic=gone)
    fine = new_row(3, clock, topic=kept)
    for row in (received, abandoned, fine):
        await store.insert(row)
    await store.mark_produced([abandoned.id])
    await store.mark_replayed([abandoned.id])
    await store.abandon([abandoned.id], "abandoned after 1 replays without being processed")
    clock.advance(60)
    producer = streams.producer()
    try:
        summary = await replay(store, producer, Selection())
    finally:
        await producer.close()
    assert (summary.replayed, dict(summary.failed)) == (1, {"UnknownTopic": 2})
    got = await _got(store, received.id)
    assert (got.state, got.replay_count, got.produce_attempts) == (RowState.RECEIVED, 0, 1)
    assert got.last_error.startswith("UnknownTopic: ")
    got = await _got(store, abandoned.id)
    assert (got.state, got.replay_count, got.produce_attempts) == (RowState.ABANDONED, 1, 3)
    assert got.last_error.startswith("UnknownTopic: ")
    got = await _got(store, fine.id)
    assert (got.state, got.replay_count, got.produce_attempts) == (RowState.PRODUCED, 0, 1)
    assert (got.last_error, got.produced_at_ms) == ("", clock.now_ms)


@pytest.mark.parametrize("state", [RowState.RECEIVED, RowState.PRODUCED, RowState.ABANDONED])
async def test_a_replay_by_hand_gives_an_unprocessed_row_a_fresh_start(
    store: LogStore, clock: FakeClock, state: RowState
) -> None:
    """Received, produced (claimed by a sweeper) or abandoned: produced, count 0, unleased."""
    row = new_row(1, clock)
    await store.insert(row)
    if state is not RowState.RECEIVED:
        await store.mark_produced([row.id])
        await store.mark_replayed([row.id])
        await store.mark_replayed([row.id])
        clock.advance(600)
        assert [r.id for r in await store.claim_unprocessed(clock.now_ms, 10, 60_000)] == [row.id]
    if state is RowState.ABANDONED:
        await store.abandon([row.id], "abandoned after 2 replays without being processed")
    attempts = (await _got(store, row.id)).produce_attempts
    clock.advance(5)
    await store.mark_replayed_by_hand([row.id])
    got = await _got(store, row.id)
    assert (got.state, got.replay_count, got.produce_attempts, got.produced_at_ms) == (
        RowState.PRODUCED,
        0,
        attempts + 1,
        clock.now_ms,
    )
    # no lease held: a sweeper claims it once its patience, from the replay, has passed
    assert await store.claim_unprocessed(clock.now_ms, 10, 60_000) == []
    clock.advance(1)
    assert [r.id for r in await store.claim_unprocessed(clock.now_ms, 10, 60_000)] == [row.id]


async def test_a_processed_row_replayed_by_hand_stays_processed(
    store: LogStore, clock: FakeClock
) -> None:
    """A processed row (``--include-processed``) stays processed and is never claimed."""
    row = new_row(1, clock)
    await store.insert(row)
    await store.mark_produced([row.id])
    assert await store.mark_processed([row.id]) == 1
    await store.mark_replayed_by_hand([row.id])
    got = await _got(store, row.id)
    assert (got.state, got.replay_count, got.produce_attempts) == (RowState.PROCESSED, 0, 2)
    clock.advance(3600)
    assert await store.claim_unprocessed(clock.now_ms, 10, 60_000) == []
