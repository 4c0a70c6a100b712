"""The debouncer against a webhook the ingress's sweeper replays while its first copy waits."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.admission.debounce import Debouncer, Turn
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.codec import event_digest
from pipeline.envelope import Message
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"


@pytest.fixture
async def redis(redis_service: str) -> AsyncIterator[Redis]:
    """A client of the shared test Redis."""
    client = Redis.from_url(redis_service)
    yield client
    await client.aclose()


@pytest.fixture
async def debouncer(redis: Redis, unique: str) -> AsyncIterator[Debouncer]:
    """A debouncer of a lane no other test uses, whose turns are due once two messages wait."""
    lane = f"debrp_{unique}"
    policy = DebouncePolicy(key="conversation_id", quiet_s=30.0, max_wait_s=60.0, max_batch=2)
    yield Debouncer(redis, PREFIX, lane, policy)
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, lane)}*"):
        await redis.delete(key)


def webhook(offset: int, event_id: str | None, text: str, replays: int = 0) -> Message:
    """An ingress event at ``offset`` carrying ``event_id`` (a replay has a new offset)."""
    headers = {h.REPLAY_COUNT: str(replays).encode()}
    if event_id is not None:
        headers[h.EVENT_ID] = event_id.encode()
    return Message("hooks", 0, offset, b"c1", text.encode(), headers, 1_000 + offset)


def texts(turn: Turn) -> list[str]:
    """The message values of a turn, in order."""
    return [m.value.decode() for m in turn.messages]


async def test_a_replayed_copy_of_a_buffered_webhook_is_not_buffered_again(debouncer):
    """A copy with the same event id at a new offset, recorded while the first waits, is dropped."""
    assert await debouncer.record("c1", webhook(5, "evt-1", "hi")) > 0
    assert await debouncer.record("c1", webhook(9, "evt-1", "hi", replays=1)) == -1
    assert await debouncer.record("c1", webhook(10, "evt-2", "open?")) > 0  # 2 waiting: due
    claim = await debouncer.claim(10)
    assert [texts(t) for t in claim.turns] == [["hi", "open?"]]
    assert (debouncer.stats.recorded, debouncer.stats.repeated) == (2, 1)


async def test_a_replayed_copy_of_a_webhook_in_a_running_turn_gets_no_turn_of_its_own(debouncer):
    """A copy recorded while the first copy's turn runs is not run again after that turn."""
    await debouncer.record("c1", webhook(5, "evt-1", "hi"))
    await debouncer.record("c1", webhook(6, "evt-2", "open?"))
    (turn,) = (await debouncer.claim(10)).turns
    assert await debouncer.record("c1", webhook(9, "evt-2", "open?", replays=1)) == -1
    assert await debouncer.finish(turn, ok=True) == "done"


async def test_a_replayed_copy_of_a_webhook_in_a_failed_turns_backoff_is_not_run_twice(debouncer):
    """A copy recorded while the first copy's failed turn waits to retry is not in the retry."""
    await debouncer.record("c1", webhook(5, "evt-1", "hi"))
    await debouncer.record("c1", webhook(6, "evt-2", "open?"))
    (turn,) = (await debouncer.claim(10)).turns
    assert await debouncer.finish(turn, ok=False, retry_in_ms=0) == "scheduled"
    assert await debouncer.record("c1", webhook(9, "evt-1", "hi", replays=1)) == -1
    (retry,) = (await debouncer.claim(10)).turns
    assert (texts(retry), retry.attempt) == (["hi", "open?"], 2)
    assert await debouncer.finish(retry, ok=True) == "done"


async def test_a_copy_of_a_webhook_whose_turn_ended_is_buffered_again(debouncer):
    """A copy recorded after the first copy's turn succeeded (a replay by hand, a redrive) runs."""
    await debouncer.record("c1", webhook(5, "evt-1", "hi"))
    await debouncer.record("c1", webhook(6, "evt-2", "open?"))
    (turn,) = (await debouncer.claim(10)).turns
    assert await debouncer.finish(turn, ok=True) == "done"
    assert await debouncer.record("c1", webhook(9, "evt-1", "hi", replays=1)) > 0
    assert await debouncer.record("c1", webhook(10, "evt-3", "sunday?")) > 0
    (again,) = (await debouncer.claim(10)).turns
    assert texts(again) == ["hi", "sunday?"]


async def test_messages_without_an_event_id_are_told_apart_by_their_offset(debouncer):
    """Two messages with no event id at different offsets are both buffered, one redelivered not."""
    await debouncer.record("c1", webhook(5, None, "a"))
    assert await debouncer.record("c1", webhook(5, None, "a")) == -1
    await debouncer.record("c1", webhook(6, None, "b"))
    (turn,) = (await debouncer.claim(10)).turns
    assert texts(turn) == ["a", "b"]


def digest(event_id: str) -> str:
    """The digest the debouncer keeps of ``event_id``."""
    return event_digest(event_id.encode())


async def test_a_buffered_event_is_held_until_its_turn_succeeds(debouncer, redis):
    """An event is held while waiting, failing or running, and forgotten once its turn succeeds."""
    held = debouncer.functions.held
    events = [digest("evt-1"), digest("evt-2"), digest("evt-3")]
    await debouncer.record("c1", webhook(5, "evt-1", "hi"))
    await debouncer.record("c1", webhook(6, "evt-2", "open?"))
    assert await held(events, 1_000) == [True, True, False]
    (turn,) = (await debouncer.claim(10)).turns
    assert await debouncer.finish(turn, ok=False, retry_in_ms=0) == "scheduled"
    (retry,) = (await debouncer.claim(10)).turns
    await debouncer.record("c1", webhook(7, "evt-3", "sunday"))  # arrives during the turn
    assert await held(events, 1_000) == [True, True, True]
    assert await debouncer.finish(retry, ok=True) == "scheduled"
    assert await held(events, 1_000) == [False, False, True]
    index = debounce_keys.event_key(PREFIX, debouncer.lane, digest("evt-1"))
    assert await redis.exists(index) == 0


async def test_every_buffered_event_is_held_and_its_copy_dropped_past_the_last_64(debouncer):
    """Of a conversation with 70 events buffered, each is held and a copy of each is dropped."""
    ids = [f"evt-{n}" for n in range(70)]
    for offset, event_id in enumerate(ids):
        assert await debouncer.record("c1", webhook(offset, event_id, event_id)) != -1
    assert await debouncer.functions.held([digest(e) for e in ids], 1_000) == [True] * 70
    for offset, event_id in enumerate(ids, start=100):
        assert await debouncer.record("c1", webhook(offset, event_id, event_id, 1)) == -1
    assert debouncer.stats.repeated == 70
    assert await debouncer.functions.held([digest(e) for e in ids], 1_000) == [True] * 70


async def test_an_index_written_by_an_earlier_release_still_finds_its_event(debouncer, redis):
    """An e:EVENT key holding the conversation key alone (an earlier release's) is still read."""
    await debouncer.record("c1", webhook(5, "evt-1", "hi"))
    index = debounce_keys.event_key(PREFIX, debouncer.lane, digest("evt-1"))
    await redis.set(index, "c1", px=60_000)
    assert await debouncer.functions.held([digest("evt-1")], 1_000) == [True]
    assert await debouncer.record("c1", webhook(9, "evt-1", "hi", replays=1)) == -1
