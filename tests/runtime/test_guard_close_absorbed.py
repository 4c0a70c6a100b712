"""The run guard's close ends though a release it took over lost its cancellation.

On Python 3.11 ``asyncio.wait_for`` returns the reply instead of raising when the cancellation
lands as the reply arrives; redis-py writes under it, so a handler calling Redis can go on.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from runtime.guard_parts import Handlers, guarded_lane, main_message, member_guard, retry_copy
from support import LosesFirstCancel

from pipeline.cancel_tasks import cancel_until_done
from pipeline.envelope import Message
from pipeline.runtime.app import Lane


class AbsorbingHandlers(Handlers):
    """Member ``b``'s handler of ``y`` waits for ever and loses the first cancellation.

    On Python 3.11 ``asyncio.wait_for`` (redis-py writes under it) returns the reply instead of
    raising when the cancellation lands as the reply arrives: a handler calling Redis then
    goes on.
    """

    def __init__(self) -> None:
        """No runs yet."""
        super().__init__()
        self.stall = LosesFirstCancel()

    def stage(self, member: str):  # type: ignore[no-untyped-def]
        """The recording stage, except for ``b``'s run of ``y``."""
        recording = super().stage(member)

        async def call(lane: Lane, message: Message) -> str | None:
            if member != "b" or message.value != b"y":
                return await recording(lane, message)
            await self.stall.run()
            return None  # unreachable: the stall ends only by its cancellation

        return call


async def test_close_ends_though_a_taken_over_release_lost_its_cancellation(
    redis: Redis, unique: str, prefix: str
) -> None:
    """close() cancels the releases it took over again until they end; it waited for ever."""
    lane = guarded_lane(f"guard_{unique}")
    handlers = AbsorbingHandlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    handlers.outcomes[b"x"] = ["retried"]  # X fails once: its key parks, Y is held behind it
    await a.run(lane, main_message(lane, 0, b"x"))
    await a.run(lane, main_message(lane, 1, b"y"))
    handlers.hold[b"y"] = asyncio.Event()
    dying = asyncio.create_task(a.run(lane, retry_copy(lane, 0, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"y", asyncio.Event()).wait(), 10)
    dying.cancel()  # member a is gone while running the released Y: nothing renews its lease
    with pytest.raises(asyncio.CancelledError):
        await dying

    async def take_over() -> None:
        while not handlers.stall.running.is_set():  # b reaps the release once a's lease lapses
            await b.tick({lane.name: lane})
            await asyncio.sleep(0.05)

    await asyncio.wait_for(take_over(), 20)
    closing = asyncio.create_task(b.close())
    try:
        await asyncio.wait([closing], timeout=10)  # not wait_for: the close swallowed its cancel
        assert closing.done(), "the guard's close still waits for the release it took over"
        assert handlers.stall.absorbed == 1
    finally:
        await cancel_until_done(closing)  # a close that hung (the defect) does not outlive it
        await a.close()
