"""A replay by hand is a fresh start for the sweeper: its patience and its replay budget.

An operator who replays a window, fixes the handler and replays it again has not spent the
sweeper's ``max_replays``: the sweeper still replays an unprocessed row that many times before
it abandons it (a page), and the copies sent by hand still say they are replays.
"""

from __future__ import annotations

from contract.helpers import consume_until, make_topic
from logstore.helpers import FakeClock, new_row
from support import delete_group_after

from pipeline.config import SweeperSettings
from pipeline.ingress import headers as h
from pipeline.ingress.backlog import GroupLagBacklog
from pipeline.ingress.replay import replay
from pipeline.ingress.sweeper import Sweeper
from pipeline.logstore import LogStore, NewRow, RowState, Selection
from pipeline.transport.protocol import Transport

SETTINGS = SweeperSettings(patience_s=300, max_patience_s=900, max_replays=3, lease_s=30)
THREE_REPLAYS_THEN_ABANDONED = [(1, 0), (1, 0), (1, 0), (0, 1)]
"""(replayed, abandoned) of the sweeps from a row's last production until it is abandoned."""


def sweeper_for(
    store: LogStore, kafka: Transport, topic: str, unique: str, clock: FakeClock
) -> Sweeper:
    """A sweeper of one lane, ``messages``, on ``topic`` (reading the lag leaves its group)."""
    lanes = {"messages": [topic]}
    delete_group_after(kafka, f"g-{unique}", [topic])
    backlog = GroupLagBacklog(kafka.admin(), lanes, {"messages": f"g-{unique}"})
    return Sweeper(store, kafka.producer(), backlog, lanes, SETTINGS, clock=clock)


async def sweeps_until_abandoned(sweeper: Sweeper, clock: FakeClock) -> list[tuple[int, int]]:
    """(replayed, abandoned) of each sweep, past the longest patience, until one abandons."""
    counts: list[tuple[int, int]] = []
    while not counts or counts[-1][1] == 0:
        assert len(counts) <= SETTINGS.max_replays, counts
        clock.advance(SETTINGS.max_patience_s + 1)
        report = await sweeper.sweep_once()
        counts.append((report.replayed, report.abandoned))
    return counts


async def produced_row(store: LogStore, kafka: Transport, clock: FakeClock, unique: str) -> NewRow:
    """A row of lane ``messages`` on a topic of its own, ``messages-{unique}``, produced now."""
    row = new_row(1, clock, topic=f"messages-{unique}", lane="messages")
    await make_topic(kafka, row.topic, 1)
    await store.insert(row)
    await store.mark_produced([row.id])
    return row


async def replay_counts(kafka: Transport, topic: str, unique: str, count: int) -> list[bytes]:
    """The ``pl-replay-count`` of the first ``count`` messages on ``topic``, in order."""
    consumer = kafka.consumer(f"check-{unique}", [topic])
    try:
        got = await consume_until(consumer, lambda r: len(r) >= count)
    finally:
        await consumer.close()
        await kafka.admin().delete_group(f"check-{unique}", [topic])
    return [m.headers[h.REPLAY_COUNT] for m in got]


async def test_two_replays_by_hand_leave_the_sweeper_its_whole_budget(
    store: LogStore, kafka: Transport, clock: FakeClock, unique: str
) -> None:
    """Replayed twice by hand, an unprocessed row is still replayed 3 times before abandoned."""
    row = await produced_row(store, kafka, clock, unique)
    producer = kafka.producer()
    for _ in range(2):  # the first try, then the rerun once the handler is fixed
        clock.advance(60)
        assert (await replay(store, producer, Selection(ids=(row.id,)))).replayed == 1
    await producer.close()
    got = await store.get(row.id)
    assert got is not None
    assert (got.state, got.produced_at_ms) == (RowState.PRODUCED, clock.now_ms)
    sweeper = sweeper_for(store, kafka, row.topic, unique, clock)
    clock.advance(SETTINGS.patience_s - 1)  # the patience counts from the last replay by hand
    assert (await sweeper.sweep_once()).replayed == 0
    assert await sweeps_until_abandoned(sweeper, clock) == THREE_REPLAYS_THEN_ABANDONED
    # the copies sent by hand say they are replays; the sweeper's count its own from 1
    assert await replay_counts(kafka, row.topic, unique, 5) == [b"1", b"1", b"1", b"2", b"3"]


async def test_an_abandoned_row_replayed_by_hand_is_replayed_again_before_a_page(
    store: LogStore, kafka: Transport, clock: FakeClock, unique: str
) -> None:
    """A row abandoned after 3 replays, replayed by hand, gets 3 more before it is abandoned."""
    row = await produced_row(store, kafka, clock, unique)
    sweeper = sweeper_for(store, kafka, row.topic, unique, clock)
    assert await sweeps_until_abandoned(sweeper, clock) == THREE_REPLAYS_THEN_ABANDONED
    producer = kafka.producer()
    summary = await replay(store, producer, Selection(states=(RowState.ABANDONED,)))
    await producer.close()
    assert summary.replayed == 1
    got = await store.get(row.id)
    assert got is not None
    assert got.state == RowState.PRODUCED
    assert await sweeps_until_abandoned(sweeper, clock) == THREE_REPLAYS_THEN_ABANDONED
    # the copy sent by hand says how many replays the row had had, plus itself
    assert await replay_counts(kafka, row.topic, unique, 7) == [
        b"1",
        b"2",
        b"3",
        b"4",
        b"1",
        b"2",
        b"3",
    ]
