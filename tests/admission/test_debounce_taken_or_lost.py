"""A renewal says ``taken`` only to a token a claim displaced, never to a turn whose state went.

Redis restarted empty while a turn ran: the turn's messages are in no buffer and their offsets
are committed, so its handler is their only copy. A new message of the conversation is then
buffered and claimed as a new turn (by any runner, this one included). The old turn's renewal
found that turn's token in the state and answered ``taken``, and the runner cancelled a handler
whose turn nobody had taken over: its messages were lost. A claim that takes over a lapsed
lease now records the token it displaced, and only that token is told ``taken``, whether the
new holder still runs the turn or has finished it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from admission.turn_leases import BOUND_S, PREFIX, debouncer_of, drop_lane, lapse, message
from redis.asyncio import Redis

from pipeline.admission.debounce import Debouncer, Renewal, Turn, TurnRunner
from pipeline.admission.debounce import keys as debounce_keys

pytestmark = pytest.mark.redis


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane no other test uses; its keys are deleted after the test."""
    name = f"debtaken_{unique}"
    yield name
    await drop_lane(redis, name)


async def lose_state(redis: Redis, lane: str) -> None:
    """What a Redis restarted without persistence leaves of conversation c1: nothing."""
    await redis.delete(*debounce_keys.conversation_keys(PREFIX, lane, "c1"))
    await redis.zrem(debounce_keys.due_key(PREFIX, lane), "c1")


async def claim_one(debouncer: Debouncer) -> Turn:
    """The one turn ``debouncer`` claims now (c1's, due at once or lapsed)."""
    turns = (await debouncer.claim(1)).turns
    assert len(turns) == 1
    return turns[0]


class Held:
    """A handler whose runs wait to be let go, noting each turn's token and how its run ended."""

    def __init__(self) -> None:
        """Nothing started yet."""
        self.ends: dict[bytes, asyncio.Future[str]] = {}
        self.tokens: dict[bytes, str] = {}
        self.started: asyncio.Queue[bytes] = asyncio.Queue()
        self.let_go = asyncio.Event()

    async def __call__(self, turn: Turn) -> bool:
        """Wait to be let go; note whether the run ended or was cancelled."""
        first = turn.messages[0].value
        ended = self.ends.setdefault(first, asyncio.get_running_loop().create_future())
        self.tokens[first] = turn.token
        self.started.put_nowait(first)
        try:
            await self.let_go.wait()
        except asyncio.CancelledError:
            ended.set_result("cancelled")
            raise
        ended.set_result("ended")
        return True


async def test_a_turn_whose_state_went_runs_on_beside_the_next_turn_claimed(
    redis: Redis, lane: str
) -> None:
    """The runner claims a new message of the conversation; the old turn's handler is not cut."""
    held = Held()
    debouncer = debouncer_of(redis, lane)
    renewals: asyncio.Queue[tuple[str, bool, Renewal]] = asyncio.Queue()
    later_started = asyncio.Event()
    renew = debouncer.renew

    async def noting(turn: Turn) -> Renewal:
        after = later_started.is_set()  # the new turn was claimed before this call
        result = await renew(turn)
        renewals.put_nowait((turn.token, after, result))
        return result

    debouncer.renew = noting  # type: ignore[method-assign]
    runner = TurnRunner(debouncer, held)
    stop = asyncio.Event()
    running = asyncio.create_task(runner.run(stop))
    try:
        await debouncer.record("c1", message(0, "hi"))
        assert await asyncio.wait_for(held.started.get(), BOUND_S) == b"hi"
        await lose_state(redis, lane)
        await debouncer.record("c1", message(1, "later"))
        assert await asyncio.wait_for(held.started.get(), BOUND_S) == b"later"
        later_started.set()
        while True:
            token, after, result = await asyncio.wait_for(renewals.get(), BOUND_S)
            if token == held.tokens[b"hi"] and after:
                break
        assert result == "lost"  # was "taken": the handler of 'hi' was cancelled
        assert not held.ends[b"hi"].done()
        held.let_go.set()
        assert await asyncio.wait_for(asyncio.shield(held.ends[b"hi"]), BOUND_S) == "ended"
        assert await asyncio.wait_for(asyncio.shield(held.ends[b"later"]), BOUND_S) == "ended"
    finally:
        held.let_go.set()
        stop.set()
        await asyncio.wait_for(running, BOUND_S)
    assert debouncer.stats.lost_leases >= 1  # the finish of 'hi' found the lease not its own
    assert await redis.llen(debounce_keys.buffer_key(PREFIX, lane, "c1")) == 0


async def test_a_renewal_after_the_state_went_and_a_new_turn_was_claimed_is_lost(
    redis: Redis, lane: str
) -> None:
    """Another member claims the new turn: the old token was displaced by no claim."""
    first, second = debouncer_of(redis, lane), debouncer_of(redis, lane)
    await first.record("c1", message(0, "hi"))
    await redis.zadd(debounce_keys.due_key(PREFIX, lane), {"c1": 0})  # due now
    old = await claim_one(first)
    await lose_state(redis, lane)
    assert await first.renew(old) == "lost"
    await second.record("c1", message(1, "later"))
    await redis.zadd(debounce_keys.due_key(PREFIX, lane), {"c1": 0})
    new = await claim_one(second)
    assert [m.value for m in new.messages] == [b"later"]
    assert await first.renew(old) == "lost"
    assert await second.renew(new) == "renewed"
    assert await first.finish(old, ok=True) == "lost"
    assert await second.finish(new, ok=True) == "done"


async def test_a_displaced_token_is_told_taken_while_and_after_its_new_holder_runs(
    redis: Redis, lane: str
) -> None:
    """Every token a claim displaced hears ``taken``, the new holder running, failed or done."""
    first, second, third = (debouncer_of(redis, lane) for _ in range(3))
    await first.record("c1", message(0, "hi"))
    await redis.zadd(debounce_keys.due_key(PREFIX, lane), {"c1": 0})
    a = await claim_one(first)
    await lapse(redis, lane)
    b = await claim_one(second)
    assert await first.renew(a) == "taken"
    await lapse(redis, lane)
    c = await claim_one(third)
    assert c.attempt == 3
    assert await first.renew(a) == "taken"
    assert await second.renew(b) == "taken"
    assert await third.renew(c) == "renewed"
    assert await third.finish(c, ok=False, retry_in_ms=0) == "scheduled"
    assert await first.renew(a) == "taken"  # no holder now: its messages wait in the buffer
    d = await claim_one(third)
    assert await third.finish(d, ok=True) == "done"
    assert await first.renew(a) == "taken"  # run by another: not to run on beside the next
    assert await second.renew(b) == "taken"
    assert await first.finish(a, ok=True) == "lost"
    assert await redis.llen(debounce_keys.buffer_key(PREFIX, lane, "c1")) == 0
