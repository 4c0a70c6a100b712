"""A buffered event's locator (``{P:deb:LANE}:e:EVENT``) lives exactly as long as its event waits.

The ingress's sweeper finds a buffered webhook by its locator; a locator that lapsed while its
event still waited (members and ingress down overnight, a turn failing for hours) had the
sweeper replay the row, and the copy ran twice in the turn unless it was among the
conversation's last 64 messages. Time is moved on in Redis instead of waited for: every key
of the lane whose expiry falls within the outage is removed, as Redis would by then, the
others' expiries are shortened by it, and the due times are moved earlier by it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from support import pass_expiries

from pipeline import headers as h
from pipeline.admission.debounce import Debouncer, Turn
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.codec import event_digest
from pipeline.admission.debounce.debouncer import Ending
from pipeline.envelope import Message
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"
OUTAGE_MS = 12 * 3_600_000  # members and ingress down overnight
EVENTS = 70  # more than the 64 a conversation's state remembers


async def outage(redis: Redis, lane: str, duration_ms: int) -> None:
    """Move the lane's keys ``duration_ms`` on: each whose expiry falls within it is gone."""
    due = debounce_keys.due_key(PREFIX, lane)
    for member, score in await redis.zrange(due, 0, -1, withscores=True):
        await redis.zadd(due, {member: score - duration_ms})
    await pass_expiries(redis, f"{debounce_keys.lane_tag(PREFIX, lane)}*", duration_ms)


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane no other test uses; its keys are deleted after the test."""
    name = f"debloc_{unique}"
    yield name
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, name)}*"):
        await redis.delete(key)


def debouncer_of(redis: Redis, lane: str, max_batch: int = 100) -> Debouncer:
    """A debouncer whose turns wait a minute (or until ``max_batch`` messages wait)."""
    policy = DebouncePolicy(
        key="conversation_id", quiet_s=60.0, max_wait_s=120.0, max_batch=max_batch
    )
    return Debouncer(redis, PREFIX, lane, policy)


def webhook(offset: int, event_id: str, replays: int = 0) -> Message:
    """An ingress event at ``offset`` carrying ``event_id`` (a replay has a new offset)."""
    headers = {h.EVENT_ID: event_id.encode(), h.REPLAY_COUNT: str(replays).encode()}
    return Message("hooks", 0, offset, b"c1", event_id.encode(), headers, 1_000 + offset)


def texts(turn: Turn) -> list[str]:
    """The message values of a turn, in order."""
    return [m.value.decode() for m in turn.messages]


def digest(event_id: str) -> str:
    """The digest the debouncer keeps of ``event_id``."""
    return event_digest(event_id.encode())


async def locators(redis: Redis, lane: str) -> list[bytes]:
    """The names of the lane's event locators and of its conversations' lists of them."""
    tag = debounce_keys.lane_tag(PREFIX, lane)
    found = [k async for k in redis.scan_iter(match=f"{tag}:e:*")]
    return found + [k async for k in redis.scan_iter(match=f"{tag}:l:*")]


async def buffer_events(debouncer: Debouncer, count: int = EVENTS) -> list[str]:
    """Record ``count`` events of conversation c1; their ids, oldest first."""
    ids = [f"evt-{n}" for n in range(count)]
    for offset, event_id in enumerate(ids):
        assert await debouncer.record("c1", webhook(offset, event_id)) > 0
    return ids


async def test_an_event_waiting_through_an_outage_is_still_held_and_its_copy_dropped(
    redis: Redis, lane: str
) -> None:
    """After a night with no sweep, the oldest of 70 buffered events is held; its copy dropped."""
    debouncer = debouncer_of(redis, lane)
    ids = await buffer_events(debouncer)
    await outage(redis, lane, OUTAGE_MS)
    held = await debouncer.functions.held([digest(e) for e in ids], 1_000)
    copy = await debouncer.record("c1", webhook(500, ids[0], replays=1))  # the sweeper's replay
    await outage(redis, lane, 120_000)  # past the window of the newest message: due
    (turn,) = (await debouncer.claim(10)).turns
    assert (held, copy, texts(turn)) == ([True] * EVENTS, -1, ids)


async def test_a_failing_turn_keeps_its_events_held_through_an_outage(
    redis: Redis, lane: str
) -> None:
    """Events of a turn failing and retrying all night are still held, copies still dropped."""
    debouncer = debouncer_of(redis, lane, max_batch=EVENTS)
    ids = await buffer_events(debouncer)
    (turn,) = (await debouncer.claim(10)).turns
    assert await debouncer.finish(turn, ok=False, retry_in_ms=0) == "scheduled"
    await outage(redis, lane, OUTAGE_MS)
    assert await debouncer.functions.held([digest(e) for e in ids], 1_000) == [True] * EVENTS
    assert await debouncer.record("c1", webhook(500, ids[3], replays=1)) == -1
    (retry,) = (await debouncer.claim(10)).turns
    assert texts(retry) == ids


async def test_a_finished_turn_leaves_no_locator_of_its_events(redis: Redis, lane: str) -> None:
    """A turn of 70 events that succeeds (finish) deletes every locator, the 64 last and older."""
    debouncer = debouncer_of(redis, lane)
    ids = await buffer_events(debouncer)
    await outage(redis, lane, 120_000)
    (turn,) = (await debouncer.claim(10)).turns
    assert len(await locators(redis, lane)) > EVENTS  # one per event and the conversation's list
    assert await debouncer.finish(turn, ok=True) == "done"
    assert await locators(redis, lane) == []
    assert await debouncer.functions.held([digest(e) for e in ids], 1_000) == [False] * EVENTS


async def test_a_turn_finished_in_a_step_leaves_no_locator_of_its_events(
    redis: Redis, lane: str
) -> None:
    """The runner's path (db_step) deletes them too."""
    debouncer = debouncer_of(redis, lane)
    await buffer_events(debouncer)
    await outage(redis, lane, 120_000)
    (turn,) = (await debouncer.step(10)).turns
    step = await debouncer.step(0, [Ending(turn.key, turn.token, ok=True, retry_in_ms=0)])
    assert step.outcomes == ("done",)
    assert await locators(redis, lane) == []


async def test_a_partial_turn_deletes_the_locators_of_its_events_only(
    redis: Redis, lane: str
) -> None:
    """Of 70 buffered events, a turn of the first 2 deletes their locators; the rest stay held."""
    debouncer = debouncer_of(redis, lane, max_batch=2)
    ids = await buffer_events(debouncer)
    (turn,) = (await debouncer.claim(10)).turns
    assert texts(turn) == ids[:2]
    assert await debouncer.finish(turn, ok=True) == "scheduled"
    held = await debouncer.functions.held([digest(e) for e in ids], 1_000)
    assert held == [False] * 2 + [True] * (EVENTS - 2)
    tag = debounce_keys.lane_tag(PREFIX, lane)
    assert len([k async for k in redis.scan_iter(match=f"{tag}:e:*")]) == EVENTS - 2
    assert await debouncer.record("c1", webhook(500, ids[0], replays=1)) > 0  # its turn ended
    assert await debouncer.record("c1", webhook(501, ids[5], replays=1)) == -1  # still waiting


async def test_locators_an_earlier_releases_finish_left_are_deleted_by_the_next_finish(
    redis: Redis, lane: str
) -> None:
    """A finish of an earlier release (it trims the buffer, not the list of locators) leaks none.

    The next finish deletes the locators of the events that left before it, but not the
    locator of a copy of one of them buffered since.
    """
    debouncer = debouncer_of(redis, lane, max_batch=EVENTS)
    ids = await buffer_events(debouncer)
    buffer = debounce_keys.buffer_key(PREFIX, lane, "c1")
    await redis.ltrim(buffer, EVENTS - 1, -1)  # an earlier release's finish of 69: LTRIM alone
    assert await debouncer.record("c1", webhook(500, ids[0], replays=1)) > 0  # a later copy
    await outage(redis, lane, 120_000)
    (turn,) = (await debouncer.claim(10)).turns
    assert texts(turn) == [ids[-1], ids[0]]
    assert await debouncer.record("c1", webhook(501, ids[-1], replays=2)) == -1  # both held
    assert await debouncer.finish(turn, ok=True) == "done"
    assert await locators(redis, lane) == []


async def test_a_locator_lasts_the_safety_bound_at_most(redis: Redis, lane: str) -> None:
    """Against leaks (an earlier release's finish), a locator expires past ``held_ttl_ms``."""
    policy = DebouncePolicy(key="conversation_id", quiet_s=60.0, max_wait_s=120.0, max_batch=10)
    debouncer = Debouncer(redis, PREFIX, lane, policy, held_ttl_ms=86_400_000)
    await debouncer.record("c1", webhook(1, "evt-1"))
    index = debounce_keys.event_key(PREFIX, lane, digest("evt-1"))
    assert OUTAGE_MS < await redis.pttl(index) <= 120_000 + 86_400_000
    await outage(redis, lane, 120_000 + 86_400_000)
    assert await redis.exists(index) == 0
