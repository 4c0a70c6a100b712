"""A runner whose turn's lease lapsed while it was stalled (not dead) stops that turn.

A member paused past its lease (a stop-the-world pause, a frozen VM, SIGSTOP) has its turn
claimed again by another member, which runs the same messages, and then the conversation's
next turn. The paused member, once it runs again, went on with its handler to the end: the
same turn twice at once, or a turn running beside its conversation's next one, out of order.
Its next renewal now finds another holder and cancels the handler. A renewal that finds no
holder at all (the state lost with Redis's data) lets it run on: its messages may be nowhere
else. The pause is the lease's expiry moved into the past in Redis, not waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from admission.turn_leases import BOUND_S, PREFIX, debouncer_of, drop_lane, lapse, message
from redis.asyncio import Redis

from pipeline.admission.debounce import Renewal, Turn, TurnRunner
from pipeline.admission.debounce import keys as debounce_keys

pytestmark = pytest.mark.redis


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane no other test uses; its keys are deleted after the test."""
    name = f"debstall_{unique}"
    yield name
    await drop_lane(redis, name)


class Stalled:
    """A handler that starts and waits to be let go, noting how its run ended."""

    def __init__(self) -> None:
        """Nothing started yet."""
        self.started = asyncio.Event()
        self.let_go = asyncio.Event()
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def __call__(self, _turn: Turn) -> bool:
        """Wait to be let go; note whether the run ended or was cancelled."""
        self.started.set()
        try:
            await self.let_go.wait()
        except asyncio.CancelledError:
            self.note("cancelled")
            raise
        self.note("ended")
        return True

    def note(self, how: str) -> None:
        """Keep how the first run ended."""
        if not self.ended.done():
            self.ended.set_result(how)


async def test_a_stalled_runner_stops_the_turn_another_member_took_over(
    redis: Redis, lane: str
) -> None:
    """The lapsed holder's handler is cancelled at its next renewal; the new holder's run ends."""
    stalled = Stalled()
    runner = TurnRunner(debouncer_of(redis, lane), stalled)
    other = debouncer_of(redis, lane, lease_ms=120_000)  # its lease holds while it runs
    stop = asyncio.Event()
    running = asyncio.create_task(runner.run(stop))
    try:
        await other.record("c1", message(0, "hi"))
        await other.record("c1", message(1, "open?"))
        await asyncio.wait_for(stalled.started.wait(), BOUND_S)
        taken: list[Turn] = []
        while not taken:  # a renewal between the lapse and the claim extends the lease again
            await lapse(redis, lane)
            taken = list((await other.claim(1)).turns)
        assert taken[0].attempt == 2
        assert [m.value for m in taken[0].messages] == [b"hi", b"open?"]
        ended = await asyncio.wait_for(asyncio.shield(stalled.ended), BOUND_S)
        assert ended == "cancelled"
        assert await other.finish(taken[0], ok=True) == "done"
    finally:
        stalled.let_go.set()
        stop.set()
        await asyncio.wait_for(running, BOUND_S)
    assert await redis.llen(debounce_keys.buffer_key(PREFIX, lane, "c1")) == 0


async def test_a_runner_whose_turn_lost_its_state_runs_it_to_the_end(
    redis: Redis, lane: str
) -> None:
    """A renewal that finds no holder (the state gone with Redis's data) does not stop the turn."""
    stalled = Stalled()
    debouncer = debouncer_of(redis, lane)
    renewed: asyncio.Queue[bool] = asyncio.Queue()
    renew = debouncer.renew

    async def noting(turn: Turn) -> Renewal:
        result = await renew(turn)
        renewed.put_nowait(result == "renewed")
        return result

    debouncer.renew = noting  # type: ignore[method-assign]
    runner = TurnRunner(debouncer, stalled)
    stop = asyncio.Event()
    running = asyncio.create_task(runner.run(stop))
    try:
        await debouncer.record("c1", message(0, "hi"))
        await asyncio.wait_for(stalled.started.wait(), BOUND_S)
        await redis.delete(*debounce_keys.conversation_keys(PREFIX, lane, "c1"))
        await redis.zrem(debounce_keys.due_key(PREFIX, lane), "c1")
        while await asyncio.wait_for(renewed.get(), BOUND_S):
            pass  # renewed before the state went
        stalled.let_go.set()
        assert await asyncio.wait_for(asyncio.shield(stalled.ended), BOUND_S) == "ended"
    finally:
        stalled.let_go.set()
        stop.set()
        await asyncio.wait_for(running, BOUND_S)
